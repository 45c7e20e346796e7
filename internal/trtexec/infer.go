package trtexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/onnx"
)

// InferSpec describes one inference run of a built engine with trtexec:
// given inputs in, the outputs and trtexec's timing out. It is plain data;
// the zero value of each optional field leaves trtexec's default.
type InferSpec struct {
	// Engine is the serialized engine (plan) to load.
	Engine string
	// Inputs are the values to run, by input name. An input not given gets
	// trtexec's random values, which is fine for timing only.
	Inputs map[string]*onnx.Tensor
	// Shapes are the inference shapes of the inputs with dynamic
	// dimensions (--shapes); an input given in Inputs must have its shape.
	Shapes map[string][]int64
	// Outputs is the engine's output signature, name to element type: the
	// outputs to read back (--exportOutput), each of which must be there.
	// trtexec's JSON carries no types, so they come from here. Empty means
	// a timing-only run that reads no outputs.
	Outputs map[string]onnx.DataType

	// WarmUp is --warmUp, rounded up to whole milliseconds; nil leaves
	// trtexec's 200 ms.
	WarmUp *time.Duration
	// Duration is --duration, the least time measured, rounded up to whole
	// seconds; nil leaves trtexec's 3 s. Zero with Iterations 1 runs the
	// engine once (a correctness check).
	Duration *time.Duration
	// Iterations is --iterations, the least number of runs measured; zero
	// leaves trtexec's 10.
	Iterations int
	// CUDAGraph runs the engine through a CUDA graph (--useCudaGraph).
	CUDAGraph bool
	// NoDataTransfers leaves host-device copies out of the timing
	// (--noDataTransfers); outputs are still copied back to be exported.
	NoDataTransfers bool
	// Device is the CUDA device to run on (--device); 0 is trtexec's default.
	Device int

	// LogPath, when set, keeps trtexec's full console log there; otherwise
	// the log is read and removed.
	LogPath string
	// OutputJSON, when set, keeps trtexec's exported outputs there;
	// otherwise they go to a temporary file.
	OutputJSON string
	// ExtraArgs are passed to trtexec last, verbatim.
	ExtraArgs []string
	// Timeout bounds the run; zero means the Tool's Timeout.
	Timeout time.Duration
}

// inferFlags are the trtexec flags Infer sets itself; ExtraArgs may not.
var inferFlags = []string{"--loadEngine", "--onnx", "--saveEngine", "--loadInputs", "--shapes",
	"--exportOutput", "--warmUp", "--duration", "--iterations", "--useCudaGraph", "--noDataTransfers",
	"--device", "--skipInference", "--buildOnly"}

// Validate checks the spec on its own, before anything runs.
func (s InferSpec) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.Engine == "" {
		bad("no engine given")
	}
	for _, name := range sortedKeys(s.Inputs) {
		if err := checkInputName(name); err != nil {
			errs = append(errs, err)
			continue
		}
		t := s.Inputs[name]
		if err := checkTensor(t); err != nil {
			bad("input %q: %w", name, err)
			continue
		}
		if shape, ok := s.Shapes[name]; ok && !slices.Equal(shape, t.Dims) {
			bad("input %q has dims %v but its inference shape is %v", name, t.Dims, shape)
		}
	}
	for _, name := range sortedKeys(s.Shapes) {
		if err := checkInputName(name); err != nil {
			errs = append(errs, err)
			continue
		}
		for i, d := range s.Shapes[name] {
			if d < 0 {
				bad("input %q: inference shape dimension %d is %d", name, i, d)
			}
		}
	}
	for _, name := range sortedKeys(s.Outputs) {
		if name == "" {
			bad("output with an empty name")
		} else if err := checkTRTType(s.Outputs[name]); err != nil {
			bad("output %q: %w", name, err)
		}
	}
	if s.WarmUp != nil && *s.WarmUp < 0 {
		bad("warm-up %v is negative", *s.WarmUp)
	}
	if s.Duration != nil && *s.Duration < 0 {
		bad("duration %v is negative", *s.Duration)
	}
	if s.Iterations < 0 {
		bad("iterations %d is negative", s.Iterations)
	}
	if s.Device < 0 {
		bad("device %d is negative", s.Device)
	}
	for _, a := range s.ExtraArgs {
		if !strings.HasPrefix(a, "-") {
			bad("extra trtexec argument %q is not a flag", a)
			continue
		}
		if name, _, _ := strings.Cut(a, "="); slices.Contains(inferFlags, name) {
			bad("extra trtexec argument %q: kiln sets %s itself", a, name)
		}
	}
	return errors.Join(errs...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// InferResult is what an inference run gave.
type InferResult struct {
	// Outputs are the outputs of InferSpec.Outputs, decoded with their
	// types; floating-point values carry trtexec's 6 significant digits.
	Outputs map[string]*onnx.Tensor
	// Perf is trtexec's performance summary; nil if the log has none.
	Perf *Performance
	// Command is the argv that ran, program first.
	Command []string
	// Log is the parsed console log; LogPath is the full log when kept.
	Log     *Log
	LogPath string
	// Duration is the wall time of the trtexec run.
	Duration time.Duration
}

// Infer runs spec.Engine with trtexec on spec.Inputs and reads back the
// outputs of spec.Outputs and the performance summary. The inputs are
// written as raw little-endian files (--loadInputs), trtexec's binary
// input format: each element in the tensor's own layout, fp16 and bf16 as
// their 16-bit patterns, bool as one byte. A run that does not pass gives a
// *BuildError with Engine set and the log's error lines or last lines.
func (t *Tool) Infer(ctx context.Context, spec InferSpec) (*InferResult, error) {
	wrap := func(err error) error { return fmt.Errorf("running engine %s: %w", spec.Engine, err) }
	if err := spec.Validate(); err != nil {
		return nil, wrap(err)
	}
	dir, err := os.MkdirTemp("", "kiln-trtexec-")
	if err != nil {
		return nil, wrap(err)
	}
	defer os.RemoveAll(dir)
	files, err := writeInputs(dir, spec.Inputs)
	if err != nil {
		return nil, wrap(err)
	}
	outJSON, logPath := spec.OutputJSON, spec.LogPath
	if outJSON == "" && len(spec.Outputs) > 0 {
		outJSON = filepath.Join(dir, "outputs.json")
	} else if outJSON != "" {
		// Outputs left by an earlier run must not pass for this one's.
		if err := os.Remove(outJSON); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, wrap(err)
		}
	}
	if logPath == "" {
		logPath = filepath.Join(dir, "trtexec.log")
	}
	args := inferArgs(spec, files, outJSON)
	timeout := spec.Timeout
	if timeout == 0 {
		timeout = t.Timeout
	}
	t.logger().Debug("running trtexec", "tool", t.path(), "path", spec.Engine, "args", args)
	run, err := t.runLogged(ctx, args, logPath, timeout)
	if err != nil {
		var nf *execx.NotFoundError
		if errors.As(err, &nf) {
			return nil, err
		}
		return nil, wrap(err)
	}
	if run.err != nil || run.log.Status != StatusPassed {
		be := runError(run.log, logPath, run.err)
		be.Engine, be.Version = spec.Engine, t.Version
		if run.log.Version != nil {
			be.Version = *run.log.Version
		}
		if spec.LogPath == "" {
			be.LogPath = ""
		}
		return nil, be
	}
	res := &InferResult{Perf: run.log.Performance, Command: append([]string{t.path()}, args...),
		Log: run.log, LogPath: spec.LogPath, Duration: run.duration, Outputs: map[string]*onnx.Tensor{}}
	if len(spec.Outputs) > 0 {
		if res.Outputs, err = readOutputs(outJSON, spec.Outputs); err != nil {
			return nil, wrap(err)
		}
	}
	t.logger().Debug("ran engine", "tool", t.path(), "path", spec.Engine, "dur", run.duration)
	return res, nil
}

// writeInputs writes each input tensor's raw bytes to a file in dir and
// returns the files by input name. The files are named by position, not by
// input name: names may hold anything but a comma or a single quote.
func writeInputs(dir string, inputs map[string]*onnx.Tensor) (map[string]string, error) {
	// trtexec splits --loadInputs on ',' and, for an unquoted name, takes
	// the file after the last ':'; a quote starts a quoted name.
	if strings.ContainsAny(dir, ",:'") {
		return nil, fmt.Errorf("temporary directory %s: trtexec cannot load input files from a path containing ',', ':' or '\\''; set TMPDIR", dir)
	}
	files := map[string]string{}
	for i, name := range sortedKeys(inputs) {
		p, err := onnx.Encode(inputs[name], onnx.Raw)
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
		f := filepath.Join(dir, "input-"+strconv.Itoa(i)+".bin")
		if err := os.WriteFile(f, p.RawData, 0o600); err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
		files[name] = f
	}
	return files, nil
}

// inferArgs spells the trtexec command line of an inference run. The flags
// are spelled alike from TensorRT 8.0 to 10.x (sampleOptions.cpp, and the
// 10.16 --help of the corpus):
//   - --loadInputs=name:file,...: names are never quoted. trtexec splits an
//     unquoted item on its last ':', so "input:0:/tmp/f" names "input:0"
//     in every release, whereas a quoted name ('input:0':/tmp/f) is read
//     from 8.6 on only (before, the quotes stay in the name).
//   - --shapes=name:dims: names with ':' quoted, as for the build shapes;
//     a scalar as "name:" (--help 10.16: "use input0:scalar or simply
//     input0: with nothing after the colon").
//   - --warmUp in whole milliseconds and --duration in whole seconds: 8.x
//     reads them as integers, 10.x as floats.
func inferArgs(spec InferSpec, files map[string]string, outJSON string) []string {
	args := []string{"--loadEngine=" + spec.Engine}
	if len(files) > 0 {
		var items []string
		for _, name := range sortedKeys(files) {
			items = append(items, name+":"+files[name])
		}
		args = append(args, "--loadInputs="+strings.Join(items, ","))
	}
	if len(spec.Shapes) > 0 {
		var items []string
		for _, name := range sortedKeys(spec.Shapes) {
			dims := make([]string, len(spec.Shapes[name]))
			for i, d := range spec.Shapes[name] {
				dims[i] = strconv.FormatInt(d, 10)
			}
			items = append(items, shapeName(name)+":"+strings.Join(dims, "x"))
		}
		args = append(args, "--shapes="+strings.Join(items, ","))
	}
	if outJSON != "" {
		args = append(args, "--exportOutput="+outJSON)
	}
	if spec.WarmUp != nil {
		ms := (*spec.WarmUp + time.Millisecond - 1) / time.Millisecond
		args = append(args, "--warmUp="+strconv.FormatInt(int64(ms), 10))
	}
	if spec.Duration != nil {
		s := (*spec.Duration + time.Second - 1) / time.Second
		args = append(args, "--duration="+strconv.FormatInt(int64(s), 10))
	}
	if spec.Iterations > 0 {
		args = append(args, "--iterations="+strconv.Itoa(spec.Iterations))
	}
	if spec.CUDAGraph {
		args = append(args, "--useCudaGraph")
	}
	if spec.NoDataTransfers {
		args = append(args, "--noDataTransfers")
	}
	if spec.Device > 0 {
		args = append(args, "--device="+strconv.Itoa(spec.Device))
	}
	return append(args, spec.ExtraArgs...)
}

// readOutputs reads trtexec's exported outputs and decodes those of want.
func readOutputs(path string, want map[string]onnx.DataType) (map[string]*onnx.Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading trtexec outputs: %w", err)
	}
	defer f.Close()
	outs, err := ParseExportOutput(f)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	byName := map[string]ExportedOutput{}
	for _, o := range outs {
		byName[o.Name] = o
	}
	res := map[string]*onnx.Tensor{}
	for _, name := range sortedKeys(want) {
		o, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("reading %s: output %q missing (trtexec exported %s)", path, name, outputNames(outs))
		}
		t, err := o.Tensor(want[name])
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		res[name] = t
	}
	return res, nil
}

func outputNames(outs []ExportedOutput) string {
	if len(outs) == 0 {
		return "none"
	}
	names := make([]string, len(outs))
	for i, o := range outs {
		names[i] = strconv.Quote(o.Name)
	}
	return strings.Join(names, ", ")
}
