package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
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
		"--trt-version", "8.6.1", "--progress", "plain", "--format", "json", "-o", out)
	if code != ExitOK {
		t.Fatalf("kiln calibrate = exit %d, stderr:\n%s", code, stderr)
	}
	var rep calibrate.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--format json is not a report: %v\n%s", err, stdout)
	}
	if rep.CalibrationSamples != 16 || rep.ValidationSamples != 8 || rep.TRTVersion != 8601 || rep.Accuracy == nil {
		t.Errorf("report = %d/%d samples, TensorRT %d, accuracy %v, want 16/8, 8601, set", rep.CalibrationSamples, rep.ValidationSamples, rep.TRTVersion, rep.Accuracy != nil)
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
	if code != ExitOK || !strings.Contains(stdout, "before --exclude") || !strings.Contains(stdout, "top-1") {
		t.Errorf("kiln calibrate --exclude = exit %d, stdout %q, want a before/after summary", code, stdout)
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
