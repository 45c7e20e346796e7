package trtexec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/manifest"
)

// Int8Mode says how an int8 engine gets its quantization scales.
type Int8Mode string

// The ways to build an int8 engine (reference/formats.md §2, §3, §7.4).
const (
	// Int8Auto picks Int8QDQ when the ONNX model is Q/DQ, else Int8Cache.
	Int8Auto Int8Mode = ""
	// Int8QDQ builds from an explicitly quantized (Q/DQ) ONNX model.
	Int8QDQ Int8Mode = "qdq"
	// Int8Cache builds the fp32 ONNX model with a TensorRT calibration cache
	// (implicit quantization; TensorRT 8-10 only).
	Int8Cache Int8Mode = "cache"
	// Int8Random builds the fp32 model with --int8 and no calibration:
	// trtexec then uses placeholder ranges (reference/formats.md §2.1). Such
	// engines are for performance measurements only, never for accuracy.
	Int8Random Int8Mode = "random"
)

// HardwareCompat is a level of --hardwareCompatibilityLevel; "" leaves
// trtexec's default (engines for the build GPU's architecture only).
type HardwareCompat string

// The levels trtexec documents (trtexec --help, TensorRT 8.6+).
const (
	HardwareCompatNone        HardwareCompat = "none"
	HardwareCompatAmperePlus  HardwareCompat = "ampere+"
	HardwareCompatSameCompute HardwareCompat = "sameComputeCapability"
)

// Validate refuses a level trtexec does not know.
func (h HardwareCompat) Validate() error {
	switch h {
	case "", HardwareCompatNone, HardwareCompatAmperePlus, HardwareCompatSameCompute:
		return nil
	}
	return fmt.Errorf("unknown hardware compatibility level %q (want none, ampere+ or sameComputeCapability)", string(h))
}

// MaxOptimizationLevel is the highest --builderOptimizationLevel.
const MaxOptimizationLevel = 5

// InputShape is a model input as the ONNX graph declares it.
type InputShape struct {
	Name string
	// Dims are the dimensions; -1 in the first position marks a dynamic
	// batch dimension. Other dimensions must be fixed.
	Dims []int64
}

// Spec describes one TensorRT engine build. It is plain data; the zero
// value of each optional field leaves trtexec's default.
type Spec struct {
	// ONNX is the model to build from.
	ONNX string
	// Plan is where the engine goes; the full log goes to Plan + ".log".
	Plan string
	// Precision of the engine.
	Precision manifest.Precision
	// Int8Mode chooses the int8 path; ignored for other precisions.
	Int8Mode Int8Mode
	// CalibCache is the TensorRT calibration cache for Int8Cache builds.
	CalibCache string
	// ONNXIsFP16 says the ONNX model was already rewritten to float16.
	ONNXIsFP16 bool
	// ONNXIsQDQ says the ONNX model is explicitly quantized (Q/DQ nodes).
	ONNXIsQDQ bool

	// Inputs are the model's inputs. Those with a dynamic first dimension
	// get an optimization profile: batch 1 .. MaxBatch, tuned for OptBatch.
	Inputs []InputShape
	// MaxBatch is the largest batch the engine accepts; required when an
	// input has a dynamic batch dimension.
	MaxBatch int
	// OptBatch is the batch TensorRT tunes for; zero means MaxBatch.
	OptBatch int

	// WorkspaceMiB caps the builder's workspace memory pool.
	WorkspaceMiB int
	// OptimizationLevel is --builderOptimizationLevel (0-5, TensorRT 8.6+);
	// nil leaves trtexec's default (3).
	OptimizationLevel *int
	// TimingCache is a timing cache file, read and updated by the build.
	TimingCache string
	// HardwareCompat is --hardwareCompatibilityLevel: "", "none",
	// "ampere+" or "sameComputeCapability".
	HardwareCompat HardwareCompat
	// VersionCompatible builds an engine newer TensorRT releases can run.
	VersionCompatible bool
	// SkipInference stops trtexec after the build instead of benchmarking.
	SkipInference bool
	// LayerInfo, when set, is where trtexec writes the engine's layer
	// information as JSON (with --profilingVerbosity=detailed).
	LayerInfo string
	// ExtraArgs are passed to trtexec last, verbatim.
	ExtraArgs []string
	// Target, when set, is checked against the TensorRT version before the
	// build and against the GPU trtexec reports after it.
	Target *Target
	// Timeout bounds this build; zero means the Tool's Timeout.
	Timeout time.Duration
}

// int8Mode resolves Int8Auto.
func (s Spec) int8Mode() Int8Mode {
	if s.Int8Mode != Int8Auto {
		return s.Int8Mode
	}
	if s.ONNXIsQDQ {
		return Int8QDQ
	}
	return Int8Cache
}

// kilnFlags are the trtexec flags kiln sets itself; ExtraArgs may not.
var kilnFlags = []string{"--onnx", "--saveEngine", "--loadEngine", "--minShapes", "--optShapes",
	"--maxShapes", "--fp16", "--int8", "--best", "--calib", "--stronglyTyped"}

// Validate checks the spec on its own, without a TensorRT version; Args
// checks what depends on the version.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.ONNX == "" {
		bad("no ONNX model given")
	}
	if s.Plan == "" {
		bad("no plan output path given")
	}
	switch s.Precision {
	case manifest.FP32:
		if s.ONNXIsFP16 || s.ONNXIsQDQ {
			bad("fp32 engine requested from an fp16 or Q/DQ ONNX model; build fp32 from the fp32 model")
		}
	case manifest.FP16:
		if s.ONNXIsQDQ {
			bad("fp16 engine requested from a Q/DQ ONNX model; use precision int8")
		}
	case manifest.INT8:
		switch s.int8Mode() {
		case Int8QDQ:
			if !s.ONNXIsQDQ {
				bad("int8 mode qdq needs a Q/DQ ONNX model; run the int8 quantization first")
			}
			if s.CalibCache != "" {
				bad("int8 mode qdq takes its scales from the Q/DQ model; a calibration cache would be ignored")
			}
		case Int8Cache:
			if s.ONNXIsQDQ || s.ONNXIsFP16 {
				bad("int8 mode cache needs the fp32 ONNX model, not a Q/DQ or fp16 one")
			}
			if s.CalibCache == "" {
				bad("int8 mode cache needs a calibration cache (without one trtexec uses placeholder ranges)")
			}
		case Int8Random:
			if s.ONNXIsQDQ || s.ONNXIsFP16 || s.CalibCache != "" {
				bad("int8 mode random needs the fp32 ONNX model and no calibration cache")
			}
		default:
			bad("unknown int8 mode %q (want qdq, cache or random)", s.Int8Mode)
		}
	case "":
		bad("no precision given (want fp32, fp16 or int8)")
	default:
		bad("unknown precision %q (want fp32, fp16 or int8)", s.Precision)
	}
	if _, err := s.profile(); err != nil {
		errs = append(errs, err)
	}
	if s.WorkspaceMiB < 0 {
		bad("workspace %d MiB is negative", s.WorkspaceMiB)
	}
	if l := s.OptimizationLevel; l != nil && (*l < 0 || *l > MaxOptimizationLevel) {
		bad("builder optimization level %d out of range 0-%d", *l, MaxOptimizationLevel)
	}
	if err := s.HardwareCompat.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, a := range s.ExtraArgs {
		if !strings.HasPrefix(a, "-") {
			bad("extra trtexec argument %q is not a flag", a)
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		for _, f := range kilnFlags {
			if name == f {
				bad("extra trtexec argument %q: kiln sets %s itself", a, f)
			}
		}
	}
	return errors.Join(errs...)
}

// profile is the optimization profile for the dynamic inputs: the values of
// --minShapes, --optShapes and --maxShapes, or empty strings when every
// input is static.
type profileSpec struct{ min, opt, max string }

func (s Spec) profile() (profileSpec, error) {
	var mins, opts, maxs []string
	opt := s.OptBatch
	if opt == 0 {
		opt = s.MaxBatch
	}
	seen := map[string]bool{}
	for _, in := range s.Inputs {
		if err := checkInputName(in.Name); err != nil {
			return profileSpec{}, err
		}
		if seen[in.Name] {
			return profileSpec{}, fmt.Errorf("input %q listed twice", in.Name)
		}
		seen[in.Name] = true
		if len(in.Dims) == 0 || in.Dims[0] != -1 {
			for i, d := range in.Dims {
				if d <= 0 {
					return profileSpec{}, fmt.Errorf("input %q: dimension %d is %d; kiln makes only the first (batch) dimension dynamic", in.Name, i, d)
				}
			}
			continue
		}
		for i, d := range in.Dims[1:] {
			if d <= 0 {
				return profileSpec{}, fmt.Errorf("input %q: dimension %d is %d; kiln makes only the first (batch) dimension dynamic", in.Name, i+1, d)
			}
		}
		if s.MaxBatch <= 0 {
			return profileSpec{}, fmt.Errorf("input %q has a dynamic batch dimension; set a max batch size", in.Name)
		}
		if opt < 1 || opt > s.MaxBatch {
			return profileSpec{}, fmt.Errorf("opt batch %d out of range 1..%d", opt, s.MaxBatch)
		}
		name := shapeName(in.Name)
		mins = append(mins, name+":"+dimsString(1, in.Dims[1:]))
		opts = append(opts, name+":"+dimsString(int64(opt), in.Dims[1:]))
		maxs = append(maxs, name+":"+dimsString(int64(s.MaxBatch), in.Dims[1:]))
	}
	if len(mins) == 0 && s.MaxBatch > 1 {
		return profileSpec{}, fmt.Errorf("max batch %d needs an input with a dynamic first dimension", s.MaxBatch)
	}
	return profileSpec{strings.Join(mins, ","), strings.Join(opts, ","), strings.Join(maxs, ",")}, nil
}

// checkInputName refuses names trtexec's shape parser cannot take: it
// splits the list on ',' and the name from the dims on the quotes or the
// last ':' (samples/common/sampleOptions.cpp splitNameAndValue, 8.x-10.x).
func checkInputName(name string) error {
	switch {
	case name == "":
		return errors.New("input with an empty name")
	case strings.ContainsAny(name, ",'"):
		return fmt.Errorf("input %q: trtexec cannot take shapes for names containing ',' or '\\''", name)
	}
	return nil
}

// shapeName writes an input name for a shape spec. Names containing ':'
// (tf2onnx's "input:0") are wrapped in single quotes, which trtexec strips
// ("Input names can be wrapped with escaped single quotes (ex: 'Input:0')",
// trtexec --help 10.16; the "escaped" is for the shell: kiln passes argv
// directly, so the quotes go in literally). TensorRT 8.0-8.2 split on the
// last ':' and then remove the quotes; 8.4+ take the quoted part as the
// name. Both give "input:0".
func shapeName(name string) string {
	if strings.Contains(name, ":") {
		return "'" + name + "'"
	}
	return name
}

func dimsString(batch int64, rest []int64) string {
	parts := make([]string, 0, len(rest)+1)
	parts = append(parts, strconv.FormatInt(batch, 10))
	for _, d := range rest {
		parts = append(parts, strconv.FormatInt(d, 10))
	}
	return strings.Join(parts, "x")
}
