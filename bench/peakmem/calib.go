package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// calibOptions are the flags of the calibration modes.
type calibOptions struct {
	data       string // dataset directory
	samples    int    // samples drawn (0: all)
	validation int    // calibrate.Config.Validation
	budget     int64  // calibrate.Config.MemoryBudget
	threads    int    // ONNX Runtime intra-op threads
	noArena    bool   // plain inference without ONNX Runtime's CPU arena
	preprocess string // dataset.Spec.Preprocess of image datasets
}

// spec is the dataset the samples come from.
func (o calibOptions) spec() (dataset.Spec, error) {
	p, err := dataset.ParsePreprocess(o.preprocess)
	return dataset.Spec{Path: o.data, Preprocess: p}, err
}

// genLarge writes testmodels.LargeActivations(branches) to dir/model.onnx
// and samples random images of it as one .npy file each under dir/data.
func genLarge(dir string, branches, samples int) error {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return err
	}
	m := &onnx.Model{Proto: testmodels.LargeActivations(branches, 7)}
	if err := m.Save(filepath.Join(dir, "model.onnx")); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	v := make([]float32, 3*testmodels.LargeSize*testmodels.LargeSize)
	for i := range samples {
		for j := range v {
			v[j] = rng.Float32()*2 - 1
		}
		t := &onnx.Tensor{Name: "image", Type: onnx.Float, Dims: []int64{3, testmodels.LargeSize, testmodels.LargeSize}, Data: v}
		if err := writeNpy(filepath.Join(dir, "data", fmt.Sprintf("s%03d.npy", i)), t); err != nil {
			return err
		}
	}
	return nil
}

func writeNpy(path string, t *onnx.Tensor) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := dataset.WriteNpy(f, t); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// initORT loads ONNX Runtime from $KILN_ORT_LIB.
func initORT() error {
	path, err := ort.FindLibrary("", os.Getenv("KILN_ORT_LIB"), ".")
	if err != nil {
		return err
	}
	return ort.Init(path)
}

// infer is plain inference: the model as it is, over the same samples and
// batches calibration draws (batch 1), outputs reused from run to run.
func infer(ctx context.Context, model string, o calibOptions) (any, error) {
	m, err := onnx.Load(model)
	if err != nil {
		return nil, err
	}
	spec, err := o.spec()
	if err != nil {
		return nil, err
	}
	spec.Inputs = m.Inputs()
	src, err := dataset.Open(ctx, spec, nil)
	if err != nil {
		return nil, err
	}
	sess, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: o.threads, NoCPUArena: o.noArena})
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	order := dataset.Select(o.samples, src.Len(), 0)
	var outs map[string]*onnx.Tensor
	for b, err := range dataset.Batches(ctx, src, order, dataset.BatchOptions{Size: 1, Inputs: m.Inputs()}) {
		if err != nil {
			return nil, err
		}
		if outs, err = sess.RunReuse(ctx, b.Tensors, nil, outs); err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// calib is kiln calibrate with batch 1 into a temporary directory.
func calib(ctx context.Context, model string, o calibOptions) (any, error) {
	dir, err := os.MkdirTemp("", "peakmem-calib")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec, err := o.spec()
	if err != nil {
		return nil, err
	}
	cfg := calibrate.Config{
		Model: model, Data: spec, Samples: o.samples, Batch: 1,
		Validation: o.validation, MemoryBudget: o.budget,
		Session: ort.SessionOptions{IntraOpThreads: o.threads},
	}
	return calibrate.Run(ctx, cfg, filepath.Join(dir, "out"))
}
