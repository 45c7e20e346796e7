package convert

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt"
)

const tinynet = "../testdata/tinynet.onnx"

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
	opts := Options{Source: tinynet, Repo: repo, ToolVersion: "test", FP16: FP16Options{KeepIOTypes: true},
		Variants: variants(t, "onnx-fp32", "onnx-fp16-b8", "trt-fp16-b8")}
	res, err := Run(context.Background(), opts)
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
	fp16 := man.Model("tinynet_onnx_fp16_b8")
	if fp16 == nil || len(fp16.Files) != 2 || fp16.Build == nil || fp16.Build.CacheKey == "" || len(fp16.Inputs) != 1 {
		t.Fatalf("manifest record for fp16 = %+v", fp16)
	}
	if rec := man.Model("tinynet_trt_fp16_b8"); rec == nil || rec.Status != "needs-gpu" {
		t.Errorf("manifest record for the plan = %+v, want status needs-gpu", rec)
	}
	cfg, _ := os.ReadFile(filepath.Join(repo, "tinynet_onnx_fp16_b8", "config.pbtxt"))
	if !strings.Contains(string(cfg), "max_batch_size: 8") || !strings.Contains(string(cfg), "TYPE_FP32") {
		t.Errorf("fp16 config (keep-io-types, max batch 8):\n%s", cfg)
	}

	before := snapshot(t, repo)
	res2, err := Run(context.Background(), opts)
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
	opts.Force = true
	res3, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if outcome(res3.Rows[0]) != "built" {
		t.Errorf("Run with Force = %q, want built", outcome(res3.Rows[0]))
	}
}

func TestRunPlansWithDouble(t *testing.T) {
	tx, argvFile := newDouble(t, doubleSetup{log: "trt10.16_result-01.log"})
	repo := t.TempDir()
	opts := Options{Source: tinynet, Repo: repo, ToolVersion: "test", Builder: tx, FP16: FP16Options{KeepIOTypes: true},
		Variants: variants(t, "trt-fp32-b4", "trt-fp16-b8"), TRT: TRTOptions{WorkspaceMiB: 1024}}
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Rows {
		if outcome(r) != "built" {
			t.Fatalf("%s = %s %s", r.Model, outcome(r), r.Detail)
		}
	}
	plan := filepath.Join(repo, "tinynet_trt_fp16_b8", "1", "model.plan")
	if b, err := os.ReadFile(plan); err != nil || string(b) != doublePlanContent {
		t.Errorf("plan = %q, %v", b, err)
	}
	if _, err := os.Stat(plan + ".log"); err != nil {
		t.Errorf("the build log is not kept next to the plan: %v", err)
	}
	argv := recordedArgv(t, argvFile)
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
	cfg, _ := os.ReadFile(filepath.Join(repo, "tinynet_trt_fp16_b8", "config.pbtxt"))
	if !strings.Contains(string(cfg), `platform: "tensorrt_plan"`) {
		t.Errorf("plan config:\n%s", cfg)
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
	good, _ := newDouble(t, doubleSetup{log: "trt10.16_result-01.log"})
	opts := Options{Source: tinynet, Repo: repo, ToolVersion: "test", Builder: good, Variants: variants(t, "trt-fp32-b4")}
	if _, err := Run(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, filepath.Join(repo, "tinynet_trt_fp32_b4"))
	bad, _ := newDouble(t, doubleSetup{log: "trt8.2_result-FP16_FAILED.log"})
	opts.Builder, opts.Force = bad, true
	res, err := Run(context.Background(), opts)
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

func TestCheckPlan(t *testing.T) {
	m, err := onnx.Load(tinynet)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ids  []string
		o    PlanOptions
		want string
	}{
		{[]string{"onnx-int8"}, PlanOptions{}, "int8 needs calibration"},
		{[]string{"onnx-int8"}, PlanOptions{RandomRanges: true}, "int8 needs calibration"},
		{[]string{"trt-int8"}, PlanOptions{RandomRanges: true}, ""},
		{[]string{"onnx-fp32-b8"}, PlanOptions{}, ""},
	}
	for _, c := range cases {
		_, err := CheckPlan(m, variants(t, c.ids...), c.o)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckPlan(%v, %+v) = %v, want %q", c.ids, c.o, err, c.want)
		}
	}
}

func TestParseMatrix(t *testing.T) {
	mx, err := ParseMatrix([]string{"fp32,fp16"}, []string{"onnx,trt"}, []string{"1,16"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(mx.Expand()); n != 8 {
		t.Errorf("Expand() = %d variants, want 8", n)
	}
	if _, err := ParseMatrix([]string{"fp8"}, nil, []string{"-1"}, nil); err == nil || !strings.Contains(err.Error(), "fp8") || !strings.Contains(err.Error(), "--max-batch") {
		t.Errorf("ParseMatrix(bad) = %v, want errors naming fp8 and --max-batch", err)
	}
}

// A --target that the GPU does not match is refused before trtexec builds
// anything, and nothing is written for the variant.
func TestRunRefusesTargetMismatch(t *testing.T) {
	tx, argvFile := newDouble(t, doubleSetup{log: "trt10.16_result-01.log"})
	repo := t.TempDir()
	opts := Options{Source: tinynet, Repo: repo, ToolVersion: "test", Builder: tx,
		GPU:      &GPUInfo{Name: "NVIDIA A10G", ComputeCapability: "8.6"},
		TRT:      TRTOptions{Target: &Target{ComputeCapability: "9.0"}},
		Variants: variants(t, "trt-fp32-b4")}
	res, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed()) != 1 || !strings.Contains(res.Rows[0].Detail, "compute capability") {
		t.Fatalf("Run with a mismatched target = %+v, want a failed variant naming the compute capability", res.Rows)
	}
	for _, argv := range recordedArgv(t, argvFile) {
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
	opts := Options{Source: tinynet, Repo: repo, ToolVersion: "test", ExternalOver: 1, FP16: FP16Options{KeepIOTypes: true},
		Variants: variants(t, "onnx-fp32", "onnx-fp16")}
	res, err := Run(context.Background(), opts)
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
