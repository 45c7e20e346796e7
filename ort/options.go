package ort

import (
	"errors"
	"fmt"
	"strings"

	ortgo "github.com/yalue/onnxruntime_go"
)

// OptLevel is ONNX Runtime's graph optimization level. The zero value is
// OptAll, ONNX Runtime's own default.
type OptLevel int

// Graph optimization levels.
const (
	// OptAll enables every optimization, including layout changes and
	// Microsoft-only fused operators (an optimized model written at this level
	// runs only on ONNX Runtime with the same provider).
	OptAll OptLevel = iota
	// OptDisabled runs the graph as written.
	OptDisabled
	// OptBasic applies semantics-preserving rewrites (constant folding,
	// redundant node removal); a model written at this level stays portable.
	OptBasic
	// OptExtended adds complex node fusions.
	OptExtended
)

var optNames = map[OptLevel]string{OptAll: "all", OptDisabled: "disabled", OptBasic: "basic", OptExtended: "extended"}

// String returns "all", "disabled", "basic" or "extended".
func (l OptLevel) String() string {
	if s, ok := optNames[l]; ok {
		return s
	}
	return fmt.Sprintf("OptLevel(%d)", int(l))
}

// ParseOptLevel accepts the names printed by String, "none", and the numbers
// 0 (disabled), 1 (basic), 2 (extended), 3 or 99 (all).
func ParseOptLevel(s string) (OptLevel, error) {
	switch strings.ToLower(s) {
	case "all", "3", "99":
		return OptAll, nil
	case "disabled", "disable", "none", "0":
		return OptDisabled, nil
	case "basic", "1":
		return OptBasic, nil
	case "extended", "2":
		return OptExtended, nil
	}
	return OptAll, fmt.Errorf("unknown optimization level %q (want disabled, basic, extended or all)", s)
}

func (l OptLevel) binding() ortgo.GraphOptimizationLevel {
	switch l {
	case OptDisabled:
		return ortgo.GraphOptimizationLevelDisableAll
	case OptBasic:
		return ortgo.GraphOptimizationLevelEnableBasic
	case OptExtended:
		return ortgo.GraphOptimizationLevelEnableExtended
	}
	return ortgo.GraphOptimizationLevelEnableAll
}

// Provider names an ONNX Runtime execution provider. The zero value means
// ProviderCPU.
type Provider string

// Execution providers kiln uses.
const (
	ProviderCPU      Provider = "cpu"
	ProviderCUDA     Provider = "cuda"
	ProviderTensorRT Provider = "tensorrt"
)

func (p Provider) orDefault() Provider {
	if p == "" {
		return ProviderCPU
	}
	return p
}

// SessionOptions configures a session. The zero value runs on the CPU with
// ONNX Runtime's default thread pools and every graph optimization.
type SessionOptions struct {
	// IntraOpThreads sizes the pool that parallelizes one operator; 0 lets
	// ONNX Runtime choose (one per physical core).
	IntraOpThreads int
	// InterOpThreads sizes the pool that runs independent operators in
	// parallel; 0 lets ONNX Runtime choose.
	InterOpThreads int
	// OptLevel is the graph optimization level (zero value: OptAll).
	OptLevel OptLevel
	// Provider is the execution provider (zero value: ProviderCPU). ONNX
	// Runtime places nodes a GPU provider cannot run on the CPU.
	Provider Provider
	// DeviceID selects the GPU for ProviderCUDA and ProviderTensorRT.
	DeviceID int
	// InferOutputShapes makes the session ask ONNX Runtime, when it opens,
	// for the shapes it infers for the outputs, so that the first run
	// writes its outputs straight into Go memory as later runs do (see
	// infer.go). It costs a second load of the model; it pays for models
	// that fetch large intermediate tensors.
	InferOutputShapes bool
	// NoSpinning stops ONNX Runtime's threads from spinning while they
	// wait for work (session.intra_op.allow_spinning and
	// session.inter_op.allow_spinning set to 0): they sleep instead,
	// leaving the CPUs to other work of the same process between and
	// within runs, such as calibration's histograms.
	NoSpinning bool
	// OptimizedModelPath, when set, makes ONNX Runtime write the model after
	// graph optimization to this file. Use OptBasic for a portable model.
	OptimizedModelPath string
	// NoCPUArena turns off ONNX Runtime's CPU memory arena for the session
	// (DisableCpuMemArena): its intermediate tensors are allocated and freed
	// run by run instead of being kept in an arena that only grows, sized
	// by the largest run, for the life of the session. It changes memory,
	// never results; it pays where several sessions are open at once or one
	// run's tensors are large.
	NoCPUArena bool `json:",omitempty"`
	// DisabledOptimizers names ONNX Runtime graph transformers the session
	// leaves out (optimization.disable_specified_optimizers), such as
	// NoNCHWc's "NchwcTransformer". ONNX Runtime 1.24 ignores a name it
	// does not know, without an error (TestNoNCHWc checks NoNCHWc's).
	// Both are left out of the options' JSON when unset, so that the
	// calibration cache keys of configs without them (calibrate.RunCached)
	// are those from before they existed.
	DisabledOptimizers []string `json:",omitempty"`
}

// NoNCHWc is the transformer that rewrites a CPU session's float32 Conv
// nodes into ONNX Runtime's blocked NCHWc layout at OptAll. A tensor it
// rewrites that is also fetched is then alive twice during a run: the
// blocked one the next node reads and the plain copy made for the output.
const NoNCHWc = "NchwcTransformer"

// Validate checks the options without loading ONNX Runtime.
func (o SessionOptions) Validate() error {
	var errs []error
	if o.IntraOpThreads < 0 {
		errs = append(errs, fmt.Errorf("intra-op threads %d is negative", o.IntraOpThreads))
	}
	if o.InterOpThreads < 0 {
		errs = append(errs, fmt.Errorf("inter-op threads %d is negative", o.InterOpThreads))
	}
	for _, name := range o.DisabledOptimizers {
		if name == "" || strings.ContainsAny(name, ", ") {
			errs = append(errs, fmt.Errorf("disabled optimizer %q: want one transformer name", name))
		}
	}
	if _, ok := optNames[o.OptLevel]; !ok {
		errs = append(errs, fmt.Errorf("unknown optimization level %d", int(o.OptLevel)))
	}
	switch o.Provider.orDefault() {
	case ProviderCPU:
		if o.DeviceID != 0 {
			errs = append(errs, fmt.Errorf("device ID %d given for the cpu provider", o.DeviceID))
		}
	case ProviderCUDA, ProviderTensorRT:
		if o.DeviceID < 0 {
			errs = append(errs, fmt.Errorf("device ID %d is negative", o.DeviceID))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown execution provider %q (want cpu, cuda or tensorrt)", string(o.Provider)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid session options: %w", err)
	}
	return nil
}

// ProviderUnavailableError is returned when the loaded library cannot use
// the requested execution provider: a CPU-only build, or a GPU build whose
// CUDA/TensorRT libraries or device are missing.
type ProviderUnavailableError struct {
	Provider Provider
	Err      error // ONNX Runtime's own message
}

func (e *ProviderUnavailableError) Error() string {
	name := map[Provider]string{ProviderCUDA: "CUDA", ProviderTensorRT: "TensorRT"}[e.Provider]
	if name == "" {
		name = string(e.Provider)
	}
	return fmt.Sprintf("this ONNX Runtime library has no usable %s execution provider; point --ort-lib at a GPU build (ONNX Runtime: %v)", name, e.Err)
}

func (e *ProviderUnavailableError) Unwrap() error { return e.Err }

// binding builds the binding's session options; the caller destroys them.
func (o SessionOptions) binding() (*ortgo.SessionOptions, error) {
	so, err := ortgo.NewSessionOptions()
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			so.Destroy()
		}
	}()
	if o.IntraOpThreads > 0 {
		if err := so.SetIntraOpNumThreads(o.IntraOpThreads); err != nil {
			return nil, fmt.Errorf("setting intra-op threads: %w", err)
		}
	}
	if o.InterOpThreads > 0 {
		if err := so.SetInterOpNumThreads(o.InterOpThreads); err != nil {
			return nil, fmt.Errorf("setting inter-op threads: %w", err)
		}
	}
	if o.NoSpinning {
		for _, key := range []string{"session.intra_op.allow_spinning", "session.inter_op.allow_spinning"} {
			if err := so.AddSessionConfigEntry(key, "0"); err != nil {
				return nil, fmt.Errorf("setting %s: %w", key, err)
			}
		}
	}
	if err := so.SetGraphOptimizationLevel(o.OptLevel.binding()); err != nil {
		return nil, fmt.Errorf("setting optimization level: %w", err)
	}
	if o.NoCPUArena {
		if err := so.SetCpuMemArena(false); err != nil {
			return nil, fmt.Errorf("turning off the CPU memory arena: %w", err)
		}
	}
	if len(o.DisabledOptimizers) > 0 {
		if err := so.AddSessionConfigEntry("optimization.disable_specified_optimizers", strings.Join(o.DisabledOptimizers, ",")); err != nil {
			return nil, fmt.Errorf("disabling optimizers %s: %w", strings.Join(o.DisabledOptimizers, ", "), err)
		}
	}
	if o.OptimizedModelPath != "" {
		if err := so.SetOptimizedModelFilePath(o.OptimizedModelPath); err != nil {
			return nil, fmt.Errorf("setting optimized model path: %w", err)
		}
	}
	switch o.Provider.orDefault() {
	case ProviderTensorRT:
		if err := appendTensorRT(so, o.DeviceID); err != nil {
			return nil, &ProviderUnavailableError{Provider: ProviderTensorRT, Err: err}
		}
		// TensorRT hands the nodes it cannot build to CUDA, then the CPU.
		if err := appendCUDA(so, o.DeviceID); err != nil {
			return nil, &ProviderUnavailableError{Provider: ProviderCUDA, Err: err}
		}
	case ProviderCUDA:
		if err := appendCUDA(so, o.DeviceID); err != nil {
			return nil, &ProviderUnavailableError{Provider: ProviderCUDA, Err: err}
		}
	}
	ok = true
	return so, nil
}

func appendCUDA(so *ortgo.SessionOptions, device int) error {
	opts, err := ortgo.NewCUDAProviderOptions()
	if err != nil {
		return err
	}
	defer opts.Destroy()
	if err := opts.Update(map[string]string{"device_id": fmt.Sprint(device)}); err != nil {
		return err
	}
	return so.AppendExecutionProviderCUDA(opts)
}

func appendTensorRT(so *ortgo.SessionOptions, device int) error {
	opts, err := ortgo.NewTensorRTProviderOptions()
	if err != nil {
		return err
	}
	defer opts.Destroy()
	if err := opts.Update(map[string]string{"device_id": fmt.Sprint(device)}); err != nil {
		return err
	}
	return so.AppendExecutionProviderTensorRT(opts)
}
