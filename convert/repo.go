package convert

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
	"github.com/kiln-ml/kiln/pbtxt"
)

// artifact is a built model file waiting to be placed in the repository.
type artifact struct {
	path     string
	file     string // the model file ONNX Runtime loads (path, or the model.onnx inside it)
	platform string
	build    *manifest.Build
	calib    *manifest.Calibration
	status   manifest.Status
	note     string
	extra    map[string]string // more files for the version directory
	checks   json.RawMessage   // the check record (ONNX variants)
}

func (b *builder) onnxArtifact(ctx context.Context, v manifest.Variant) (*artifact, error) {
	a := &artifact{platform: pbtxt.PlatformONNX, status: manifest.StatusOK, build: &manifest.Build{Tool: "kiln", ToolVersion: b.cfg.ToolVersion, Inputs: []manifest.Digest{b.src}}}
	switch v.Precision {
	case manifest.FP32:
		art, file, err := b.fp32Model()
		if err != nil {
			return nil, err
		}
		a.path, a.file = art, file
	case manifest.FP16:
		art, file, err := b.fp16Model(ctx)
		if err != nil {
			return nil, err
		}
		a.path, a.file = art, file
	case manifest.INT8:
		if b.precision == normalize.PrecisionINT8 {
			// The source is quantized already: its int8 variant is itself.
			art, file, err := b.fp32Model()
			if err != nil {
				return nil, err
			}
			a.path, a.file = art, file
			a.note = "the source is quantized already (" + b.why + ")"
			break
		}
		cal := b.cfg.Int8.Calibration
		if cal == nil || cal.QDQModel == "" {
			return nil, errors.New("the ONNX int8 variant is calibration's Q/DQ model, and there is none")
		}
		d, _, err := manifest.DigestFile(cal.QDQModel)
		if err != nil {
			return nil, err
		}
		a.path, a.file = cal.QDQModel, cal.QDQModel
		a.build.Inputs = append(a.build.Inputs, d)
		a.calib = b.calibration()
	}
	return a, nil
}

// calibration is what kiln.json records about an int8 variant's scales.
func (b *builder) calibration() *manifest.Calibration {
	if b.cfg.Int8.RandomRanges && !b.haveCalibration() {
		return &manifest.Calibration{Method: "random", RandomRanges: true}
	}
	var c manifest.Calibration
	if cal := b.cfg.Int8.Calibration; cal != nil {
		c = cal.Calibration
	}
	return &c
}

// saved is a model written for the variants: art is what goes into the
// version directory (a file, or a directory holding model.onnx and its
// external data), file is the .onnx file itself (what trtexec reads).
type saved struct{ art, file string }

// fp32Model writes the source model once for every variant that needs it.
func (b *builder) fp32Model() (art, file string, err error) {
	if b.fp32.file == "" {
		if b.fp32, err = b.save(b.model, "fp32"); err != nil {
			return "", "", err
		}
	}
	return b.fp32.art, b.fp32.file, nil
}

// fp16Model rewrites the source once and reuses the file for every variant.
func (b *builder) fp16Model(ctx context.Context) (art, file string, err error) {
	if b.fp16.file != "" {
		return b.fp16.art, b.fp16.file, nil
	}
	opts := b.cfg.FP16
	// The data-aware pass: the fp32 model run on the check's samples
	// keeps in fp32 every node whose values leave fp16's safe range.
	if ref, err := b.reference(ctx); err == nil && opts.OpBlockList == nil && len(opts.NodeBlockList) == 0 && b.fp16Analysis == nil {
		var samples []map[string]*onnx.Tensor
		for _, f := range ref.ref.Feeds {
			samples = append(samples, f.Tensors)
		}
		an, err := fp16.Analyze(ctx, b.model, samples, fp16.AnalyzeOptions{Session: b.cfg.Check.Session})
		if err != nil {
			return "", "", fmt.Errorf("analyzing the fp32 model's value ranges for fp16: %w", err)
		}
		for _, k := range an.Kept {
			b.log.Info("kept in fp32 for the fp16 variant", "node", k.Node, "op", k.Op, "reason", k.Reason)
		}
		b.fp16Analysis, b.fp16Kept = an, len(an.Kept)
	}
	opts.Analysis = b.fp16Analysis
	opts.NodeBlockList = append(append([]string{}, opts.NodeBlockList...), b.fp16Extra...)
	out, rep, err := fp16.Convert(b.model, opts)
	if err != nil {
		return "", "", err
	}
	if b.fp16Warned == nil {
		b.fp16Warned = map[string]bool{}
	}
	for _, w := range rep.Warnings {
		if !b.fp16Warned[w] {
			b.fp16Warned[w] = true
			b.log.Warn("fp16 rewrite: " + w)
		}
	}
	if b.fp16, err = b.save(out, "fp16"); err != nil {
		return "", "", err
	}
	return b.fp16.art, b.fp16.file, nil
}

// save writes a variant's model into the work directory. Models whose
// weights exceed ExternalOver (default 1 GiB; the protobuf limit is 2 GiB)
// are written as a directory holding model.onnx and model.onnx.data, the
// layout Triton's ONNX Runtime backend loads when model.onnx is a directory.
func (b *builder) save(m *onnx.Model, stem string) (saved, error) {
	limit := b.cfg.ExternalOver
	if limit == 0 {
		limit = 1 << 30
	}
	var total int64
	for _, p := range m.Params() {
		total += p.Bytes
	}
	if limit < 0 || total <= limit {
		p := filepath.Join(b.work, stem+".onnx")
		return saved{p, p}, m.Save(p)
	}
	dir := filepath.Join(b.work, stem)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return saved{}, err
	}
	p := filepath.Join(dir, "model.onnx")
	return saved{dir, p}, m.SaveWith(p, onnx.SaveOptions{ExternalData: "model.onnx.data"})
}

// write places the artifact and its config in the repository and returns its record.
func (b *builder) write(v manifest.Variant, model string, a *artifact) (*manifest.Model, error) {
	opts := b.template
	opts.Name = model
	opts.Platform = a.platform
	opts.MaxBatchSize = v.MaxBatch
	if v.Instances > 1 {
		opts.InstanceCount = v.Instances
	}
	cfg, err := pbtxt.Generate(b.sig, opts)
	if err != nil {
		return nil, err // pbtxt names the model and the field
	}
	if err := pbtxt.WriteModel(b.cfg.Repo, pbtxt.WriteSpec{Config: cfg, Version: 1, ModelPath: a.path, Labels: b.labels, VersionFiles: a.extra}); err != nil {
		return nil, err
	}
	rec := &manifest.Model{Name: model, Variant: v, Source: b.src, Version: 1, Build: a.build, Calibration: a.calib,
		Status: a.status, Note: a.note, Inputs: tensors(b.sig.Inputs), Outputs: tensors(b.sig.Outputs), Checks: a.checks}
	files, err := listFiles(filepath.Join(b.cfg.Repo, model))
	if err != nil {
		return nil, err
	}
	rec.Files = files
	return rec, nil
}

func tensors(ts []pbtxt.TensorSig) []manifest.Tensor {
	out := make([]manifest.Tensor, 0, len(ts))
	for _, t := range ts {
		out = append(out, manifest.Tensor{Name: t.Name, Type: t.DataType.String(), Shape: t.Shape})
	}
	return out
}

// listFiles returns every regular file under dir with its digest, sorted.
func listFiles(dir string) ([]manifest.File, error) {
	var files []manifest.File
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		dg, n, err := manifest.DigestFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files = append(files, manifest.File{Path: filepath.ToSlash(rel), Size: n, Digest: dg})
		return nil
	})
	return files, err
}

// verifyFiles checks that the files a record lists are still there and
// unchanged: digests for files under 16 MiB, sizes for larger ones (hashing
// big engines on every rerun would cost as much as copying them).
func verifyFiles(dir string, files []manifest.File) error {
	if len(files) == 0 {
		return errors.New("no files recorded")
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Size() != f.Size {
			return fmt.Errorf("%s changed size", f.Path)
		}
		if f.Size < 16<<20 {
			d, _, err := manifest.DigestFile(p)
			if err != nil {
				return err
			}
			if d != f.Digest {
				return fmt.Errorf("%s changed", f.Path)
			}
		}
	}
	return nil
}

func mainFile(rec *manifest.Model) (string, int64) {
	for _, f := range rec.Files {
		if filepath.Base(f.Path) == "model.onnx" || filepath.Base(f.Path) == "model.plan" {
			return rec.Name + "/" + f.Path, f.Size
		}
	}
	return "", 0
}
