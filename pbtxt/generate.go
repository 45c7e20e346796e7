package pbtxt

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// DefaultMaxBatchSize is Triton's default for backend-config
// default-max-batch-size: the max_batch_size auto-complete gives a model
// that can batch.
const DefaultMaxBatchSize = 4

// ErrNoBatching is returned when a config asks for batching that the model
// cannot do (no dynamic first dimension).
var ErrNoBatching = errors.New("model does not support batching while non-zero max_batch_size is specified")

// AutofillOptions are the server settings auto-complete depends on.
type AutofillOptions struct {
	// DefaultMaxBatchSize is the max_batch_size given to a model that can
	// batch when the config leaves it 0. Triton's default is 4.
	DefaultMaxBatchSize int
	// GPUs are the GPU ids the server sees; none means a CPU-only server.
	GPUs []int32
	// Normalize also fills what Triton's core adds to every config (version
	// policy, instance groups, default file name, preferred batch size,
	// pinned memory), so the result equals the config Triton reports.
	Normalize bool
}

// Autofill completes c from the model's signature the way Triton's ONNX
// Runtime backend does (AutoCompleteConfig): when inputs or outputs are
// missing it sets max_batch_size (when every tensor has a dynamic first
// dimension), adds dynamic batching, and fills the missing inputs and
// outputs. With opts.Normalize it then applies the core's normalisation.
func Autofill(c *configpb.ModelConfig, modelName string, sig Signature, opts AutofillOptions) error {
	if c.Name == "" {
		c.Name = modelName
	}
	if c.Platform == "" && c.Backend == "" {
		c.Platform, c.Backend = PlatformONNX, BackendONNX
	}
	if c.Backend == "" {
		c.Backend = platformBackend[c.Platform]
	}
	if c.Platform == "" && c.Backend == BackendONNX {
		c.Platform = PlatformONNX
	}
	if len(c.Input) == 0 || len(c.Output) == 0 {
		if ok, why := sig.Batchable(); ok {
			if c.MaxBatchSize == 0 {
				c.MaxBatchSize = int32(max(opts.DefaultMaxBatchSize, 0))
				if c.MaxBatchSize > 1 && c.GetSchedulingChoice() == nil {
					c.SchedulingChoice = &configpb.ModelConfig_DynamicBatching{DynamicBatching: &configpb.ModelDynamicBatching{}}
				}
			}
		} else if c.MaxBatchSize != 0 {
			return fmt.Errorf("autofill failed for model '%s': %w (%s); set max_batch_size: 0", c.Name, ErrNoBatching, why)
		}
		var err error
		if c.Input, err = fillIO(c.Input, sig.Inputs, c.MaxBatchSize, newInput); err != nil {
			return fmt.Errorf("autofill failed for model '%s': %w", c.Name, err)
		}
		if c.Output, err = fillIO(c.Output, sig.Outputs, c.MaxBatchSize, newOutput); err != nil {
			return fmt.Errorf("autofill failed for model '%s': %w", c.Name, err)
		}
	}
	if opts.Normalize {
		Normalize(c, opts.GPUs)
	}
	return nil
}

// ioEntry abstracts ModelInput and ModelOutput for auto-complete.
type ioEntry interface {
	GetName() string
	GetDataType() configpb.DataType
	GetDims() []int64
	set(dt configpb.DataType, dims []int64, reshape *configpb.ModelTensorReshape)
}

type inEntry struct{ *configpb.ModelInput }

func (e inEntry) set(dt configpb.DataType, dims []int64, r *configpb.ModelTensorReshape) {
	if e.DataType == configpb.DataType_TYPE_INVALID {
		e.DataType = dt
	}
	if len(e.Dims) == 0 {
		e.Dims, e.Reshape = dims, r
	}
}

type outEntry struct{ *configpb.ModelOutput }

func (e outEntry) set(dt configpb.DataType, dims []int64, r *configpb.ModelTensorReshape) {
	if e.DataType == configpb.DataType_TYPE_INVALID {
		e.DataType = dt
	}
	if len(e.Dims) == 0 {
		e.Dims, e.Reshape = dims, r
	}
}

func newInput(name string) (*configpb.ModelInput, ioEntry) {
	in := &configpb.ModelInput{Name: name}
	return in, inEntry{in}
}

func newOutput(name string) (*configpb.ModelOutput, ioEntry) {
	out := &configpb.ModelOutput{Name: name}
	return out, outEntry{out}
}

// fillIO completes the listed tensors from the signature, and lists every
// tensor of the signature when none was listed.
func fillIO[T interface{ GetName() string }](list []T, sig []TensorSig, mbs int32, mk func(string) (T, ioEntry)) ([]T, error) {
	listed := map[string]int{}
	for i, e := range list {
		listed[e.GetName()] = i
	}
	empty := len(list) == 0
	for _, t := range sig {
		var entry ioEntry
		if i, ok := listed[t.Name]; ok {
			entry = wrap(any(list[i]))
		} else if empty {
			var e T
			e, entry = mk(t.Name)
			list = append(list, e)
		} else {
			continue
		}
		if t.Unranked {
			if len(entry.GetDims()) == 0 {
				return nil, fmt.Errorf("tensor %q has no known rank; list it with explicit dims", t.Name)
			}
			entry.set(t.DataType, nil, nil)
			continue
		}
		dims := append([]int64(nil), t.Shape...)
		if mbs > 0 {
			dims = dims[1:]
		}
		var reshape *configpb.ModelTensorReshape
		if len(dims) == 0 {
			if mbs == 0 {
				return nil, &ScalarError{Tensor: t.Name}
			}
			dims, reshape = []int64{1}, &configpb.ModelTensorReshape{}
		}
		entry.set(t.DataType, dims, reshape)
	}
	return list, nil
}

func wrap(e any) ioEntry {
	if in, ok := e.(*configpb.ModelInput); ok {
		return inEntry{in}
	}
	return outEntry{e.(*configpb.ModelOutput)}
}

// Normalize fills the defaults Triton's core adds to every config
// (NormalizeModelConfig, NormalizeInstanceGroup): version policy latest 1,
// default model file name, preferred batch size max_batch_size, pinned
// memory on, and instance groups resolved against the visible GPUs.
func Normalize(c *configpb.ModelConfig, gpus []int32) {
	if c.VersionPolicy == nil {
		c.VersionPolicy = &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_Latest_{Latest: &configpb.ModelVersionPolicy_Latest{NumVersions: 1}}}
	}
	if isEnsemble(c) {
		return
	}
	if c.DefaultModelFilename == "" {
		c.DefaultModelFilename = DefaultModelFilename(c)
	}
	if db := c.GetDynamicBatching(); db != nil && len(db.PreferredBatchSize) == 0 && c.MaxBatchSize > 0 {
		db.PreferredBatchSize = []int32{c.MaxBatchSize}
	}
	if c.Optimization == nil {
		c.Optimization = &configpb.ModelOptimizationPolicy{}
	}
	if c.Optimization.InputPinnedMemory == nil {
		c.Optimization.InputPinnedMemory = &configpb.ModelOptimizationPolicy_PinnedMemoryBuffer{Enable: true}
	}
	if c.Optimization.OutputPinnedMemory == nil {
		c.Optimization.OutputPinnedMemory = &configpb.ModelOptimizationPolicy_PinnedMemoryBuffer{Enable: true}
	}
	if len(c.InstanceGroup) == 0 {
		c.InstanceGroup = []*configpb.ModelInstanceGroup{{Name: c.Name}}
	}
	supported := map[int32]bool{}
	for _, g := range gpus {
		supported[g] = true
	}
	for i, g := range c.InstanceGroup {
		if g.Name == "" {
			g.Name = c.Name + "_" + strconv.Itoa(i)
		}
		if g.Kind == configpb.ModelInstanceGroup_KIND_AUTO {
			g.Kind = configpb.ModelInstanceGroup_KIND_GPU
			if len(gpus) == 0 {
				g.Kind = configpb.ModelInstanceGroup_KIND_CPU
			}
			for _, id := range g.Gpus {
				if !supported[id] {
					g.Kind = configpb.ModelInstanceGroup_KIND_CPU
				}
			}
		}
		if g.Kind == configpb.ModelInstanceGroup_KIND_GPU && len(g.Gpus) == 0 {
			g.Gpus = append([]int32(nil), gpus...)
			sort.Slice(g.Gpus, func(a, b int) bool { return g.Gpus[a] < g.Gpus[b] })
		}
		if g.Count < 1 {
			g.Count = 1
			if b := BackendOf(c); g.Kind == configpb.ModelInstanceGroup_KIND_CPU && (b == BackendONNX || b == BackendTensorFlow) {
				g.Count = 2
			}
		}
	}
}

// GenerateOptions are kiln's choices for a generated config. The zero value
// gives what Triton's auto-complete would give, written out.
type GenerateOptions struct {
	Name     string // model name; required
	Platform string // default onnxruntime_onnx
	// MaxBatchSize 0 picks DefaultMaxBatchSize when the model can batch and 0
	// otherwise; -1 turns batching off.
	MaxBatchSize int
	// PreferredBatchSizes and MaxQueueDelayMicros configure dynamic batching.
	PreferredBatchSizes []int32
	MaxQueueDelayMicros uint64
	NoDynamicBatching   bool // do not add dynamic_batching to a batching model
	// Instance group: Count instances of Kind ("" or "auto", "gpu", "cpu",
	// "model") on GPUs (all GPUs when empty).
	InstanceCount int
	InstanceKind  string
	InstanceGPUs  []int32
	// LabelsFile is the label file name for LabelOutput (default: the only
	// output) for classification outputs.
	LabelsFile  string
	LabelOutput string
	// Version policy: LatestVersions > 0, AllVersions, or SpecificVersions.
	LatestVersions   uint32
	AllVersions      bool
	SpecificVersions []int64
	// Warmup is "", "zero" or "random": one warmup sample of WarmupBatchSize
	// (default 1) feeding every input.
	Warmup          string
	WarmupBatchSize uint32
	// TensorRTAccelerator runs an ONNX model through ONNX Runtime's TensorRT
	// execution provider with TensorRTPrecision ("FP32", "FP16", "INT8") and
	// TensorRTWorkspaceBytes (0 = backend default).
	TensorRTAccelerator    bool
	TensorRTPrecision      string
	TensorRTWorkspaceBytes int64
	ResponseCache          bool
	Parameters             map[string]string
	// Complete writes every default Triton would fill in (see Normalize),
	// resolving instance groups against GPUs.
	Complete bool
	GPUs     []int32
}

var instanceKinds = map[string]configpb.ModelInstanceGroup_Kind{
	"": configpb.ModelInstanceGroup_KIND_AUTO, "auto": configpb.ModelInstanceGroup_KIND_AUTO,
	"gpu": configpb.ModelInstanceGroup_KIND_GPU, "cpu": configpb.ModelInstanceGroup_KIND_CPU,
	"model": configpb.ModelInstanceGroup_KIND_MODEL,
}

// Validate checks the options on their own.
func (o GenerateOptions) Validate() error {
	var errs []error
	if o.Name == "" {
		errs = append(errs, errors.New("a model name is required"))
	}
	if _, ok := platformBackend[o.Platform]; o.Platform != "" && (!ok || o.Platform == PlatformEnsemble) {
		errs = append(errs, fmt.Errorf("platform %q cannot be generated from a model file; use %s or %s", o.Platform, PlatformONNX, PlatformTensorRT))
	}
	if o.MaxBatchSize < -1 {
		errs = append(errs, fmt.Errorf("max batch size %d: use a positive number, 0 for automatic or -1 for no batching", o.MaxBatchSize))
	}
	if _, ok := instanceKinds[strings.ToLower(o.InstanceKind)]; !ok {
		errs = append(errs, fmt.Errorf("instance kind %q: use auto, gpu, cpu or model", o.InstanceKind))
	}
	if o.InstanceCount < 0 {
		errs = append(errs, fmt.Errorf("instance count %d must not be negative", o.InstanceCount))
	}
	if o.Warmup != "" && o.Warmup != "zero" && o.Warmup != "random" {
		errs = append(errs, fmt.Errorf("warmup %q: use zero or random", o.Warmup))
	}
	if n := btoi(o.LatestVersions > 0) + btoi(o.AllVersions) + btoi(len(o.SpecificVersions) > 0); n > 1 {
		errs = append(errs, errors.New("choose one version policy: latest, all or specific"))
	}
	if p := strings.ToUpper(o.TensorRTPrecision); p != "" && p != "FP32" && p != "FP16" && p != "INT8" {
		errs = append(errs, fmt.Errorf("TensorRT precision %q: use FP32, FP16 or INT8", o.TensorRTPrecision))
	}
	if (o.TensorRTPrecision != "" || o.TensorRTWorkspaceBytes != 0) && !o.TensorRTAccelerator {
		errs = append(errs, errors.New("TensorRT precision and workspace need the TensorRT accelerator to be enabled"))
	}
	if o.TensorRTAccelerator && o.Platform == PlatformTensorRT {
		errs = append(errs, errors.New("the TensorRT accelerator is for ONNX models; a TensorRT plan already runs on TensorRT"))
	}
	return errors.Join(errs...)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Generate builds a config for a model with signature sig. Batch detection
// follows ONNX Runtime's auto-complete. The result is validated (also
// against sig); a config that Triton would refuse is returned as an error.
func Generate(sig Signature, o GenerateOptions) (*configpb.ModelConfig, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &configpb.ModelConfig{Name: o.Name, Platform: o.Platform}
	if c.Platform == "" {
		c.Platform = PlatformONNX
	}
	c.Backend = platformBackend[c.Platform]
	switch {
	case o.MaxBatchSize > 0:
		c.MaxBatchSize = int32(o.MaxBatchSize)
	case o.MaxBatchSize == 0:
		if ok, _ := sig.Batchable(); ok {
			c.MaxBatchSize = DefaultMaxBatchSize
		}
	}
	if c.MaxBatchSize > 1 && !o.NoDynamicBatching {
		c.SchedulingChoice = &configpb.ModelConfig_DynamicBatching{DynamicBatching: &configpb.ModelDynamicBatching{
			PreferredBatchSize:        o.PreferredBatchSizes,
			MaxQueueDelayMicroseconds: o.MaxQueueDelayMicros,
		}}
	} else if len(o.PreferredBatchSizes) > 0 || o.MaxQueueDelayMicros > 0 {
		return nil, fmt.Errorf("dynamic batching options need max_batch_size > 1 (the model's is %d)", c.MaxBatchSize)
	}
	var err error
	if c.Input, err = fillIO(c.Input, sig.Inputs, c.MaxBatchSize, newInput); err != nil {
		return nil, fmt.Errorf("generating config for %s: %w", o.Name, err)
	}
	if c.Output, err = fillIO(c.Output, sig.Outputs, c.MaxBatchSize, newOutput); err != nil {
		return nil, fmt.Errorf("generating config for %s: %w", o.Name, err)
	}
	if err := o.apply(c); err != nil {
		return nil, fmt.Errorf("generating config for %s: %w", o.Name, err)
	}
	if o.Complete {
		Normalize(c, o.GPUs)
	}
	ps := append(Validate(c, ValidateOptions{Autofill: false}), CheckSignature(c, sig)...)
	if errs := ps.Errors(); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, p := range errs {
			msgs[i] = p.String()
		}
		return nil, fmt.Errorf("generated config for %s is not valid: %s", o.Name, strings.Join(msgs, "; "))
	}
	return c, nil
}

// apply adds the deployment options to c.
func (o GenerateOptions) apply(c *configpb.ModelConfig) error {
	kind := instanceKinds[strings.ToLower(o.InstanceKind)]
	if o.InstanceCount > 0 || kind != configpb.ModelInstanceGroup_KIND_AUTO || len(o.InstanceGPUs) > 0 {
		c.InstanceGroup = []*configpb.ModelInstanceGroup{{Kind: kind, Count: int32(o.InstanceCount), Gpus: o.InstanceGPUs}}
	}
	if o.LabelsFile != "" {
		target := o.LabelOutput
		if target == "" {
			if len(c.Output) != 1 {
				return fmt.Errorf("the model has %d outputs; say which one the labels file %s belongs to", len(c.Output), o.LabelsFile)
			}
			target = c.Output[0].Name
		}
		found := false
		for _, out := range c.Output {
			if out.Name == target {
				out.LabelFilename, found = o.LabelsFile, true
			}
		}
		if !found {
			return fmt.Errorf("labels output %q is not an output of the model (%s)", target, outputNames(c))
		}
	}
	switch {
	case o.LatestVersions > 0:
		c.VersionPolicy = &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_Latest_{Latest: &configpb.ModelVersionPolicy_Latest{NumVersions: o.LatestVersions}}}
	case o.AllVersions:
		c.VersionPolicy = &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_All_{All: &configpb.ModelVersionPolicy_All{}}}
	case len(o.SpecificVersions) > 0:
		c.VersionPolicy = &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_Specific_{Specific: &configpb.ModelVersionPolicy_Specific{Versions: o.SpecificVersions}}}
	}
	if o.Warmup != "" {
		w := &configpb.ModelWarmup{Name: "kiln_" + o.Warmup, BatchSize: max(o.WarmupBatchSize, 1), Inputs: map[string]*configpb.ModelWarmup_Input{}}
		for _, in := range c.Input {
			wi := &configpb.ModelWarmup_Input{DataType: in.DataType}
			for _, d := range in.Dims {
				if d == WildcardDim {
					d = 1
				}
				wi.Dims = append(wi.Dims, d)
			}
			if o.Warmup == "random" {
				wi.InputDataType = &configpb.ModelWarmup_Input_RandomData{RandomData: true}
			} else {
				wi.InputDataType = &configpb.ModelWarmup_Input_ZeroData{ZeroData: true}
			}
			w.Inputs[in.Name] = wi
		}
		c.ModelWarmup = []*configpb.ModelWarmup{w}
	}
	if o.TensorRTAccelerator {
		a := &configpb.ModelOptimizationPolicy_ExecutionAccelerators_Accelerator{Name: "tensorrt", Parameters: map[string]string{}}
		if o.TensorRTPrecision != "" {
			a.Parameters["precision_mode"] = strings.ToUpper(o.TensorRTPrecision)
		}
		if o.TensorRTWorkspaceBytes > 0 {
			a.Parameters["max_workspace_size_bytes"] = strconv.FormatInt(o.TensorRTWorkspaceBytes, 10)
		}
		c.Optimization = &configpb.ModelOptimizationPolicy{ExecutionAccelerators: &configpb.ModelOptimizationPolicy_ExecutionAccelerators{
			GpuExecutionAccelerator: []*configpb.ModelOptimizationPolicy_ExecutionAccelerators_Accelerator{a},
		}}
	}
	if o.ResponseCache {
		c.ResponseCache = &configpb.ModelResponseCache{Enable: true}
	}
	if len(o.Parameters) > 0 {
		c.Parameters = map[string]*configpb.ModelParameter{}
		for k, val := range o.Parameters {
			c.Parameters[k] = &configpb.ModelParameter{StringValue: val}
		}
	}
	return nil
}

func outputNames(c *configpb.ModelConfig) string {
	m := map[string]bool{}
	for _, out := range c.Output {
		m[out.Name] = true
	}
	return joinKeys(m)
}

// Clone returns a deep copy of c.
func Clone(c *configpb.ModelConfig) *configpb.ModelConfig {
	return proto.Clone(c).(*configpb.ModelConfig)
}

// ScalarError says that a model without batching has a scalar input or
// output, which Triton cannot describe (dims may not be empty, and only a
// batching model can reshape [1] to a scalar).
type ScalarError struct {
	Tensor string
}

func (e *ScalarError) Error() string {
	return fmt.Sprintf("tensor %q is a scalar; Triton serves scalars only with max_batch_size > 0", e.Tensor)
}
