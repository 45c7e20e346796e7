package pbtxt

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// WildcardDim is the dimension value that means "any size".
const WildcardDim = -1

// ValidateOptions tell Validate what is known about where the config lives.
type ValidateOptions struct {
	// DirName is the name of the model directory holding the config; when
	// set, a non-empty name in the config must equal it.
	DirName string
	// GPUs is the number of GPUs on the machine that will serve the model;
	// 0 means unknown, and then only negative GPU ids are reported.
	GPUs int
	// Autofill says Triton's auto-complete will run (the default for
	// tritonserver). Without it a config must name its platform or backend
	// and list every input and output.
	Autofill bool
}

// Validate checks a config on its own, without the model file or the other
// models of the repository, with the rules of Triton's core
// (model_config_utils.cc ValidateModelConfig, ValidateIOShape,
// ValidateInstanceGroup, the scheduler checks and the ensemble graph).
func Validate(c *configpb.ModelConfig, opts ValidateOptions) Problems {
	v := &validator{c: c, opts: opts}
	v.names()
	v.platform()
	if c.GetMaxBatchSize() < 0 {
		v.errorf("max_batch_size", "'max_batch_size' must be non-negative, got %d; use 0 for a model that does not batch", c.GetMaxBatchSize())
	}
	v.versionPolicy()
	v.ios()
	v.batchIO()
	v.dynamicBatching()
	v.sequenceBatching()
	v.ensemble()
	v.instanceGroups()
	v.warmup()
	v.optimization()
	v.misc()
	return v.ps
}

type validator struct {
	collector
	c    *configpb.ModelConfig
	opts ValidateOptions
}

func (v *validator) modelName() string {
	if n := v.c.GetName(); n != "" {
		return n
	}
	return v.opts.DirName
}

func (v *validator) names() {
	name := v.c.GetName()
	switch {
	case name == "" && v.opts.DirName == "":
		v.warnf("name", "'name' is not set; Triton takes it from the model directory")
	case name != "" && v.opts.DirName != "" && name != v.opts.DirName:
		v.errorf("name", "model name %q does not match its directory %q; set name: %q or rename the directory", name, v.opts.DirName, v.opts.DirName)
	}
	if n := v.modelName(); n == "." || n == ".." || strings.ContainsAny(n, `/\`) {
		v.errorf("name", "model name %q cannot be used as a directory name; use letters, digits, '_', '-' and '.'", n)
	}
}

func (v *validator) platform() {
	c := v.c
	p, b := c.GetPlatform(), c.GetBackend()
	if p != "" {
		want, known := platformBackend[p]
		switch {
		case !known:
			msg := fmt.Sprintf("unknown platform %q", p)
			if s := closest(p, Platforms()); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			} else {
				msg += "; use one of " + strings.Join(Platforms(), ", ") + ", or set only 'backend'"
			}
			v.errorf("platform", "%s", msg)
		case b != "" && b != want:
			v.errorf("backend", "unexpected 'platform' and 'backend' pair: platform %q is served by backend %q, not %q", p, want, b)
		}
	}
	if p == "" && b == "" {
		if v.opts.Autofill {
			v.warnf("platform", "neither 'platform' nor 'backend' is set; Triton must guess the backend from the model file, so set backend explicitly")
		} else {
			v.errorf("platform", "neither 'platform' nor 'backend' is set; Triton could not determine the backend for model %q (set backend, e.g. backend: %q)", v.modelName(), BackendONNX)
		}
	}
	if p == PlatformEnsemble && b != "" {
		v.errorf("backend", "an ensemble has no backend; remove backend: %q", b)
	}
	if rt := c.GetRuntime(); rt != "" {
		if strings.Contains(rt, "..") || strings.ContainsAny(rt, `/\`) {
			v.errorf("runtime", "backend library name '%s' escapes the backend directory; give a file name such as \"libtriton_%s.so\" or \"model.py\"", rt, BackendOf(c))
		} else if !strings.HasSuffix(rt, ".so") && !strings.HasSuffix(rt, ".py") && !strings.HasSuffix(rt, ".dll") {
			v.warnf("runtime", "runtime %q is neither a backend shared library (.so) nor a Python backend file (.py); Triton will not find it", rt)
		}
	}
	if f := c.GetDefaultModelFilename(); f != "" && (path.Base(f) != f || f == "." || f == "..") {
		v.errorf("default_model_filename", "default_model_filename %q must be a file name inside the version directory, without '/'", f)
	}
}

func (v *validator) versionPolicy() {
	vp := v.c.GetVersionPolicy()
	switch {
	case vp == nil:
	case vp.GetLatest() != nil:
		if vp.GetLatest().GetNumVersions() == 0 {
			v.errorf("version_policy.latest.num_versions", "num_versions must be at least 1, or Triton loads no version at all")
		}
	case vp.GetSpecific() != nil:
		vs := vp.GetSpecific().GetVersions()
		if len(vs) == 0 {
			v.errorf("version_policy.specific.versions", "a specific version policy must list at least one version")
		}
		seen := map[int64]bool{}
		for i, ver := range vs {
			if ver < 0 {
				v.errorf(at("version_policy.specific.versions", i), "version %d is negative; versions are directory numbers 1, 2, ...", ver)
			}
			if seen[ver] {
				v.warnf(at("version_policy.specific.versions", i), "version %d is listed twice", ver)
			}
			seen[ver] = true
		}
	case vp.GetAll() == nil:
		v.errorf("version_policy", "version_policy is empty; set latest { num_versions: 1 }, all { } or specific { versions: [...] }")
	}
}

// ios checks inputs and outputs (ValidateIOShape and the per-input rules).
func (v *validator) ios() {
	c := v.c
	mbs := c.GetMaxBatchSize()
	if !v.opts.Autofill && !isEnsemble(c) {
		if len(c.GetInput()) == 0 {
			v.errorf("input", "no inputs are listed; without auto-complete every model input must be listed")
		}
		if len(c.GetOutput()) == 0 {
			v.errorf("output", "no outputs are listed; without auto-complete at least one output must be listed")
		}
	}
	seen := map[string]string{}
	for i, in := range c.GetInput() {
		p := at("input", i)
		v.ioShape(p, "input", in.GetName(), in.GetDataType(), in.GetDims(), in.GetReshape(), mbs)
		v.unique(seen, p, "input", in.GetName())
		if f := in.GetFormat(); f == configpb.ModelInput_FORMAT_NHWC || f == configpb.ModelInput_FORMAT_NCHW {
			if len(in.GetDims()) != 3 {
				v.errorf(p+".dims", "model input '%s' has format %s, which requires exactly 3 dims (without the batch dimension), got %d", in.GetName(), f, len(in.GetDims()))
			}
		}
		if in.GetIsShapeTensor() && !isTensorRT(c) {
			v.errorf(p+".is_shape_tensor", "model input '%s': shape tensors are only supported by the TensorRT platform; remove is_shape_tensor", in.GetName())
		}
		if in.GetIsNonLinearFormatIo() && !isTensorRT(c) {
			v.errorf(p+".is_non_linear_format_io", "model input '%s': non-linear IO formats are only supported by the TensorRT platform", in.GetName())
		}
		if in.GetOptional() && mbs != 0 && BackendOf(c) == BackendONNX {
			v.errorf(p+".optional", "optional input '%s' is not supported by the ONNX Runtime backend for models that support batching; set max_batch_size: 0 or make the input required", in.GetName())
		}
		if in.GetAllowRaggedBatch() && mbs == 0 {
			v.warnf(p+".allow_ragged_batch", "allow_ragged_batch has no effect when max_batch_size is 0")
		}
	}
	seen = map[string]string{}
	for i, out := range c.GetOutput() {
		p := at("output", i)
		v.ioShape(p, "output", out.GetName(), out.GetDataType(), out.GetDims(), out.GetReshape(), mbs)
		v.unique(seen, p, "output", out.GetName())
		if out.GetIsShapeTensor() && !isTensorRT(c) {
			v.errorf(p+".is_shape_tensor", "model output '%s': shape tensors are only supported by the TensorRT platform; remove is_shape_tensor", out.GetName())
		}
		if out.GetIsNonLinearFormatIo() && !isTensorRT(c) {
			v.errorf(p+".is_non_linear_format_io", "model output '%s': non-linear IO formats are only supported by the TensorRT platform", out.GetName())
		}
		if lf := out.GetLabelFilename(); lf != "" && (path.Base(lf) != lf || lf == "." || lf == "..") {
			v.errorf(p+".label_filename", "label_filename %q must be a file name in the model directory, without '/'", lf)
		}
	}
}

func (v *validator) unique(seen map[string]string, p, kind, name string) {
	if name == "" {
		return
	}
	if prev, ok := seen[name]; ok {
		v.errorf(p+".name", "model %s '%s' is already declared at %s; names must be unique", kind, name, prev)
		return
	}
	seen[name] = p
}

// ioShape is Triton's ValidateIOShape.
func (v *validator) ioShape(p, kind, name string, dt configpb.DataType, dims []int64, reshape *configpb.ModelTensorReshape, mbs int32) {
	if name == "" {
		v.errorf(p+".name", "model %s must specify 'name'", kind)
		name = p
	}
	if dt == configpb.DataType_TYPE_INVALID {
		v.errorf(p+".data_type", "model %s '%s' must specify 'data_type' (TYPE_FP32, TYPE_INT64, ...)", kind, name)
	}
	if len(dims) == 0 {
		v.errorf(p+".dims", "model %s '%s' must specify 'dims'; for a scalar use dims: [ 1 ] with reshape { shape: [ ] } and max_batch_size > 0", kind, name)
	}
	if reshape != nil && len(reshape.GetShape()) == 0 && mbs == 0 {
		v.errorf(p+".reshape", "model %s '%s' cannot have empty reshape for non-batching model as scalar tensors are not supported; use reshape { shape: [ 1 ] } or max_batch_size > 0", kind, name)
	}
	for i, d := range dims {
		if d < 1 && d != WildcardDim {
			v.errorf(at(p+".dims", i), "model %s '%s' dimension must be integer >= 1, or -1 to indicate a variable-size dimension; got %d", kind, name, d)
		}
	}
	if reshape == nil {
		return
	}
	shape := reshape.GetShape()
	bad := false
	for i, d := range shape {
		if d < 1 && d != WildcardDim {
			v.errorf(at(p+".reshape.shape", i), "model %s '%s' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension; got %d", kind, name, d)
			bad = true
		}
	}
	if bad || len(dims) == 0 {
		return
	}
	dn, rn := elementCount(dims), elementCount(shape)
	if dn != rn && (rn != 0 || dn != 1) {
		v.errorf(p+".reshape", "model %s '%s' has different size for dims and reshape: dims %s has %s elements but reshape %s has %s",
			kind, name, dimsString(dims), countString(dn), dimsString(shape), countString(rn))
		return
	}
	if dn == -1 {
		dc, rc := chunks(dims), chunks(shape)
		if len(dc) != len(rc) {
			v.errorf(p+".reshape", "model %s '%s' has different number of variable-size dimensions for dims %s and reshape %s", kind, name, dimsString(dims), dimsString(shape))
			return
		}
		for i := range dc {
			if dc[i] != rc[i] {
				v.errorf(p+".reshape", "model %s '%s' has different size for dims and reshape: the fixed dimensions between variable-size ones must hold the same number of elements (dims %s, reshape %s)", kind, name, dimsString(dims), dimsString(shape))
				return
			}
		}
	}
}

func countString(n int64) string {
	if n < 0 {
		return "a variable number of"
	}
	return strconv.FormatInt(n, 10)
}

// elementCount is Triton's GetElementCount: -1 when any dim is a wildcard,
// 0 for no dims.
func elementCount(dims []int64) int64 {
	if len(dims) == 0 {
		return 0
	}
	n := int64(1)
	for _, d := range dims {
		if d == WildcardDim {
			return -1
		}
		n *= d
	}
	return n
}

// chunks returns the element counts of the runs of fixed dims between
// wildcard dims.
func chunks(dims []int64) []int64 {
	out := []int64{}
	cur := int64(1)
	for _, d := range dims {
		if d == WildcardDim {
			out = append(out, cur)
			cur = 1
			continue
		}
		cur *= d
	}
	return append(out, cur)
}

var (
	profileRE = regexp.MustCompile(`^[0-9]+$`)
	ccRE      = regexp.MustCompile(`^[0-9]+\.[0-9]+$`)
)

func (v *validator) instanceGroups() {
	c := v.c
	if isEnsemble(c) {
		if len(c.GetInstanceGroup()) > 0 {
			v.errorf("instance_group", "instance group should not be specified for ensemble %q; each step model has its own", v.modelName())
		}
		return
	}
	names := map[string]int{}
	for i, g := range c.GetInstanceGroup() {
		p := at("instance_group", i)
		gname := g.GetName()
		if gname == "" {
			gname = fmt.Sprintf("%s_%d", v.modelName(), i)
		} else if j, dup := names[gname]; dup {
			v.errorf(p+".name", "instance group name %q is already used by instance_group[%d]", gname, j)
		}
		names[gname] = i
		kind := g.GetKind()
		if (kind == configpb.ModelInstanceGroup_KIND_CPU || kind == configpb.ModelInstanceGroup_KIND_MODEL) && len(g.GetGpus()) > 0 {
			v.errorf(p+".gpus", "instance group %s of model %s has kind %s but specifies one or more GPUs; remove gpus or use kind: KIND_GPU", gname, v.modelName(), kind)
		}
		if kind == configpb.ModelInstanceGroup_KIND_CPU && isTensorRT(c) {
			v.errorf(p+".kind", "instance group %s of model %s has kind KIND_CPU, but a TensorRT plan runs only on GPU; use kind: KIND_GPU", gname, v.modelName())
		}
		if kind != configpb.ModelInstanceGroup_KIND_CPU && kind != configpb.ModelInstanceGroup_KIND_MODEL {
			for j, id := range g.GetGpus() {
				if id < 0 || (v.opts.GPUs > 0 && int(id) >= v.opts.GPUs) {
					avail := "GPU ids start at 0"
					if v.opts.GPUs > 0 {
						avail = fmt.Sprintf("this machine has GPUs 0..%d", v.opts.GPUs-1)
					}
					v.errorf(at(p+".gpus", j), "instance group %s of model %s specifies invalid or unsupported gpu id %d; %s", gname, v.modelName(), id, avail)
				}
			}
		}
		if g.GetCount() < 0 {
			v.errorf(p+".count", "instance group %s has count %d; count must be >= 1 (0 means the default, 1)", gname, g.GetCount())
		}
		if len(g.GetProfile()) > 0 && !isTensorRT(c) {
			v.errorf(p+".profile", "instance group %s specifies optimization profiles, which only TensorRT models have; remove profile", gname)
		}
		for j, prof := range g.GetProfile() {
			if !profileRE.MatchString(prof) {
				v.errorf(at(p+".profile", j), "profile %q must be a non-negative integer index of a TensorRT optimization profile, such as \"0\"", prof)
			}
		}
		if len(g.GetSecondaryDevices()) > 0 && !isTensorRT(c) {
			v.errorf(p+".secondary_devices", "secondary devices (NVDLA) are only supported by the TensorRT backend")
		}
		for j, r := range g.GetRateLimiter().GetResources() {
			if r.GetName() == "" {
				v.errorf(at(p+".rate_limiter.resources", j)+".name", "rate limiter resource must have a name")
			}
		}
	}
}

func (v *validator) optimization() {
	c := v.c
	o := c.GetOptimization()
	if o == nil {
		return
	}
	if isEnsemble(c) {
		v.errorf("optimization", "optimization should not be specified for ensemble '%s'", v.modelName())
		return
	}
	ea := o.GetExecutionAccelerators()
	for i, a := range ea.GetGpuExecutionAccelerator() {
		v.accelerator(at("optimization.execution_accelerators.gpu_execution_accelerator", i), a, true)
	}
	for i, a := range ea.GetCpuExecutionAccelerator() {
		v.accelerator(at("optimization.execution_accelerators.cpu_execution_accelerator", i), a, false)
	}
	if gs := o.GetCuda().GetGraphSpec(); len(gs) > 0 && !isTensorRT(c) {
		v.warnf("optimization.cuda.graph_spec", "CUDA graph specs are only used by the TensorRT backend")
	}
	for i, g := range o.GetCuda().GetGraphSpec() {
		p := at("optimization.cuda.graph_spec", i)
		if c.GetMaxBatchSize() == 0 && g.GetBatchSize() != 0 {
			v.errorf(p+".batch_size", "batch_size must be 0 when max_batch_size is 0")
		} else if c.GetMaxBatchSize() > 0 && (g.GetBatchSize() < 1 || g.GetBatchSize() > c.GetMaxBatchSize()) {
			v.errorf(p+".batch_size", "batch_size must be between 1 and max_batch_size (%d), got %d", c.GetMaxBatchSize(), g.GetBatchSize())
		}
	}
}

var precisionModes = map[string][]string{
	BackendONNX:       {"FP32", "FP16", "INT8"},
	BackendTensorFlow: {"FP32", "FP16"},
}

func (v *validator) accelerator(p string, a *configpb.ModelOptimizationPolicy_ExecutionAccelerators_Accelerator, gpu bool) {
	backend := BackendOf(v.c)
	known := map[string][]string{
		BackendONNX:       {"tensorrt", "cuda"},
		BackendTensorFlow: {"tensorrt", "auto_mixed_precision", "gpu_io"},
	}
	if !gpu {
		known = map[string][]string{BackendONNX: {"openvino"}, BackendTensorFlow: {}}
	}
	names, checked := known[backend]
	switch {
	case a.GetName() == "":
		v.errorf(p+".name", "execution accelerator must have a name")
	case backend == BackendTensorRT:
		v.warnf(p, "a TensorRT plan already runs on TensorRT; execution accelerators are ignored")
	case checked && !contains(names, a.GetName()):
		v.errorf(p+".name", "backend %s does not know the %s execution accelerator %q; use one of %s", backend, map[bool]string{true: "GPU", false: "CPU"}[gpu], a.GetName(), strings.Join(names, ", "))
	}
	if a.GetName() != "tensorrt" {
		return
	}
	if pm, ok := a.GetParameters()["precision_mode"]; ok {
		modes := precisionModes[backend]
		if modes != nil && !contains(modes, pm) {
			v.errorf(key(p+".parameters", "precision_mode"), "precision_mode %q is not one of %s", pm, strings.Join(modes, ", "))
		}
	}
	for k, val := range a.GetParameters() {
		if strings.HasPrefix(k, "max_") || strings.HasSuffix(k, "_size") || strings.HasSuffix(k, "_bytes") {
			if _, err := strconv.ParseInt(val, 10, 64); err != nil {
				v.errorf(key(p+".parameters", k), "%s must be an integer, got %q", k, val)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (v *validator) misc() {
	c := v.c
	if c.GetResponseCache().GetEnable() {
		if c.GetModelTransactionPolicy().GetDecoupled() {
			v.errorf("response_cache.enable", "response cache does not support decoupled models; disable one of them")
		}
		if c.GetSequenceBatching() != nil {
			v.errorf("response_cache.enable", "response cache does not support sequence batching (responses depend on sequence state); disable one of them")
		}
	}
	keys := make([]string, 0, len(c.GetCcModelFilenames()))
	for k := range c.GetCcModelFilenames() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !ccRE.MatchString(k) {
			v.errorf(key("cc_model_filenames", k), "compute capability %q must look like \"8.6\"", k)
		}
		if f := c.GetCcModelFilenames()[k]; path.Base(f) != f {
			v.errorf(key("cc_model_filenames", k), "file %q must be a file name in the version directory, without '/'", f)
		}
	}
	for i, mc := range c.GetModelMetrics().GetMetricControl() {
		p := at("model_metrics.metric_control", i)
		if mc.GetMetricIdentifier().GetFamily() == "" {
			v.errorf(p+".metric_identifier.family", "metric identifier must specify non-empty 'family', such as \"nv_inference_first_response_histogram_ms\"")
		}
		switch h := mc.GetHistogramOptions(); {
		case h == nil:
			v.errorf(p+".histogram_options", "metric control must specify 'histogram_options'")
		case len(h.GetBuckets()) == 0:
			v.errorf(p+".histogram_options.buckets", "histogram options must specify non-empty 'buckets', in ascending order")
		default:
			b := h.GetBuckets()
			for j := 1; j < len(b); j++ {
				if b[j] <= b[j-1] {
					v.errorf(at(p+".histogram_options.buckets", j), "buckets must be in ascending order, but %v follows %v", b[j], b[j-1])
					break
				}
			}
		}
	}
	for i, a := range c.GetModelRepositoryAgents().GetAgents() {
		if a.GetName() == "" {
			v.errorf(at("model_repository_agents.agents", i)+".name", "repository agent must have a name")
		}
	}
	for i, lib := range c.GetModelOperations().GetOpLibraryFilename() {
		if lib == "" {
			v.errorf(at("model_operations.op_library_filename", i), "custom op library path is empty")
		}
	}
}
