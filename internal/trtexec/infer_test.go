package trtexec

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/internal/trtexec/trtexectest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// inferLog is the corpus's real inference run: trtexec --loadEngine on the
// model-trained engine (input x 1x1x28x28 fp32, outputs y 1x10 fp32 and z 1
// int64) with data transfers, so its summary has every line, and with
// --dumpOutput, so it prints the outputs the engine computed.
const inferLog = "trt10.16_result-06.log"

func durp(d time.Duration) *time.Duration { return &d }

// dumpedOutputs builds trtexec's --exportOutput JSON from the outputs a
// corpus log printed with --dumpOutput ("y: (1x10)" and a line of values,
// Bindings::dumpBindings), in the layout of sampleReporting.cpp
// exportJSONOutput, written out here by hand rather than by
// FormatExportOutput so that the parser is checked against trtexec's code.
func dumpedOutputs(t *testing.T, logName string) []byte {
	t.Helper()
	text, err := os.ReadFile(testutil.Corpus(t, "trt-logs", "trtexec", logName))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\[[^]]+\] \[I\] (\w+): \(([0-9x]*)\)\n\[[^]]+\] \[I\] (.*)$`)
	var b strings.Builder
	b.WriteString("[\n")
	sep := "  "
	for _, m := range re.FindAllStringSubmatch(string(text), -1) {
		b.WriteString(sep + `{ "name" : "` + m[1] + `"` + "\n")
		sep = ", "
		b.WriteString("  " + sep + `"dimensions" : "` + m[2] + `"` + "\n")
		b.WriteString("  " + sep + `"values" : [ ` + strings.Join(strings.Fields(m[3]), sep) + " ]\n  }\n")
	}
	b.WriteString("]\n")
	if strings.Count(b.String(), "name") != 2 {
		t.Fatalf("%s: want the dumps of y and z, got\n%s", logName, b.String())
	}
	return []byte(b.String())
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustTensor(t *testing.T, name string, dims []int64, data any) *onnx.Tensor {
	t.Helper()
	x, err := onnx.NewTensor(name, dims, data)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// le32 and friends spell little-endian bytes independently of onnx.RawBytes.
func le32(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func TestInfer(t *testing.T) {
	outputs := writeTemp(t, "outputs.json", dumpedOutputs(t, inferLog))
	tx, argvFile := newDouble(t, trtexectest.Double{Log: inferLog, Outputs: outputs})
	x := make([]float32, 28*28)
	for i := range x {
		x[i] = float32(i)/4 - 1
	}
	inputs := map[string]*onnx.Tensor{
		"x":       mustTensor(t, "x", []int64{1, 1, 28, 28}, x),
		"half":    mustTensor(t, "half", []int64{2}, []float16.Float16{float16.Fromfloat32(1), float16.Fromfloat32(-2.5)}),
		"mask":    mustTensor(t, "mask", []int64{3}, []bool{true, false, true}),
		"ids":     mustTensor(t, "ids", []int64{1, 2}, []int64{-1, 1 << 40}),
		"input:0": mustTensor(t, "input:0", []int64{}, []int32{-2}),
	}
	logPath := filepath.Join(t.TempDir(), "infer.log")
	spec := InferSpec{Engine: "model-trained.plan", Inputs: inputs,
		Shapes:  map[string][]int64{"x": {1, 1, 28, 28}},
		Outputs: map[string]onnx.DataType{"y": onnx.Float, "z": onnx.Int64},
		WarmUp:  durp(0), Duration: durp(0), Iterations: 1, LogPath: logPath}
	res, err := tx.Infer(context.Background(), spec)
	if err != nil {
		t.Fatalf("Infer error %v", err)
	}

	calls := trtexectest.RecordedArgv(t, argvFile)
	if len(calls) != 1 {
		t.Fatalf("trtexec ran %d times, want once (no --help: the log says the version)", len(calls))
	}
	argv := calls[0]
	files := regexp.MustCompile(`(/[^,]*/)input-\d\.bin`).FindAllStringSubmatch(argv[1], -1)
	if len(files) != 5 {
		t.Fatalf("argv[1] = %q, want --loadInputs with 5 files", argv[1])
	}
	dir := files[0][1]
	want := []string{"--loadEngine=model-trained.plan",
		"--loadInputs=half:" + dir + "input-0.bin,ids:" + dir + "input-1.bin,input:0:" + dir + "input-2.bin,mask:" + dir + "input-3.bin,x:" + dir + "input-4.bin",
		"--shapes=x:1x1x28x28", "--exportOutput=" + dir + "outputs.json", "--warmUp=0", "--duration=0", "--iterations=1"}
	if got := strings.Join(argv, " "); got != strings.Join(want, " ") {
		t.Errorf("Infer argv =\n  %s\nwant\n  %s", got, strings.Join(want, " "))
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Infer left its temporary directory %s", dir)
	}

	// The input files, as the double read them: little-endian elements,
	// fp16 as its bits, bool as one byte, int64 as eight.
	xb := make([]uint32, len(x))
	for i, v := range x {
		xb[i] = math.Float32bits(v)
	}
	wantInputs := map[string][]byte{
		"x":       le32(xb...),
		"half":    {0x00, 0x3c, 0x00, 0xc1},
		"mask":    {1, 0, 1},
		"ids":     binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, math.MaxUint64), 1<<40),
		"input:0": le32(0xfffffffe),
	}
	if got := trtexectest.RecordedInputs(t, argvFile); len(got) != 1 || !reflect.DeepEqual(got[0], wantInputs) {
		t.Errorf("input files = %v, want %v", got, wantInputs)
	}

	// The outputs are those the captured run dumped: y: (1x10) and z: (1).
	wantY := []float32{-0.0518188, 0.000385761, 0.0417786, 0.27002, -0.0838013, 0.0484314, -0.234619, -0.0370483, -0.000504494, -0.0668945}
	wantOut := map[string]*onnx.Tensor{
		"y": {Name: "y", Type: onnx.Float, Dims: []int64{1, 10}, Data: wantY},
		"z": {Name: "z", Type: onnx.Int64, Dims: []int64{1}, Data: []int64{3}},
	}
	for name, w := range wantOut {
		if got := res.Outputs[name]; !reflect.DeepEqual(got, w) {
			t.Errorf("Infer output %s = %+v, want %+v", name, got, w)
		}
	}
	if len(res.Outputs) != len(wantOut) {
		t.Errorf("Infer outputs = %v, want y and z only", res.Outputs)
	}

	checkInferPerf(t, res.Perf)
	if got := strings.Join(res.Command[1:], " "); got != strings.Join(argv, " ") || res.Command[0] != tx.Path {
		t.Errorf("Infer Command = %q, want what ran", res.Command)
	}
	if res.LogPath != logPath || res.Log.Status != StatusPassed || res.Log.Device != "NVIDIA H100 PCIe" {
		t.Errorf("Infer log = %s status %s device %q", res.LogPath, res.Log.Status, res.Log.Device)
	}
	if b, err := os.ReadFile(logPath); err != nil || !bytes.Contains(b, []byte("=== Performance summary ===")) {
		t.Errorf("kept log %s: %v, want the replayed log", logPath, err)
	}
}

// checkInferPerf compares perf with the summary of inferLog, stated here
// from its lines.
func checkInferPerf(t *testing.T, perf *Performance) {
	t.Helper()
	stats := func(min, max, mean, median, p90, p95, p99 float64) *Stats {
		return &Stats{Min: min, Max: max, Mean: mean, Median: median, Percentiles: Percentiles{90: p90, 95: p95, 99: p99}}
	}
	want := &Performance{ThroughputQPS: 12827.1,
		Latency:              stats(0.0551758, 0.193146, 0.0606122, 0.0616455, 0.0628662, 0.064209, 0.0704346),
		Enqueue:              stats(0.0380859, 0.161926, 0.0412251, 0.0406494, 0.0426025, 0.0466309, 0.0515137),
		H2D:                  stats(0.00341797, 0.108643, 0.00396193, 0.00390625, 0.00427246, 0.00439453, 0.00488281),
		GPUCompute:           stats(0.0473633, 0.167191, 0.0525201, 0.0537109, 0.0549316, 0.0560913, 0.0620117),
		D2H:                  stats(0.00390625, 0.038147, 0.00413043, 0.00415039, 0.00415039, 0.00415039, 0.00439453),
		TotalHostWalltimeSec: 3.00013, TotalGPUComputeSec: 2.02113}
	if got, want := mustJSONOf(perf), mustJSONOf(want); got != want {
		t.Errorf("Infer Perf =\n  %s\nwant\n  %s", got, want)
	}
}

// TestInferTimingOnly runs without inputs or outputs: trtexec's random
// inputs, no --exportOutput, and the double writes no outputs.
func TestInferTimingOnly(t *testing.T) {
	tx, argvFile := newDouble(t, trtexectest.Double{Log: inferLog})
	res, err := tx.Infer(context.Background(), InferSpec{Engine: "m.plan", CUDAGraph: true, NoDataTransfers: true,
		Device: 1, Duration: durp(1500 * time.Millisecond), WarmUp: durp(time.Microsecond)})
	if err != nil {
		t.Fatalf("Infer(timing only) error %v", err)
	}
	want := "--loadEngine=m.plan --warmUp=1 --duration=2 --useCudaGraph --noDataTransfers --device=1"
	if got := strings.Join(trtexectest.RecordedArgv(t, argvFile)[0], " "); got != want {
		t.Errorf("Infer(timing only) argv = %s, want %s", got, want)
	}
	if len(res.Outputs) != 0 || res.Perf == nil || res.Perf.ThroughputQPS != 12827.1 || res.LogPath != "" {
		t.Errorf("Infer(timing only) = outputs %v perf %+v log %q", res.Outputs, res.Perf, res.LogPath)
	}
}

func TestInferOutputErrors(t *testing.T) {
	real := string(dumpedOutputs(t, inferLog))
	tests := []struct {
		name, json string
		outputs    map[string]onnx.DataType
		want       string
	}{
		{"missing output", real, map[string]onnx.DataType{"y": onnx.Float, "scores": onnx.Float},
			`output "scores" missing (trtexec exported "z", "y")`},
		{"count mismatch", strings.Replace(real, `"dimensions" : "1x10"`, `"dimensions" : "2x10"`, 1),
			map[string]onnx.DataType{"y": onnx.Float}, `line 6: output "y": 10 values for dimensions "2x10" (20 elements)`},
		{"bad json", strings.Replace(real, "]\n  }", "\n  }", 1), map[string]onnx.DataType{"y": onnx.Float},
			`line 5: values: after value 0: want ',' or ']', found "}`},
		{"empty file", "", map[string]onnx.DataType{"y": onnx.Float}, `line 1: want '[', found end of file`},
		{"wrong type", real, map[string]onnx.DataType{"y": onnx.Int64},
			`output "y" as int64: value 0 (-0.0518188): not a number of this type`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx, _ := newDouble(t, trtexectest.Double{Log: inferLog, Outputs: writeTemp(t, "outputs.json", []byte(tt.json))})
			out := filepath.Join(t.TempDir(), "exported.json")
			_, err := tx.Infer(context.Background(), InferSpec{Engine: "m.plan", Outputs: tt.outputs, OutputJSON: out})
			want := "running engine m.plan: reading " + out + ": "
			if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Infer(%s) error = %v, want %q...%q", tt.name, err, want, tt.want)
			}
		})
	}
}

func TestInferFailed(t *testing.T) {
	for _, keep := range []bool{false, true} {
		tx, _ := newDouble(t, trtexectest.Double{Log: "trt8.2_result-FP16_FAILED.log"})
		spec := InferSpec{Engine: "model.plan", Outputs: map[string]onnx.DataType{"y": onnx.Float}}
		if keep {
			spec.LogPath = filepath.Join(t.TempDir(), "infer.log")
		}
		_, err := tx.Infer(context.Background(), spec)
		var be *BuildError
		if !errors.As(err, &be) {
			t.Fatalf("Infer(FAILED log) error = %v, want *BuildError", err)
		}
		if be.Engine != "model.plan" || be.Status != StatusFailed || be.Version != trt82 || be.LogPath != spec.LogPath {
			t.Errorf("Infer(FAILED log) BuildError = %+v", be)
		}
		if n := len(be.Tail); n == 0 || !strings.HasSuffix(be.Tail[n-1], "[I] Finish parsing network model") {
			t.Errorf("BuildError.Tail = %q, want the log's last lines", be.Tail)
		}
		var te *execx.ToolError
		if !errors.As(err, &te) || te.ExitCode != 1 {
			t.Errorf("Infer(FAILED log) error = %v, want a ToolError with exit 1 inside", err)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "trtexec (TensorRT 8.2.3) running model.plan: ") || !strings.Contains(msg, "exited 1, FAILED: ") ||
			strings.Contains(msg, "(log: ") != keep {
			t.Errorf("Infer(FAILED log, keep log %v) error = %q", keep, msg)
		}
	}
}

// TestInferFlagsInHelp checks every flag Infer can emit against the real
// trtexec --help of the corpus.
func TestInferFlagsInHelp(t *testing.T) {
	help, err := os.ReadFile(testutil.Corpus(t, "trt-logs", "trtexec", "trt10.16_trtexec_help.txt"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(--[A-Za-z0-9]+)`).FindAllStringSubmatch(string(help), -1) {
		known[m[1]] = true
	}
	spec := InferSpec{Engine: "m.plan", Shapes: map[string][]int64{"x": {1, 3}}, WarmUp: durp(0), Duration: durp(0),
		Iterations: 1, CUDAGraph: true, NoDataTransfers: true, Device: 2}
	args := inferArgs(spec, map[string]string{"x": "/tmp/x.bin"}, "/tmp/out.json")
	if len(args) != 10 {
		t.Fatalf("inferArgs(every option) = %q, want 10 flags", args)
	}
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if !known[name] {
			t.Errorf("Infer emits %s, which trtexec --help (10.16) does not list", name)
		}
	}
	for _, f := range inferFlags {
		if !known[f] && f != "--buildOnly" { // --buildOnly is the 8.x spelling, refused in ExtraArgs
			t.Errorf("inferFlags holds %s, which trtexec --help (10.16) does not list", f)
		}
	}
}

func TestInferArgs(t *testing.T) {
	files := map[string]string{"input:0": "/t/input-0.bin", "b": "/t/input-1.bin"}
	tests := []struct {
		name string
		spec InferSpec
		want string
	}{
		{"defaults", InferSpec{Engine: "e.plan"}, "--loadEngine=e.plan --loadInputs=b:/t/input-1.bin,input:0:/t/input-0.bin --exportOutput=o.json"},
		{"shapes", InferSpec{Engine: "e.plan", Shapes: map[string][]int64{"input:0": {4, 3}, "s": {}}},
			"--loadEngine=e.plan --loadInputs=b:/t/input-1.bin,input:0:/t/input-0.bin --shapes='input:0':4x3,s: --exportOutput=o.json"},
		{"timing", InferSpec{Engine: "e.plan", WarmUp: durp(1500 * time.Microsecond), Duration: durp(3 * time.Second), Iterations: 100,
			ExtraArgs: []string{"--useSpinWait"}},
			"--loadEngine=e.plan --loadInputs=b:/t/input-1.bin,input:0:/t/input-0.bin --exportOutput=o.json --warmUp=2 --duration=3 --iterations=100 --useSpinWait"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := strings.Join(inferArgs(tt.spec, files, "o.json"), " "); got != tt.want {
				t.Errorf("inferArgs(%s) =\n  %s\nwant\n  %s", tt.name, got, tt.want)
			}
		})
	}
}

func TestInferSpecValidate(t *testing.T) {
	x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{2}, Data: []float32{1, 2}}
	tests := []struct {
		name string
		spec InferSpec
		want string
	}{
		{"no engine", InferSpec{}, "no engine given"},
		{"nil input", InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"x": nil}}, `input "x": no tensor`},
		{"comma name", InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"a,b": x}}, "names containing ','"},
		{"double input", InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"x": {Type: onnx.Double, Dims: []int64{1}, Data: []float64{1}}}},
			`input "x": element type float64 is not one kiln exchanges with trtexec`},
		{"data of another type", InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"x": {Type: onnx.Float16, Dims: []int64{1}, Data: []float32{1}}}},
			`input "x": a float16 tensor cannot hold []float32 data`},
		{"count", InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{3}, Data: []float32{1}}}},
			`input "x": 1 elements for dims [3] (want 3)`},
		{"shape mismatch", InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"x": x}, Shapes: map[string][]int64{"x": {1, 2}}},
			`input "x" has dims [2] but its inference shape is [1 2]`},
		{"dynamic shape", InferSpec{Engine: "e", Shapes: map[string][]int64{"x": {-1, 2}}}, `input "x": inference shape dimension 0 is -1`},
		{"output type", InferSpec{Engine: "e", Outputs: map[string]onnx.DataType{"y": onnx.String}}, `output "y": element type string`},
		{"negative", InferSpec{Engine: "e", WarmUp: durp(-1), Duration: durp(-time.Second), Iterations: -1, Device: -1},
			"warm-up -1ns is negative\nduration -1s is negative\niterations -1 is negative\ndevice -1 is negative"},
		{"extra flag", InferSpec{Engine: "e", ExtraArgs: []string{"--shapes=x:1", "x"}},
			"extra trtexec argument \"--shapes=x:1\": kiln sets --shapes itself\nextra trtexec argument \"x\" is not a flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate(%s) = %v, want %q", tt.name, err, tt.want)
			}
		})
	}
	ok := InferSpec{Engine: "e", Inputs: map[string]*onnx.Tensor{"x": x}, Shapes: map[string][]int64{"x": {2}},
		Outputs: map[string]onnx.DataType{"y": onnx.Bool}}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(good spec) = %v", err)
	}
}

func TestInferNotFound(t *testing.T) {
	tx := &Tool{Path: filepath.Join(t.TempDir(), "trtexec")}
	_, err := tx.Infer(context.Background(), InferSpec{Engine: "m.plan"})
	var nf *execx.NotFoundError
	if !errors.As(err, &nf) {
		t.Errorf("Infer(no trtexec) error = %v, want *execx.NotFoundError", err)
	}
}

// mustJSONOf compares and shows nested values (Percentiles marshal sorted).
func mustJSONOf(v any) string { b, _ := json.Marshal(v); return string(b) }
