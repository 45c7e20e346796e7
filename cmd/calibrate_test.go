package cmd

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// writeSamples writes n TinyNet inputs as one stacked .npy file.
func writeSamples(t *testing.T, dir string, n int) string {
	t.Helper()
	per := 3 * 32 * 32
	data := make([]float32, n*per)
	for i := range data {
		data[i] = float32((i*7919)%251)/125 - 1
	}
	tn, err := onnx.NewTensor("images", []int64{int64(n), 3, 32, 32}, data)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "samples.npy")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dataset.WriteNpy(f, tn); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCalibrateCommand(t *testing.T) {
	dir := t.TempDir()
	npy := writeSamples(t, dir, 24)
	out := filepath.Join(dir, "calib")
	model := filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx")
	stdout, stderr, code := run(t, "calibrate", model, "--data", npy, "--batch", "4", "--calib-fraction", "16",
		"--trt-version", "8.6.1", "--trt-cache", "--ort-table", "--progress", "plain", "--format", "json", "-o", out)
	if code != ExitOK {
		t.Fatalf("kiln calibrate = exit %d, stderr:\n%s", code, stderr)
	}
	var rep calibrate.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--format json is not a report: %v\n%s", err, stdout)
	}
	if rep.CalibrationSamples != 16 || rep.ValidationSamples != 8 || rep.TRTVersion != 8601 || rep.Accuracy == nil || rep.Scope != calibrate.ScopeAll {
		t.Errorf("report = %d/%d samples, TensorRT %d, accuracy %v, scope %q, want 16/8, 8601, set, all", rep.CalibrationSamples, rep.ValidationSamples, rep.TRTVersion, rep.Accuracy != nil, rep.Scope)
	}
	if !strings.Contains(stderr, "calibrate tinynet: finished, 16/16 samples") || !strings.Contains(stderr, "validate tinynet: finished, 8/8 samples") {
		t.Errorf("stderr progress = %q, want plain finish lines", stderr)
	}
	for _, f := range []string{"ranges.json", "calibration.cache", "model.int8.onnx", "report.json", "report.md", "ort/calibration.flatbuffers"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
	cache, _ := os.ReadFile(filepath.Join(out, "calibration.cache"))
	if !strings.HasPrefix(string(cache), "TRT-8601-EntropyCalibration2\n") {
		t.Errorf("calibration.cache header = %q", strings.SplitN(string(cache), "\n", 2)[0])
	}

	stdout, _, code = run(t, "calibrate", model, "--data", npy, "--exclude", "Gemm", "--progress", "none", "-o", out)
	if code != ExitOK || !strings.Contains(stdout, "before --exclude") || !strings.Contains(stdout, "top-1") || !strings.Contains(stdout, "(scope qdq)") {
		t.Errorf("kiln calibrate --exclude = exit %d, stdout %q, want a before/after summary of scope qdq", code, stdout)
	}
	for _, f := range []string{"calibration.cache", "ort"} {
		if _, err := os.Stat(filepath.Join(out, f)); !os.IsNotExist(err) {
			t.Errorf("kiln calibrate without --trt-cache/--ort-table wrote %s (%v)", f, err)
		}
	}

	stdout, _, code = run(t, "calibrate", model, "--data", npy, "--validation", "-1", "--progress", "none", "-o", out)
	if code != ExitOK || !strings.Contains(stdout, "on 24 samples") || strings.Contains(stdout, "validation samples") {
		t.Errorf("kiln calibrate --validation -1 = exit %d, stdout %q, want all 24 samples calibrated and no accuracy", code, stdout)
	}
}

func TestCalibrateErrors(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx")
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no data", []string{"calibrate", model, "-o", dir + "/x"}, ExitUsage, "--data is required"},
		{"no out", []string{"calibrate", model, "--data", empty}, ExitUsage, "-o/--output is required"},
		{"bad method", []string{"calibrate", model, "--data", empty, "--method", "kl", "-o", dir + "/x"}, ExitUsage, `unknown calibration method "kl"`},
		{"bad trt", []string{"calibrate", model, "--data", empty, "--trt-version", "ten", "-o", dir + "/x"}, ExitUsage, "--trt-version"},
		{"bad preprocess", []string{"calibrate", model, "--data", empty, "--preprocess", "crop=0", "-o", dir + "/x"}, ExitUsage, "crop"},
		{"empty data", []string{"calibrate", model, "--data", empty, "-o", dir + "/x"}, ExitFailure, "hint: point --data at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := run(t, tt.args...)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Errorf("kiln %v = exit %d, stderr %q, want exit %d and %q", tt.args, code, stderr, tt.code, tt.want)
			}
			if _, err := os.Stat(dir + "/x"); err == nil {
				t.Errorf("kiln %v wrote %s/x", tt.args, dir)
			}
		})
	}
}

// writeOutlier writes a model x [N,16] -> Gemm_1 -> Gemm_2 -> Gemm_3 ->
// logits whose Gemm_2 input has one channel 1000 times the others (and
// weighed down as much), so plain int8 misses any strict target and
// keeping Gemm_2 in fp32 meets it; and 48 samples for it.
func writeOutlier(t *testing.T, dir string) (model, npy string) {
	t.Helper()
	b := testmodels.NewBuilder("outlier", 5)
	x := b.Input("x", onnx.Float, "N", 16)
	w1, w2 := make([]float32, 16*32), make([]float32, 32*32)
	for i := range w1 {
		if w1[i] = float32((i*37)%17-8) / 20; i%32 == 0 {
			w1[i] *= 1000
		}
	}
	for i := range w2 {
		if w2[i] = float32((i*53)%19-9) / 25; i < 32 {
			w2[i] /= 1000
		}
	}
	h := b.Node("Gemm", []string{x, b.Init("w1", []int64{16, 32}, w1)})
	h = b.Node("Gemm", []string{h, b.Init("w2", []int64{32, 32}, w2)})
	b.Node("Gemm", []string{h, b.He("w3", 32, 32, 10)})
	b.Rename("logits")
	b.Output("logits", onnx.Float, "N", 10)
	model = filepath.Join(dir, "outlier.onnx")
	if err := (&onnx.Model{Proto: b.Model(13, 7)}).Save(model); err != nil {
		t.Fatal(err)
	}
	data := make([]float32, 48*16)
	for i := range data {
		data[i] = float32(math.Sin(float64(i)*0.37+float64(i/16)))*0.8 + 0.1
	}
	tn, err := onnx.NewTensor("x", []int64{48, 16}, data)
	if err != nil {
		t.Fatal(err)
	}
	npy = filepath.Join(dir, "x.npy")
	f, err := os.Create(npy)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dataset.WriteNpy(f, tn); err != nil {
		t.Fatal(err)
	}
	return model, npy
}

func TestCalibrateAccuracyTarget(t *testing.T) {
	dir := t.TempDir()
	model, npy := writeOutlier(t, dir)
	out := filepath.Join(dir, "calib")
	args := []string{"calibrate", model, "--data", npy, "--method", "minmax", "--batch", "8", "--progress", "none", "-o", out}

	stdout, stderr, code := run(t, append(args, "--accuracy-target", "cosine=0.995", "--accuracy-target", "logits:min_cosine=0.99")...)
	if code != ExitOK || !strings.Contains(stdout, "accuracy target cosine=0.995,logits:min_cosine=0.99:") ||
		!strings.Contains(stdout, "step 1 (1 in fp32: +Gemm_2)") || !strings.Contains(stdout, "met at step 1: 1 layers kept in fp32 (Gemm_2)") {
		t.Fatalf("kiln calibrate --accuracy-target = exit %d, stdout:\n%s\nstderr:\n%s\nwant it met by keeping Gemm_2", code, stdout, stderr)
	}
	rep, err := calibrate.ReadOutput(out)
	if err != nil || rep.Calibration.Cosine < 0.995 {
		t.Errorf("ReadOutput = %+v, %v, want the target's model (cosine >= 0.995)", rep.Calibration, err)
	}

	before, _ := os.ReadFile(filepath.Join(out, "report.json"))
	stdout, stderr, code = run(t, append(args, "--accuracy-target", "cosine=1", "--format", "json")...)
	var best calibrate.Report
	if code != ExitCheck || json.Unmarshal([]byte(stdout), &best) != nil || best.Target == nil || best.Target.Met ||
		!strings.Contains(stderr, "accuracy target cosine=1 not met") || !strings.Contains(stderr, "hint: loosen the target") {
		t.Fatalf("kiln calibrate --accuracy-target cosine=1 = exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d with the best reached", code, stdout, stderr, ExitCheck)
	}
	if after, _ := os.ReadFile(filepath.Join(out, "report.json")); string(after) != string(before) {
		t.Errorf("a target not met changed %s", out)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--accuracy-target", "accuracy=0.9"}, `invalid argument "accuracy=0.9" for "--accuracy-target" flag: accuracy target accuracy: unknown metric "accuracy"`},
		{[]string{"--accuracy-target", "cosine=0.9", "--accuracy-target", "cosine=0.8"}, "cosine is given twice"},
		{[]string{"--accuracy-target", "cosine=0.9", "--validation", "-1"}, "needs validation samples"},
	} {
		_, stderr, code := run(t, append(args, tt.args...)...)
		if code != ExitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("kiln calibrate %v = exit %d, stderr %q, want exit %d and %q", tt.args, code, stderr, ExitUsage, tt.want)
		}
	}
	_, stderr, code = run(t, "convert", model, "--repo", filepath.Join(dir, "repo"), "--precision", "int8", "--calib-dir", out, "--calib-accuracy-target", "cosine=0.9")
	if code != ExitUsage || !strings.Contains(stderr, "--calib-accuracy-target calibrates on the fly") {
		t.Errorf("kiln convert --calib-dir --calib-accuracy-target = exit %d, stderr %q, want a usage error", code, stderr)
	}
}

// A calibration that meets cosine=0.99 but has a sample below serve's
// worst_cosine bound says so; one within serve's bounds says nothing.
func TestServeInt8Misses(t *testing.T) {
	agree := 0.97
	a := &calibrate.Accuracy{Outputs: []calibrate.OutputAccuracy{
		{Output: "probs", Cosine: 0.995, MinCosine: 0.96, Classifier: true, Top1: 0.99, Top5: 1},
		{Output: "map", Cosine: 0.9907, MinCosine: 0.9383, Agreement: &agree},
	}}
	got, target := serveInt8Misses(a)
	if len(got) != 1 || got[0] != "map worst_cosine 0.9383 < 0.95" || target != "min_cosine=0.95" {
		t.Errorf("serveInt8Misses = %q, %q; want the map's worst cosine only", got, target)
	}
	a.Outputs[1].MinCosine, a.Outputs[0].Top1 = 0.951, 0.9
	if got, target := serveInt8Misses(a); len(got) != 1 || got[0] != "probs top1_agreement 0.9 < 0.98" || target != "top1=0.98" {
		t.Errorf("serveInt8Misses = %q, %q; want the classifier's top-1 only", got, target)
	}
	var buf strings.Builder
	if err := printCalibration(&buf, formatText, "out", &calibrate.Report{Accuracy: a}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "kiln serve's default int8 checks would refuse this model: probs top1_agreement 0.9 < 0.98; --accuracy-target top1=0.98 asks") {
		t.Errorf("calibrate's text output does not warn:\n%s", buf.String())
	}
}
