package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
)

var tinynetPath = filepath.Join("..", "testdata", "tinynet.onnx")

func TestConvertPartialAndRerun(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no trtexec, even on a GPU machine
	repo := filepath.Join(t.TempDir(), "repo")
	args := []string{"convert", tinynetPath, "--repo", repo, "--precision", "fp32,fp16", "--runtime", "onnx,trt", "--max-batch", "8", "--progress", "none"}
	_, errOut, code := run(t, args...)
	if code != ExitPartial || !strings.Contains(errOut, "--skip-unavailable") {
		t.Fatalf("convert with TensorRT variants and no trtexec = exit %d (%s), want %d", code, errOut, ExitPartial)
	}
	out, errOut, code := run(t, append(args, "--skip-unavailable", "--format", "json")...)
	if code != 0 {
		t.Fatalf("convert --skip-unavailable = exit %d: %s", code, errOut)
	}
	var res struct {
		Variants []struct {
			Model, Status, Detail string
			Reused                bool
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--format json: %v\n%s", err, out)
	}
	status := map[string]string{}
	for _, v := range res.Variants {
		status[v.Model] = v.Status
		if v.Reused {
			status[v.Model] = "cached"
		}
	}
	want := map[string]string{"tinynet_onnx_fp32_b8": "cached", "tinynet_onnx_fp16_b8": "cached", "tinynet_trt_fp32_b8": "needs-gpu", "tinynet_trt_fp16_b8": "needs-gpu"}
	for k, v := range want {
		if status[k] != v {
			t.Errorf("rerun status of %s = %q, want %q", k, status[k], v)
		}
	}
	if _, _, code := run(t, "pbtxt", "lint", repo); code != 0 {
		t.Errorf("pbtxt lint of the converted repository = exit %d", code)
	}
	m, err := manifest.Read(repo)
	if err != nil || len(m.Models) != 4 {
		t.Fatalf("manifest = %v, %v", m, err)
	}
}

func TestConvertUsageErrors(t *testing.T) {
	repo := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"convert", tinynetPath}, "--repo is required"},
		{[]string{"convert", tinynetPath, "--repo", repo, "--precision", "fp8"}, "fp8"},
		{[]string{"convert", tinynetPath, "--repo", repo, "--precision", "int8"}, "int8 needs calibration"},
		{[]string{"convert", tinynetPath, "--repo", repo, "--variant", "trt-fp16-q9"}, "q9"},
		{[]string{"convert", tinynetPath, "--repo", repo, "--max-batch", "-2"}, "--max-batch"},
		{[]string{"convert", tinynetPath, "--repo", repo, "--compute-capability", "a100"}, "--compute-capability"},
		{[]string{"convert", tinynetPath, "--repo", repo, "--trt-version", "10"}, "--trt-version"},
	}
	for _, c := range cases {
		_, errOut, code := run(t, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("kiln %v = exit %d, %q; want exit 2 mentioning %q", c.args, code, errOut, c.want)
		}
	}
	// A model that cannot batch refuses max batch sizes.
	fixed := relCorpus(t, "models", "onnx-light", "light_squeezenet.onnx")
	if _, errOut, code := run(t, "convert", fixed, "--repo", repo, "--max-batch", "8"); code != ExitUsage || !strings.Contains(errOut, "cannot batch") {
		t.Errorf("convert fixed-batch model with --max-batch = exit %d, %q", code, errOut)
	}
}

func TestConvertPipelineFile(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "pipeline.yaml")
	os.WriteFile(pf, []byte("model: x.onnx\nvariants:\n  - onnx-fp32\n  - {runtime: onnx, precision: fp16, max_batch: 4}\n"), 0o644)
	repo := filepath.Join(dir, "repo")
	_, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "-f", pf, "--progress", "none")
	if code != 0 {
		t.Fatalf("convert -f = exit %d: %s", code, errOut)
	}
	for _, m := range []string{"tinynet_onnx_fp32", "tinynet_onnx_fp16_b4"} {
		if _, err := os.Stat(filepath.Join(repo, m, "config.pbtxt")); err != nil {
			t.Errorf("pipeline variant %s not built: %v", m, err)
		}
	}
	os.WriteFile(pf, []byte("variants:\n  - onnx-fp32\nvariantz: []\n"), 0o644)
	if _, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "-f", pf); code == 0 || !strings.Contains(errOut, "variantz") {
		t.Errorf("convert -f with an unknown key = exit %d, %q", code, errOut)
	}
}

// A pipeline file's model: and repository: are used, relative to the file,
// when no argument or flag gives them; a section or field kiln does not read
// is an error naming the file and line, not silently ignored.
func TestConvertPipelineStrict(t *testing.T) {
	dir := t.TempDir()
	model, err := os.ReadFile(tinynetPath)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "net.onnx"), model, 0o644)
	pf := filepath.Join(dir, "pipeline.yaml")
	os.WriteFile(pf, []byte("model: net.onnx\nrepository: models\nvariants:\n  - {runtime: onnx, precision: fp32, instances: 2}\n"), 0o644)
	if _, errOut, code := run(t, "convert", "-f", pf, "--progress", "none"); code != 0 {
		t.Fatalf("convert -f with model: and repository: = exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "models", "net_onnx_fp32_x2", "config.pbtxt")); err != nil {
		t.Errorf("convert -f did not build into the file's repository: %v", err)
	}
	for _, c := range []struct{ yaml, want string }{
		{"variants:\n  - onnx-fp32\ncalibrate:\n  data: images/\n", "pipeline.yaml:3: \"calibrate\" is not a setting kiln reads"},
		{"variants:\n  - onnx-fp32\n  - {runtime: onnx, precision: fp16, max_batchs: 4}\n", "pipeline.yaml:3: variants[1].\"max_batchs\" is not a setting kiln reads"},
		{"variants:\n  - onnx-fp32\n  - {runtime: onnx}\n", "pipeline.yaml:3: variants[1]: needs runtime and precision"},
		{"variants:\n  - onnx-fp33\n", "pipeline.yaml:2: variants[0]: variant \"onnx-fp33\""},
		{"model: a.onnx\nmodel: b.onnx\n", "pipeline.yaml:2: \"model\" is given twice"},
		{"variants: onnx-fp32\n", "pipeline.yaml:1: variants must be a list"},
		{"- onnx-fp32\n", "pipeline.yaml:1: a pipeline is a mapping"},
	} {
		os.WriteFile(pf, []byte(c.yaml), 0o644)
		_, errOut, code := run(t, "convert", tinynetPath, "--repo", filepath.Join(dir, "r"), "-f", pf, "--progress", "none")
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("convert -f with\n%s= exit %d, %q; want exit 2 with %q", c.yaml, code, errOut, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "r")); !os.IsNotExist(err) {
		t.Errorf("a refused pipeline file left a repository behind (%v)", err)
	}
}

// A --calib-dir that calibrate did not write is refused before anything is
// built, with advice on making one.
func TestConvertCalibDirNotCalibrated(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "repo")
	_, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "--precision", "int8", "--calib-dir", t.TempDir(), "--progress", "none")
	if code != ExitFailure || !strings.Contains(errOut, "is not a calibration output directory") || !strings.Contains(errOut, "hint: --calib-dir takes the -o directory of `kiln calibrate`") {
		t.Errorf("convert --calib-dir EMPTY = exit %d, %q; want exit 1 naming the directory, with a hint", code, errOut)
	}
	if _, err := os.Stat(repo); !os.IsNotExist(err) {
		t.Errorf("a refused --calib-dir left a repository behind (%v)", err)
	}
	_, errOut, code = run(t, "convert", tinynetPath, "--repo", repo, "--precision", "int8", "--progress", "none")
	if code != ExitUsage || !strings.Contains(errOut, "int8 needs calibration") || !strings.Contains(errOut, "hint: run `kiln calibrate") {
		t.Errorf("convert --precision int8 without calibration = exit %d, %q; want exit 2 with a hint", code, errOut)
	}
}

// --calib-data calibrates on the fly into the user cache directory, and a
// second run with the same inputs reuses that calibration and the variant.
func TestConvertCalibrateOnTheFly(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	npy := writeSamples(t, t.TempDir(), 16)
	repo := filepath.Join(t.TempDir(), "repo")
	args := []string{"convert", tinynetPath, "--repo", repo, "--precision", "int8", "--calib-data", npy, "--progress", "none"}
	out, errOut, code := run(t, args...)
	if code != 0 || !strings.Contains(errOut, "calibrated") || !strings.Contains(out, "built") {
		t.Fatalf("convert --calib-data = exit %d, stdout %q, stderr %q; want a calibration and a built int8 variant", code, out, errOut)
	}
	m, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	rec := m.Model("tinynet_onnx_int8")
	if rec == nil || rec.Calibration == nil || rec.Calibration.Method != "entropy" || rec.Calibration.Samples != 8 || rec.Calibration.Dataset.Validate() != nil {
		t.Fatalf("kiln.json record of the int8 variant = %+v, want entropy calibration on 8 samples with a dataset digest", rec)
	}
	out, errOut, code = run(t, args...)
	if code != 0 || !strings.Contains(errOut, "using existing calibration") || !strings.Contains(out, "using existing onnx-int8") {
		t.Errorf("second convert --calib-data = exit %d, stdout %q, stderr %q; want the calibration and the variant reused", code, out, errOut)
	}
}
