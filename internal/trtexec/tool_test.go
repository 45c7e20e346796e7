package trtexec

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/internal/trtexec/trtexectest"
	"github.com/kiln-ml/kiln/manifest"
)

// newDouble returns a Tool that runs the test binary as the trtexec test
// double, and the file where the double records each argv it receives.
func newDouble(t *testing.T, d trtexectest.Double) (*Tool, string) {
	t.Helper()
	exe, argv := d.Install(t)
	return &Tool{Path: exe}, argv
}

func TestBuildArgv(t *testing.T) {
	dyn := func(p manifest.Precision, fp16, qdq bool, cache string) Spec {
		return Spec{ONNX: "model.onnx", Precision: p, ONNXIsFP16: fp16, ONNXIsQDQ: qdq, CalibCache: cache,
			Inputs: []InputShape{{Name: "x", Dims: []int64{-1, 1, 28, 28}}}, MaxBatch: 16, OptBatch: 4,
			WorkspaceMiB: 1024, SkipInference: true}
	}
	const shapes = "--minShapes=x:1x1x28x28 --optShapes=x:4x1x28x28 --maxShapes=x:16x1x28x28"
	tests := []struct {
		name    string
		double  trtexectest.Double
		spec    Spec
		version manifest.TRTVersion
		want    string // argv after --saveEngine=<tmp>
	}{
		{"8.4 fp32", trtexectest.Double{Log: "trt8.4_result-FP32.log"}, dyn(manifest.FP32, false, false, ""), trt84,
			shapes + " --memPoolSize=workspace:1024M --buildOnly"},
		{"8.4 fp16", trtexectest.Double{Log: "trt8.4_result-FP16.log"}, dyn(manifest.FP16, false, false, ""), trt84,
			shapes + " --fp16 --memPoolSize=workspace:1024M --buildOnly"},
		{"8.4 int8 qdq", trtexectest.Double{Log: "trt8.4_result-FP16.log"}, dyn(manifest.INT8, false, true, ""), trt84,
			shapes + " --int8 --fp16 --memPoolSize=workspace:1024M --buildOnly"},
		{"8.4 int8 cache", trtexectest.Double{Log: "trt8.4_result-FP16.log"}, dyn(manifest.INT8, false, false, "model.cache"), trt84,
			shapes + " --int8 --fp16 --calib=model.cache --memPoolSize=workspace:1024M --buildOnly"},
		{"10.16 fp32", trtexectest.Double{Log: "trt10.16_result-02.log"}, dyn(manifest.FP32, false, false, ""), manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1},
			shapes + " --memPoolSize=workspace:1024M --skipInference"},
		{"10.16 fp16", trtexectest.Double{Log: "trt10.16_result-02.log"}, dyn(manifest.FP16, false, false, ""), manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1},
			shapes + " --fp16 --memPoolSize=workspace:1024M --skipInference"},
		{"10.16 fp16 onnx", trtexectest.Double{Log: "trt10.16_result-02.log"}, dyn(manifest.FP16, true, false, ""), manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1},
			shapes + " --stronglyTyped --memPoolSize=workspace:1024M --skipInference"},
		{"10.16 int8 qdq", trtexectest.Double{Log: "trt10.16_result-02.log"}, dyn(manifest.INT8, false, true, ""), manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1},
			shapes + " --stronglyTyped --memPoolSize=workspace:1024M --skipInference"},
		{"10.16 int8 cache", trtexectest.Double{Log: "trt10.16_result-02.log"}, dyn(manifest.INT8, false, false, "model.cache"), manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1},
			shapes + " --int8 --fp16 --calib=model.cache --memPoolSize=workspace:1024M --skipInference"},
		// No TensorRT 11 log exists: the 10.16 log is presented as 11.0.0.
		{"11 fp32", trtexectest.Double{Log: "trt10.16_result-02.log", Version: "110000"}, dyn(manifest.FP32, false, false, ""), trt11,
			shapes + " --memPoolSize=workspace:1024M --skipInference"},
		{"11 fp16 onnx", trtexectest.Double{Log: "trt10.16_result-02.log", Version: "110000"}, dyn(manifest.FP16, true, false, ""), trt11,
			shapes + " --memPoolSize=workspace:1024M --skipInference"},
		{"11 int8 qdq", trtexectest.Double{Log: "trt10.16_result-02.log", Version: "110000"}, dyn(manifest.INT8, false, true, ""), trt11,
			shapes + " --memPoolSize=workspace:1024M --skipInference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx, argvFile := newDouble(t, tt.double)
			dir := t.TempDir()
			spec := tt.spec
			spec.Plan = filepath.Join(dir, "model.plan")
			res, err := tx.Build(context.Background(), spec)
			if err != nil {
				t.Fatalf("Build(%s) error %v", tt.name, err)
			}
			calls := trtexectest.RecordedArgv(t, argvFile)
			if len(calls) != 2 || strings.Join(calls[0], " ") != "--help" {
				t.Fatalf("trtexec calls = %q, want --help then the build", calls)
			}
			argv := calls[1]
			tmp, ok := strings.CutPrefix(argv[1], "--saveEngine=")
			if argv[0] != "--onnx=model.onnx" || !ok || filepath.Dir(tmp) != dir || !strings.HasPrefix(filepath.Base(tmp), ".model.plan.") {
				t.Fatalf("Build(%s) argv starts %q, want --onnx=model.onnx --saveEngine=<temp file next to the plan>", tt.name, argv[:2])
			}
			if got := strings.Join(argv[2:], " "); got != tt.want {
				t.Errorf("Build(%s) argv after --saveEngine =\n  %s\nwant\n  %s", tt.name, got, tt.want)
			}
			if res.Version != tt.version {
				t.Errorf("Build(%s).Version = %v, want %v", tt.name, res.Version, tt.version)
			}
			if got, want := strings.Join(res.Command[1:], " "), strings.Join(argv, " "); got != want {
				t.Errorf("Build(%s).Command = %q, want what ran: %q", tt.name, got, want)
			}
			plan, err := os.ReadFile(spec.Plan)
			if err != nil || string(plan) != trtexectest.PlanContent {
				t.Fatalf("plan file = %q, %v, want the double's engine", plan, err)
			}
			if res.PlanDigest != manifest.DigestBytes(plan) || res.Size != int64(len(plan)) || res.PlanPath != spec.Plan {
				t.Errorf("Build(%s) = digest %s size %d path %s, want the plan's", tt.name, res.PlanDigest, res.Size, res.PlanPath)
			}
			if got := testutil.DirNames(t, dir); strings.Join(got, " ") != "model.plan model.plan.log" {
				t.Errorf("plan dir holds %q, want only model.plan and model.plan.log", got)
			}
			if res.Log.Status != StatusPassed || res.LogPath != spec.Plan+".log" || res.Log.Command != "trtexec "+strings.Join(argv, " ") {
				t.Errorf("Build(%s).Log = status %s command %q path %s", tt.name, res.Log.Status, res.Log.Command, res.LogPath)
			}
		})
	}
}

func TestBuildFailed(t *testing.T) {
	// The real 8.2 FAILED log has no [E] lines: the error quotes its last lines.
	tx, _ := newDouble(t, trtexectest.Double{Log: "trt8.2_result-FP16_FAILED.log"})
	dir := t.TempDir()
	spec := Spec{ONNX: "model.onnx", Plan: filepath.Join(dir, "model.plan"), Precision: manifest.FP16}
	_, err := tx.Build(context.Background(), spec)
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("Build(FAILED log) error = %v, want *BuildError", err)
	}
	if be.Status != StatusFailed || be.Version != trt82 || len(be.Errors) != 0 {
		t.Errorf("BuildError = %+v, want FAILED, 8.2.3, no [E] lines", be)
	}
	if n := len(be.Tail); n == 0 || !strings.HasSuffix(be.Tail[n-1], "[I] Finish parsing network model") {
		t.Errorf("BuildError.Tail = %q, want the log's last lines", be.Tail)
	}
	var te *execx.ToolError
	if !errors.As(err, &te) || te.ExitCode != 1 {
		t.Errorf("Build(FAILED log) error = %v, want a ToolError with exit 1 inside", err)
	}
	want := "trtexec (TensorRT 8.2.3) building model.onnx: "
	if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "exited 1, FAILED: ") ||
		!strings.HasSuffix(err.Error(), "(log: "+spec.Plan+".log)") {
		t.Errorf("Build(FAILED log) error = %q", err.Error())
	}
	if got := testutil.DirNames(t, dir); strings.Join(got, " ") != "model.plan.log" {
		t.Errorf("plan dir holds %q, want only the log", got)
	}
}

func TestBuildErrorLines(t *testing.T) {
	// A synthetic variant of the real 8.2 FAILED log: two [E] lines in
	// trtexec's format (formats.md §7.1) inserted before the verdict. The
	// double sends them to stderr, as trtexec does.
	real, err := os.ReadFile(testutil.Corpus(t, "trt-logs", "trtexec", "trt8.2_result-FP16_FAILED.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(real), "\n"), "\n")
	errLines := []string{
		"[05/07/2022-06:13:10] [E] Cannot find input tensor with name \"x:0\" in the network inputs! Please make sure the input tensor names are correct.",
		"[05/07/2022-06:13:10] [E] Network And Config setup failed",
	}
	synthetic := append(append(lines[:len(lines)-1:len(lines)-1], errLines...), lines[len(lines)-1])
	logPath := filepath.Join(t.TempDir(), "synthetic-failed.log")
	if err := os.WriteFile(logPath, []byte(strings.Join(synthetic, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tx, _ := newDouble(t, trtexectest.Double{Log: logPath})
	spec := Spec{ONNX: "model.onnx", Plan: filepath.Join(t.TempDir(), "model.plan"), Precision: manifest.FP16}
	_, err = tx.Build(context.Background(), spec)
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("Build error = %v, want *BuildError", err)
	}
	want := []string{errLines[0][len("[05/07/2022-06:13:10] [E] "):], "Network And Config setup failed"}
	if strings.Join(be.Errors, "\n") != strings.Join(want, "\n") || len(be.Tail) != 0 {
		t.Errorf("BuildError.Errors = %q, Tail %q, want %q", be.Errors, be.Tail, want)
	}
	if !strings.Contains(err.Error(), "FAILED: Cannot find input tensor with name \"x:0\"") {
		t.Errorf("Build error = %q, want the [E] lines", err.Error())
	}
	if _, err := os.Stat(spec.Plan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plan exists after a failed build: %v", err)
	}
}

func TestBuildTimeoutHangCrash(t *testing.T) {
	tests := []struct {
		mode    string
		timeout time.Duration
		check   func(t *testing.T, err error)
	}{
		{"hang", 2 * time.Second, func(t *testing.T, err error) {
			var te *execx.ToolError
			if !errors.As(err, &te) || !te.TimedOut || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Build(hang) error = %v, want a timeout", err)
			}
			if !strings.Contains(err.Error(), "timed out after 2s") {
				t.Errorf("Build(hang) error = %q", err.Error())
			}
		}},
		{"crash", time.Minute, func(t *testing.T, err error) {
			var be *BuildError
			if !errors.As(err, &be) || be.Status != StatusUnknown || !strings.Contains(err.Error(), "killed by signal killed") {
				t.Errorf("Build(crash) error = %v, want killed by signal, status unknown", err)
			}
		}},
		{"noplan", time.Minute, func(t *testing.T, err error) {
			var be *BuildError
			if !errors.As(err, &be) || be.Status != StatusPassed || !strings.Contains(err.Error(), "PASSED but wrote no engine") {
				t.Errorf("Build(noplan) error = %v, want PASSED but no engine", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			tx, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log", Mode: tt.mode})
			tx.Timeout = tt.timeout
			dir := t.TempDir()
			_, err := tx.Build(context.Background(), Spec{ONNX: "m.onnx", Plan: filepath.Join(dir, "m.plan"), Precision: manifest.FP32})
			tt.check(t, err)
			if got := testutil.DirNames(t, dir); strings.Join(got, " ") != "m.plan.log" {
				t.Errorf("after %s the plan dir holds %q, want only the log", tt.mode, got)
			}
		})
	}
}

func TestBuildCancel(t *testing.T) {
	tx, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-02.log", Mode: "hang"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel mid-build, once trtexec has started building.
	tx.OnLine = func(l execx.Line) {
		if strings.Contains(l.Text, "Start parsing network model") {
			cancel()
		}
	}
	dir := t.TempDir()
	_, err := tx.Build(ctx, Spec{ONNX: "m.onnx", Plan: filepath.Join(dir, "m.plan"), Precision: manifest.FP16})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Build(canceled) error = %v, want context.Canceled", err)
	}
	if got := testutil.DirNames(t, dir); strings.Join(got, " ") != "m.plan.log" {
		t.Errorf("after cancel the plan dir holds %q, want only the log", got)
	}
}

func TestDetectVersion(t *testing.T) {
	for _, c := range corpusLogs {
		if !strings.HasSuffix(c.name, ".log") {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			tx, _ := newDouble(t, trtexectest.Double{Log: c.name})
			v, err := tx.DetectVersion(context.Background())
			if err != nil || v != c.version {
				t.Errorf("DetectVersion(%s) = %v, %v, want %v", c.name, v, err, c.version)
			}
		})
	}
}

func TestBuildTarget(t *testing.T) {
	v103 := manifest.TRTSpec{TRTVersion: manifest.TRTVersion{Major: 10, Minor: 3}, AnyPatch: true}
	tests := []struct {
		name   string
		target Target
		want   string
		calls  int // trtexec runs: --help only when refused before the build
	}{
		{"trt mismatch refused before building", Target{TRT: &v103}, "target wants TensorRT version 10.3, but this machine has 10.16.1", 1},
		{"gpu mismatch refused after building", Target{ComputeCapability: "8.6"}, "target wants compute capability 8.6, but this machine has 9.0 (NVIDIA H100 PCIe)", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx, argv := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
			dir := t.TempDir()
			target := tt.target
			_, err := tx.Build(context.Background(), Spec{ONNX: "m.onnx", Plan: filepath.Join(dir, "m.plan"), Precision: manifest.FP32, Target: &target})
			var tm *TargetMismatchError
			if !errors.As(err, &tm) || !strings.HasSuffix(err.Error(), tt.want) {
				t.Errorf("Build(%s) error = %v, want %q", tt.name, err, tt.want)
			}
			if n := len(trtexectest.RecordedArgv(t, argv)); n != tt.calls {
				t.Errorf("Build(%s) ran trtexec %d times, want %d", tt.name, n, tt.calls)
			}
			if _, err := os.Stat(filepath.Join(dir, "m.plan")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("plan exists after a refused build")
			}
		})
	}
}

func TestBuildNotFound(t *testing.T) {
	tx := &Tool{Path: filepath.Join(t.TempDir(), "trtexec")}
	_, err := tx.Build(context.Background(), Spec{ONNX: "m.onnx", Plan: filepath.Join(t.TempDir(), "m.plan"), Precision: manifest.FP32})
	var nf *execx.NotFoundError
	if !errors.As(err, &nf) {
		t.Errorf("Build(no trtexec) error = %v, want *execx.NotFoundError", err)
	}
}

func TestBuildUnsupportedLeavesNothing(t *testing.T) {
	tx, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log", Version: "110000"})
	dir := t.TempDir()
	_, err := tx.Build(context.Background(), Spec{ONNX: "m.onnx", Plan: filepath.Join(dir, "m.plan"), Precision: manifest.FP16})
	var ue *UnsupportedError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "run the fp16 rewrite first") {
		t.Errorf("Build(11, fp16 from fp32) error = %v, want *UnsupportedError", err)
	}
	if got := testutil.DirNames(t, dir); len(got) != 0 {
		t.Errorf("plan dir holds %q, want nothing", got)
	}
}
