package convert

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/internal/trtexec/trtexectest"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt"
)

const tinynet = "../testdata/tinynet.onnx"

// newDouble returns a trtexec.Tool that runs the test binary as the trtexec
// test double, and the file where the double records each argv it receives.
func newDouble(t *testing.T, d trtexectest.Double) (*trtexec.Tool, string) {
	t.Helper()
	exe, argv := d.Install(t)
	return &trtexec.Tool{Path: exe}, argv
}

func variants(t *testing.T, ids ...string) []manifest.Variant {
	t.Helper()
	var out []manifest.Variant
	for _, id := range ids {
		v, err := manifest.ParseVariant(id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// outcome is what a run did with a variant: "built", "cached" (reused
// unchanged) or, for a variant that was not built, its state.
func outcome(r Row) string {
	switch {
	case r.Reused:
		return "cached"
	case r.Status == manifest.StatusOK:
		return "built"
	}
	return string(r.Status)
}

// snapshot reads every file under dir.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
		return nil
	})
	return out
}

func TestRunONNXVariantsAndRerun(t *testing.T) {
	repo := t.TempDir()
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", FP16: fp16.Options{KeepIOTypes: true},
		Variants: variants(t, "onnx-fp32", "onnx-fp16-b8", "trt-fp16-b8")}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range res.Rows {
		got[r.Model] = outcome(r)
	}
	want := map[string]string{"tinynet_onnx_fp32": "built", "tinynet_onnx_fp16_b8": "built", "tinynet_trt_fp16_b8": "needs-gpu"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("Run status of %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if !res.Partial() {
		t.Error("Partial() = false with a TensorRT variant and no trtexec")
	}
	// Triton would accept the repository: lint finds no errors.
	probs, err := pbtxt.LintRepository(repo, pbtxt.LintOptions{})
	if err != nil || probs.HasErrors() {
		t.Errorf("LintRepository = %v, %v", probs, err)
	}
	if _, err := os.Stat(filepath.Join(repo, "tinynet_trt_fp16_b8")); !os.IsNotExist(err) {
		t.Errorf("a plan variant that was not built has a model directory (stat err %v)", err)
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	half := man.Model("tinynet_onnx_fp16_b8")
	if half == nil || len(half.Files) != 2 || half.Build == nil || half.Build.CacheKey == "" || len(half.Inputs) != 1 {
		t.Fatalf("manifest record for fp16 = %+v", half)
	}
	if rec := man.Model("tinynet_trt_fp16_b8"); rec == nil || rec.Status != "needs-gpu" {
		t.Errorf("manifest record for the plan = %+v, want status needs-gpu", rec)
	}
	pb, _ := os.ReadFile(filepath.Join(repo, "tinynet_onnx_fp16_b8", "config.pbtxt"))
	if !strings.Contains(string(pb), "max_batch_size: 8") || !strings.Contains(string(pb), "TYPE_FP32") {
		t.Errorf("fp16 config (keep-io-types, max batch 8):\n%s", pb)
	}

	before := snapshot(t, repo)
	res2, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res2.Rows {
		if r.Variant.Runtime == manifest.RuntimeONNX && (outcome(r) != "cached" || !strings.Contains(r.Detail, "using existing "+r.Variant.ID())) {
			t.Errorf("rerun of %s = %q %q, want cached, using existing", r.Model, outcome(r), r.Detail)
		}
	}
	after := snapshot(t, repo)
	if len(before) != len(after) {
		t.Errorf("rerun changed the file set: %d -> %d files", len(before), len(after))
	}
	for name, b := range before {
		if !bytes.Equal(b, after[name]) {
			t.Errorf("rerun changed %s", name)
		}
	}
	// --force rebuilds.
	cfg.Force = true
	res3, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if outcome(res3.Rows[0]) != "built" {
		t.Errorf("Run with Force = %q, want built", outcome(res3.Rows[0]))
	}
}

func TestRunPlansWithDouble(t *testing.T) {
	tx, argvFile := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
	repo := t.TempDir()
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", FP16: fp16.Options{KeepIOTypes: true},
		Variants: variants(t, "trt-fp32-b4", "trt-fp16-b8"), TRT: TRTConfig{WorkspaceBytes: 1024 << 20}}
	res, err := Run(context.Background(), cfg, WithBuilder(tx))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Rows {
		if outcome(r) != "built" {
			t.Fatalf("%s = %s %s", r.Model, outcome(r), r.Detail)
		}
	}
	plan := filepath.Join(repo, "tinynet_trt_fp16_b8", "1", "model.plan")
	if b, err := os.ReadFile(plan); err != nil || string(b) != trtexectest.PlanContent {
		t.Errorf("plan = %q, %v", b, err)
	}
	if _, err := os.Stat(plan + ".log"); err != nil {
		t.Errorf("the build log is not kept next to the plan: %v", err)
	}
	argv := trtexectest.RecordedArgv(t, argvFile)
	var build []string
	for _, a := range argv {
		if len(a) > 0 && a[0] != "--help" && strings.Contains(strings.Join(a, " "), "--fp16") {
			build = a
		}
	}
	joined := strings.Join(build, " ")
	for _, want := range []string{"--minShapes=images:1x3x32x32", "--maxShapes=images:8x3x32x32", "--memPoolSize=workspace:1024M", "--skipInference"} {
		if !strings.Contains(joined, want) {
			t.Errorf("fp16 build argv %q lacks %s", joined, want)
		}
	}
	pb, _ := os.ReadFile(filepath.Join(repo, "tinynet_trt_fp16_b8", "config.pbtxt"))
	if !strings.Contains(string(pb), `platform: "tensorrt_plan"`) {
		t.Errorf("plan config:\n%s", pb)
	}
	man, _ := manifest.Read(repo)
	rec := man.Model("tinynet_trt_fp16_b8")
	if rec == nil || rec.Build == nil || rec.Build.TensorRT != "10.16.1" || len(rec.Build.Command) == 0 {
		t.Errorf("plan provenance = %+v", rec.Build)
	}
	// The repository lints clean.
	if probs, err := pbtxt.LintRepository(repo, pbtxt.LintOptions{}); err != nil || probs.HasErrors() {
		t.Errorf("LintRepository = %v, %v", probs, err)
	}
}

func TestRunFailedBuildKeepsPreviousModel(t *testing.T) {
	repo := t.TempDir()
	good, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", Variants: variants(t, "trt-fp32-b4")}
	if _, err := Run(context.Background(), cfg, WithBuilder(good)); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, filepath.Join(repo, "tinynet_trt_fp32_b4"))
	bad, _ := newDouble(t, trtexectest.Double{Log: "trt8.2_result-FP16_FAILED.log"})
	cfg.Force = true
	res, err := Run(context.Background(), cfg, WithBuilder(bad))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed()) != 1 {
		t.Fatalf("Failed() = %v, want the one variant", res.Rows)
	}
	after := snapshot(t, filepath.Join(repo, "tinynet_trt_fp32_b4"))
	for name, b := range before {
		if !bytes.Equal(b, after[name]) {
			t.Errorf("a failed rebuild changed %s", name)
		}
	}
}

// A --target that the GPU does not match is refused before trtexec builds
// anything, and nothing is written for the variant.
func TestRunRefusesTargetMismatch(t *testing.T) {
	tx, argvFile := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
	repo := t.TempDir()
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test",
		TRT:      TRTConfig{Target: &trtexec.Target{ComputeCapability: "9.0"}},
		Variants: variants(t, "trt-fp32-b4")}
	res, err := Run(context.Background(), cfg, WithBuilder(tx),
		WithGPU(&trtexec.GPU{Name: "NVIDIA A10G", ComputeCapability: "8.6"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed()) != 1 || !strings.Contains(res.Rows[0].Detail, "compute capability") {
		t.Fatalf("Run with a mismatched target = %+v, want a failed variant naming the compute capability", res.Rows)
	}
	for _, argv := range trtexectest.RecordedArgv(t, argvFile) {
		if len(argv) > 0 && argv[0] != "--help" {
			t.Errorf("trtexec was asked to build despite the target mismatch: %v", argv)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, "tinynet_trt_fp32_b4")); !os.IsNotExist(err) {
		t.Errorf("a refused variant left a model directory (stat err %v)", err)
	}
}

// Models over the external-data threshold are laid out as Triton's ONNX
// Runtime backend expects: <version>/model.onnx/ holding model.onnx and its
// data file; the repository still lints and the model still loads.
func TestRunExternalDataLayout(t *testing.T) {
	repo := t.TempDir()
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", ExternalOver: 1, FP16: fp16.Options{KeepIOTypes: true},
		Variants: variants(t, "onnx-fp32", "onnx-fp16")}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Rows {
		if outcome(r) != "built" {
			t.Fatalf("%s = %s %s", r.Model, outcome(r), r.Detail)
		}
		dir := filepath.Join(repo, r.Model, "1", "model.onnx")
		for _, f := range []string{"model.onnx", "model.onnx.data"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("%s: %v", r.Model, err)
			}
		}
		if _, err := onnx.Load(filepath.Join(dir, "model.onnx")); err != nil {
			t.Errorf("loading %s with its external data: %v", r.Model, err)
		}
	}
	if probs, err := pbtxt.LintRepository(repo, pbtxt.LintOptions{}); err != nil || probs.HasErrors() {
		t.Errorf("LintRepository = %v, %v", probs, err)
	}
}

// Variants that do not fit are a *PlanError before anything is written.
func TestRunPlanError(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "repo")
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", Variants: variants(t, "onnx-fp32", "onnx-int8")}
	_, err := Run(context.Background(), cfg)
	var pe *PlanError
	if !errors.As(err, &pe) || !errors.Is(err, ErrNoCalibration) || !strings.Contains(err.Error(), "variant onnx-int8: int8 needs calibration") {
		t.Errorf("Run(onnx-int8 without calibration) = %v, want a *PlanError wrapping ErrNoCalibration", err)
	}
	if _, err := os.Stat(repo); !os.IsNotExist(err) {
		t.Errorf("a refused plan created the repository (stat err %v)", err)
	}
	if _, err := Run(context.Background(), Config{Source: tinynet, Repo: repo}); !errors.As(err, &pe) {
		t.Errorf("Run(no variants) = %v, want a *PlanError", err)
	}
	// A rerun is checked too, although what it reuses is not checked again.
	cfg.Variants = variants(t, "onnx-fp32")
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Variants = variants(t, "onnx-fp32", "onnx-int8")
	if _, err := Run(context.Background(), cfg); !errors.As(err, &pe) {
		t.Errorf("rerun with onnx-int8 without calibration = %v, want a *PlanError", err)
	}
}

// The int8 variants record the calibration they were made from, or random
// ranges for perf-only engines.
func TestRunInt8Calibration(t *testing.T) {
	tx, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
	rec := manifest.Calibration{Method: "entropy", Samples: 32, Dataset: manifest.DigestBytes([]byte("images")), Cosine: 0.999, Top1Agreement: 0.98}
	tests := []struct {
		name   string
		int8   Int8Config
		id     string
		status manifest.Status
		want   manifest.Calibration
	}{
		// tinynet stands in for the Q/DQ model: convert only copies it.
		{"onnx from the Q/DQ model", Int8Config{Calibration: &manifest.CalibrationOutput{QDQModel: tinynet, Calibration: rec}},
			"onnx-int8", manifest.StatusOK, rec},
		{"trt random ranges", Int8Config{RandomRanges: true}, "trt-int8-b4", manifest.StatusPerfOnly,
			manifest.Calibration{Method: "random", RandomRanges: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo := t.TempDir()
			cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", Int8: tt.int8, Variants: variants(t, tt.id)}
			res, err := Run(context.Background(), cfg, WithBuilder(tx))
			if err != nil {
				t.Fatal(err)
			}
			if r := res.Rows[0]; r.Status != tt.status {
				t.Fatalf("Run(%s) = %s %s, want %s", tt.id, r.Status, r.Detail, tt.status)
			}
			man, err := manifest.Read(repo)
			if err != nil {
				t.Fatal(err)
			}
			got := man.Model(res.Rows[0].Model)
			if got == nil || got.Calibration == nil || !reflect.DeepEqual(*got.Calibration, tt.want) {
				t.Errorf("calibration record of %s = %+v, want %+v", tt.id, got, tt.want)
			}
		})
	}
}

// The label file goes next to each config, and the timing cache is named
// after the source's digest, shared by every variant.
func TestRunLabelsAndTimingCache(t *testing.T) {
	tx, argvFile := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
	labels := filepath.Join(t.TempDir(), "classes.txt")
	if err := os.WriteFile(labels, []byte("cat\ndog\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	timing := filepath.Join(t.TempDir(), "timing")
	repo := t.TempDir()
	cfg := Config{Source: tinynet, Repo: repo, ToolVersion: "test", Labels: labels,
		TRT: TRTConfig{TimingCacheDir: timing}, Variants: variants(t, "onnx-fp32", "trt-fp32-b4")}
	res, err := Run(context.Background(), cfg, WithBuilder(tx))
	if err != nil || len(res.Failed()) != 0 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	for _, r := range res.Rows {
		pb, _ := os.ReadFile(filepath.Join(repo, r.Model, "config.pbtxt"))
		if !strings.Contains(string(pb), `label_filename: "classes.txt"`) {
			t.Errorf("%s config lacks the label file:\n%s", r.Model, pb)
		}
		if b, err := os.ReadFile(filepath.Join(repo, r.Model, "classes.txt")); err != nil || string(b) != "cat\ndog\n" {
			t.Errorf("%s label file = %q, %v", r.Model, b, err)
		}
	}
	d, _, err := manifest.DigestFile(tinynet)
	if err != nil {
		t.Fatal(err)
	}
	want := "--timingCacheFile=" + filepath.Join(timing, d.Hex()[:16]+".timing")
	found := false
	for _, argv := range trtexectest.RecordedArgv(t, argvFile) {
		found = found || strings.Contains(strings.Join(argv, " "), want)
	}
	if !found {
		t.Errorf("no build ran with %s", want)
	}
}

// Without a builder, plan variants are needs-gpu with the reason given.
func TestRunWithoutBuilder(t *testing.T) {
	cfg := Config{Source: tinynet, Repo: t.TempDir(), ToolVersion: "test", Variants: variants(t, "trt-fp32")}
	res, err := Run(context.Background(), cfg, WithoutBuilder("no GPU on this runner"))
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Rows[0]; r.Status != manifest.StatusNeedsGPU || r.Detail != "needs TensorRT (no GPU on this runner)" || !res.Partial() {
		t.Errorf("Run without a builder = %s %q, want needs-gpu naming the reason", r.Status, r.Detail)
	}
}
