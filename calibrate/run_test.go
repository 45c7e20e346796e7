package calibrate

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// imagePre normalizes generated PNGs to roughly zero mean, as Classifier expects.
func imagePre(t testing.TB) dataset.Preprocess {
	p, err := dataset.ParsePreprocess("scale=1/255,mean=0.5,std=0.25")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunClassifierTop1 is the acceptance test of issue #4: a generated
// classifier with non-trivial weights, 200 calibration and 200 validation
// images, entropy ranges: int8 top-1 agreement with fp32 of at least 0.98.
func TestRunClassifierTop1(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	imgs := filepath.Join(dir, "images")
	writeImages(t, imgs, 400, 40, 36, 1)
	model := writeModel(t, dir, "classifier.onnx", testmodels.Classifier(1))
	out := filepath.Join(dir, "out")
	rep, err := Run(context.Background(), Config{
		Model: model, Method: Entropy, Data: dataset.Spec{Path: imgs, Preprocess: imagePre(t)},
		CalibShare: 200, Seed: 1, TRTCache: true, ORTTable: true,
	}, out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.CalibrationSamples != 200 || rep.ValidationSamples != 200 {
		t.Fatalf("Run() samples = %d calibration, %d validation, want 200, 200", rep.CalibrationSamples, rep.ValidationSamples)
	}
	for _, o := range rep.Accuracy.Outputs {
		t.Logf("%s: cosine %.6f top-1 %.4f top-5 %.4f max abs %.4g", o.Output, o.Cosine, o.Top1, o.Top5, o.MaxAbs)
		if !o.Classifier || o.Top1 < 0.98 || o.Cosine < 0.999 {
			t.Errorf("output %s: classifier %v, top-1 %.4f, cosine %.6f, want a classifier with top-1 >= 0.98 and cosine >= 0.999", o.Output, o.Classifier, o.Top1, o.Cosine)
		}
	}
	for _, w := range rep.Worst[:3] {
		t.Logf("worst: %s (%s, %s) %.1f dB", w.Tensor, w.Kind, w.Node, w.SQNR)
	}
	checkOutputs(t, out, rep)
}

// checkOutputs verifies every file of a run: they parse, agree with each
// other, and the Q/DQ model runs in ONNX Runtime. The TensorRT cache and
// ONNX Runtime table are checked where the run wrote them (scope all).
func checkOutputs(t *testing.T, out string, rep *Report) {
	t.Helper()
	r, err := ReadRanges(filepath.Join(out, RangesFile))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scope == ScopeQDQ {
		for _, f := range []string{CacheFile, ORTDir} {
			if _, err := os.Stat(filepath.Join(out, f)); !os.IsNotExist(err) {
				t.Errorf("scope qdq wrote %s (%v)", f, err)
			}
		}
		if len(r.Tensors) != rep.TensorRanges || len(r.Tensors) > len(rep.Quantization.Activations) {
			t.Errorf("scope qdq: %d ranges, report %d, for %d quantized activations", len(r.Tensors), rep.TensorRanges, len(rep.Quantization.Activations))
		}
		checkModelFiles(t, out, rep)
		return
	}
	c, err := ReadCacheFile(filepath.Join(out, CacheFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Scales) != len(r.Tensors) || c.Version != DefaultTRTVersion.Number() || len(r.Tensors) != rep.TensorRanges {
		t.Errorf("cache has %d scales (version %d), ranges %d tensors, report %d, want equal counts and version %d",
			len(c.Scales), c.Version, len(r.Tensors), rep.TensorRanges, DefaultTRTVersion.Number())
	}
	for _, tr := range r.Tensors {
		if s := c.Scales[tr.Tensor]; s != float32(tr.Scale) || !(s > 0) {
			t.Errorf("cache scale of %s = %v, want %v > 0", tr.Tensor, s, float32(tr.Scale))
		}
	}
	table, err := ReadORTTable(filepath.Join(out, ORTDir))
	if err != nil || len(table) != len(r.Tensors) {
		t.Errorf("ReadORTTable() = %d entries, %v, want %d", len(table), err, len(r.Tensors))
	}
	checkModelFiles(t, out, rep)
}

// checkModelFiles checks the files every run writes: the reports, the Q/DQ
// model (it loads in ONNX Runtime) and what ReadOutput makes of them.
func checkModelFiles(t *testing.T, out string, rep *Report) {
	t.Helper()
	for _, f := range []string{ReportJSON, ReportMD} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	s, err := ort.NewSession(filepath.Join(out, ModelFile), ort.SessionOptions{})
	if err != nil {
		t.Fatalf("the Q/DQ model does not load in ONNX Runtime: %v", err)
	}
	s.Close()
	checkReadOutput(t, out, rep)
}

func TestRunTinyNetNpy(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	npy := writeNpy(t, dir, "images", 64, []int64{3, 32, 32}, 2)
	out := filepath.Join(dir, "out")
	rep, err := Run(context.Background(), Config{
		Model: filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx"),
		Data:  dataset.Spec{Path: npy}, Method: Percentile, Batch: 8, TRTVersion: manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1},
		TRTCache: true,
	}, out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.CalibrationSamples != 32 || rep.ValidationSamples != 32 || rep.Batch != 8 {
		t.Errorf("Run() = %d/%d samples, batch %d, want 32/32, batch 8", rep.CalibrationSamples, rep.ValidationSamples, rep.Batch)
	}
	c, err := ReadCacheFile(filepath.Join(out, CacheFile))
	if err != nil || c.Version != 8601 {
		t.Errorf("cache version = %d, %v, want 8601", c.Version, err)
	}
	if o := rep.Accuracy.Outputs[0]; !o.Classifier || o.Cosine < 0.99 {
		t.Errorf("TinyNet probs: classifier %v cosine %.6f, want a classifier with cosine >= 0.99", o.Classifier, o.Cosine)
	}
	checkReadOutput(t, out, rep)
	// A second run replaces the first one's directory.
	rep, err = Run(context.Background(), Config{Model: filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx"), Data: dataset.Spec{Path: npy}, Validation: -1}, out)
	if err != nil {
		t.Fatalf("re-running into %s: %v", out, err)
	}
	checkReadOutput(t, out, rep) // without validation: no accuracy
}

func TestRunExclude(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	imgs := filepath.Join(dir, "images")
	writeImages(t, imgs, 64, 32, 32, 3)
	model := writeModel(t, dir, "classifier.onnx", testmodels.Classifier(1))
	rep, err := Run(context.Background(), Config{
		Model: model, Data: dataset.Spec{Path: imgs, Preprocess: imagePre(t)}, Exclude: []string{"Conv_8", "Gemm"},
	}, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Baseline == nil || len(rep.Quantization.Excluded) != 2 {
		t.Fatalf("Run(exclude) baseline %v, excluded %v, want a baseline and 2 excluded", rep.Baseline != nil, rep.Quantization.Excluded)
	}
	before, after := rep.Baseline.Outputs[0], rep.Accuracy.Outputs[0]
	t.Logf("logits cosine before %.6f after %.6f", before.Cosine, after.Cosine)
	if after.MeanAbs >= before.MeanAbs {
		t.Errorf("mean abs error with Conv_8 and Gemm in fp32 = %v, want below %v", after.MeanAbs, before.MeanAbs)
	}
	if !strings.Contains(string(rep.Markdown()), "cosine before") {
		t.Errorf("report.md has no before/after table")
	}
}

func TestRunCorpus(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	t.Run("squeezenet images", func(t *testing.T) {
		imgs := filepath.Join(dir, "images")
		writeImages(t, imgs, 6, 240, 260, 4)
		for _, j := range []string{"car.jpg", "gke_tutorial_00001.jpg"} {
			data, err := os.ReadFile(testutil.Corpus(t, "images", j))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(imgs, j), data, 0o644)
		}
		pre, _ := dataset.ParsePreprocess("imagenet")
		out := filepath.Join(dir, "squeezenet")
		rep, err := Run(context.Background(), Config{
			Model: testutil.Corpus(t, "models", "onnx-light", "light_squeezenet.onnx"),
			Data:  dataset.Spec{Path: imgs, Preprocess: pre}, Method: MinMax,
		}, out)
		if err != nil {
			t.Fatal(err)
		}
		q := rep.Quantization
		if q.Opset != 13 || len(q.Weights) != 0 || len(q.Layers) != 26 || len(q.Notes) != 26 {
			t.Errorf("squeezenet: opset %d, %d int8 weights, %d layers, %d notes, want 13, 0 (ConstantOfShape weights), 26, 26", q.Opset, len(q.Weights), len(q.Layers), len(q.Notes))
		}
		if o := rep.Accuracy.Outputs[0]; o.Top1 != 1 || o.Cosine < 0.9999 {
			t.Errorf("squeezenet: top-1 %v cosine %v, want 1 and >= 0.9999", o.Top1, o.Cosine)
		}
		checkOutputs(t, out, rep)
	})
	t.Run("torch_linear npz", func(t *testing.T) {
		out := filepath.Join(dir, "linear")
		rep, err := Run(context.Background(), Config{
			Model: testutil.Corpus(t, "models", "model-navigator", "torch_linear", "onnx", "model.onnx"),
			Data:  dataset.Spec{Path: testutil.Corpus(t, "models", "model-navigator", "torch_linear", "model_input"), Format: dataset.NumPy},
		}, out)
		if err != nil {
			t.Fatal(err)
		}
		q := rep.Quantization
		if len(q.Weights) != 1 || q.Weights[0].Axis != 0 || q.Weights[0].Channels != 7 {
			t.Errorf("torch_linear weights = %+v, want one per-channel weight on axis 0 (Gemm transB=1) with 7 channels", q.Weights)
		}
		if o := rep.Accuracy.Outputs[0]; o.Cosine < 0.999 {
			t.Errorf("torch_linear cosine = %v, want >= 0.999", o.Cosine)
		}
		t.Logf("torch_linear: %+v", rep.Accuracy.Outputs[0])
		checkOutputs(t, out, rep)
	})
}

// TestRunBadInput: every problem is an error naming the sample or tensor,
// and the output directory is left as it was (absent, or the previous run).
func TestRunBadInput(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	tiny := filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx")
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	npyOf := func(name string, dims []int64, data any) string {
		return saveNpy(t, filepath.Join(dir, name), "images", dims, data)
	}
	nan := make([]float32, 4*3*32*32)
	nan[2*3*32*32+5] = float32(math.NaN()) // sample 2 calibrates
	inf := make([]float32, 4*3*32*32)
	inf[3*3*32*32+7] = float32(math.Inf(1)) // sample 3 validates
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	imgs := filepath.Join(dir, "corrupt")
	writeImages(t, imgs, 3, 32, 32, 5)
	write("corrupt/img-001.png", []byte("\x89PNG\r\n\x1a\nnot really"))
	intModel := writeModel(t, dir, "int.onnx", intOnly().Proto)

	tests := []struct {
		name  string
		model string
		data  string
		want  []string
		is    error
	}{
		{"empty dataset", tiny, empty, []string{"no samples found", empty}, dataset.ErrNoSamples},
		{"wrong shape", tiny, npyOf("shape.npy", []int64{4, 3, 16, 16}, make([]float32, 4*3*16*16)), []string{"shape.npy#0", `"images"`, "[3,32,32]"}, nil},
		{"wrong dtype", tiny, npyOf("dtype.npy", []int64{4, 3, 32, 32}, make([]int32, 4*3*32*32)), []string{"dtype.npy#0", `"images"`, "int32"}, nil},
		{"corrupt image", tiny, imgs, []string{"img-001.png"}, nil},
		{"NaN in calibration", tiny, npyOf("nan.npy", []int64{4, 3, 32, 32}, nan), []string{"nan.npy#2", `tensor "images"`, "NaN"}, nil},
		{"Inf in validation", tiny, npyOf("inf.npy", []int64{4, 3, 32, 32}, inf), []string{"inf.npy#3", `tensor "`, "+Inf"}, nil},
		{"no float tensors", intModel, npyOf("int.npy", []int64{2, 4}, make([]int64, 8)), []string{"no float32 tensors"}, ErrNoFloatTensors},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+strings.ReplaceAll(tt.name, " ", "-"))
			_, err := Run(context.Background(), Config{Model: tt.model, Data: dataset.Spec{Path: tt.data}, CalibShare: 0.5, Batch: 2}, out)
			if err == nil {
				t.Fatalf("Run(%s) = nil error, want one", tt.name)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run(%s) error = %q, want it to contain %q", tt.name, err, w)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Run(%s) error = %v, want errors.Is %v", tt.name, err, tt.is)
			}
			if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("Run(%s) left %s behind: %v", tt.name, out, serr)
			}
			leftovers, _ := filepath.Glob(filepath.Join(dir, ".out-*"))
			if len(leftovers) > 0 {
				t.Errorf("Run(%s) left temporary files %v", tt.name, leftovers)
			}
		})
	}
	t.Run("previous output kept", func(t *testing.T) {
		out := filepath.Join(dir, "prev")
		write("prev/ranges.json", []byte("old"))
		if _, err := Run(context.Background(), Config{Model: tiny, Data: dataset.Spec{Path: empty}}, out); err == nil {
			t.Fatal("Run(empty) = nil error")
		}
		if b, err := os.ReadFile(filepath.Join(out, "ranges.json")); string(b) != "old" {
			t.Errorf("previous ranges.json = %q, %v, want it unchanged", b, err)
		}
	})
	t.Run("foreign directory refused", func(t *testing.T) {
		out := filepath.Join(dir, "foreign")
		write("foreign/notes.txt", []byte("mine"))
		_, err := Run(context.Background(), Config{Model: tiny, Data: dataset.Spec{Path: imgs}}, out)
		if err == nil || !strings.Contains(err.Error(), "refusing to replace") {
			t.Errorf("Run(into a foreign directory) = %v, want a refusal", err)
		}
	})
}

// intOnly is a model with only int64 tensors.
func intOnly() *onnx.Model {
	b := testmodels.NewBuilder("ints", 1)
	x := b.Input("x", onnx.Int64, "N", 4)
	b.Node("Identity", []string{x})
	b.Rename("y")
	b.Output("y", onnx.Int64, "N", 4)
	return &onnx.Model{Proto: b.Model(13, 7)}
}

// fixedBatch is a one-Conv model whose batch dimension is fixed at 4.
func fixedBatch() *onnxpb.ModelProto {
	b := testmodels.NewBuilder("fixed", 1)
	x := b.Input("x", onnx.Float, 4, 3, 8, 8)
	b.Node("Conv", []string{x, b.He("w", 27, 4, 3, 3, 3)}, testmodels.Ints("kernel_shape", 3, 3))
	b.Rename("y")
	b.Output("y", onnx.Float, 4, 4, 6, 6)
	return b.Model(13, 7)
}

// TestRunFixedBatch: a model that fixes its batch size runs full batches
// only. Samples past the last full batch are left out and counted in the
// report; too few samples for one batch, or a batch size the model does not
// take, is a clear error and writes nothing.
func TestRunFixedBatch(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	model := writeModel(t, dir, "fixed.onnx", fixedBatch())
	npy := func(sub string, n int) string {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		return writeNpy(t, filepath.Join(dir, sub), "x", n, []int64{3, 8, 8}, 1)
	}
	ten, three := npy("ten", 10), npy("three", 3)

	out := filepath.Join(dir, "out")
	rep, err := Run(context.Background(), Config{Model: model, Data: dataset.Spec{Path: ten}}, out)
	if err != nil {
		t.Fatal(err)
	}
	// 10 samples: 5 calibrate and 5 validate, 4 of each in full batches.
	if rep.Batch != 4 || rep.CalibrationSamples != 4 || rep.ValidationSamples != 4 || rep.UnusedSamples != 2 {
		t.Errorf("batch %d, %d calibration, %d validation, %d unused samples; want 4, 4, 4, 2",
			rep.Batch, rep.CalibrationSamples, rep.ValidationSamples, rep.UnusedSamples)
	}
	checkOutputs(t, out, rep)
	if md, err := os.ReadFile(filepath.Join(out, "report.md")); err != nil || !strings.Contains(string(md), "| unused samples | 2 ") {
		t.Errorf("report.md does not count the unused samples (%v)", err)
	}

	for _, tc := range []struct {
		name  string
		cfg   Config
		wants []string
	}{
		{"no full batch", Config{Model: model, Data: dataset.Spec{Path: three}, CalibShare: 3}, []string{"fixes its batch dimension at 4", "3 calibration samples"}},
		{"other batch size", Config{Model: model, Data: dataset.Spec{Path: ten}, Batch: 8}, []string{"batch 8", "fixes its batch dimension at 4"}},
	} {
		out := filepath.Join(dir, "out-"+strings.ReplaceAll(tc.name, " ", "-"))
		_, err := Run(context.Background(), tc.cfg, out)
		for _, w := range tc.wants {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: Run = %v, want an error with %q", tc.name, err, w)
			}
		}
		if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("%s: Run left %s behind", tc.name, out)
		}
	}
}
