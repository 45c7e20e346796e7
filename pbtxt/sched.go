package pbtxt

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// batchIO is Triton's ValidateBatchIO.
func (v *validator) batchIO() {
	c := v.c
	inputs := map[string]bool{}
	for _, in := range c.GetInput() {
		inputs[in.GetName()] = true
	}
	outputs := map[string]bool{}
	for _, out := range c.GetOutput() {
		outputs[out.GetName()] = true
	}
	if (len(c.GetBatchInput()) > 0 || len(c.GetBatchOutput()) > 0) && c.GetMaxBatchSize() == 0 {
		v.errorf("max_batch_size", "batch inputs and batch outputs need a batching model; set max_batch_size > 0")
	}
	targets := map[string]bool{}
	for i, bi := range c.GetBatchInput() {
		p := at("batch_input", i)
		if len(bi.GetTargetName()) == 0 {
			v.errorf(p+".target_name", "batch input must have at least one target name")
		}
		for j, t := range bi.GetTargetName() {
			if inputs[t] || targets[t] {
				v.errorf(at(p+".target_name", j), "target input name '%s' is already used by another input or batch input", t)
			}
			targets[t] = true
		}
		if dt := bi.GetDataType(); dt != configpb.DataType_TYPE_FP32 && dt != configpb.DataType_TYPE_INT32 && dt != configpb.DataType_TYPE_INT64 {
			v.errorf(p+".data_type", "batch input data type must be TYPE_FP32, TYPE_INT32 or TYPE_INT64, got %s", dt)
		}
		if n := len(bi.GetSourceInput()); n != 1 {
			v.errorf(p+".source_input", "batch input kind '%s' expects 1 source input, got %d", bi.GetKind(), n)
		}
		for j, s := range bi.GetSourceInput() {
			if !inputs[s] {
				v.errorf(at(p+".source_input", j), "unknown source input name '%s'; it must be one of the model inputs (%s)", s, joinKeys(inputs))
			}
		}
	}
	seen := map[string]bool{}
	for i, bo := range c.GetBatchOutput() {
		p := at("batch_output", i)
		if len(bo.GetTargetName()) == 0 {
			v.errorf(p+".target_name", "batch output must have at least one target name")
		}
		for j, t := range bo.GetTargetName() {
			if !outputs[t] {
				v.errorf(at(p+".target_name", j), "unknown target output name '%s'; it must be one of the model outputs (%s)", t, joinKeys(outputs))
			}
			if seen[t] {
				v.errorf(at(p+".target_name", j), "target output name '%s' can only be specified once", t)
			}
			seen[t] = true
		}
		if n := len(bo.GetSourceInput()); n != 1 {
			v.errorf(p+".source_input", "batch output kind '%s' expects 1 source input, got %d", bo.GetKind(), n)
		}
		for j, s := range bo.GetSourceInput() {
			if !inputs[s] {
				v.errorf(at(p+".source_input", j), "unknown source input name '%s'; it must be one of the model inputs (%s)", s, joinKeys(inputs))
			}
		}
	}
}

func joinKeys(m map[string]bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return "none"
	}
	return strings.Join(keys, ", ")
}

func (v *validator) dynamicBatching() {
	db := v.c.GetDynamicBatching()
	if db == nil {
		return
	}
	mbs := v.c.GetMaxBatchSize()
	for i, s := range db.GetPreferredBatchSize() {
		p := at("dynamic_batching.preferred_batch_size", i)
		switch {
		case s < 1:
			v.errorf(p, "dynamic batching preferred size must be positive, got %d", s)
		case s > mbs:
			v.errorf(p, "dynamic batching preferred size %d must be <= max_batch_size %d", s, mbs)
		}
	}
	if mbs == 0 && len(db.GetPreferredBatchSize()) == 0 {
		v.warnf("dynamic_batching", "dynamic batching cannot form batches when max_batch_size is 0; set max_batch_size or remove dynamic_batching")
	}
	v.queuePolicy("dynamic_batching", db)
}

func (v *validator) queuePolicy(p string, db *configpb.ModelDynamicBatching) {
	levels := db.GetPriorityLevels()
	if levels > 0 {
		if d := db.GetDefaultPriorityLevel(); d < 1 || d > levels {
			v.errorf(p+".default_priority_level", "default priority level must be in range [1, %d] for %s, got %d", levels, v.modelName(), d)
		}
	} else if db.GetDefaultPriorityLevel() != 0 {
		v.warnf(p+".default_priority_level", "default_priority_level is ignored while priority_levels is 0")
	}
	keys := make([]uint64, 0, len(db.GetPriorityQueuePolicy()))
	for k := range db.GetPriorityQueuePolicy() {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, k := range keys {
		if levels == 0 {
			v.warnf(key(p+".priority_queue_policy", k), "priority queue policies are ignored while priority_levels is 0; set priority_levels")
			break
		}
		if k < 1 || k > levels {
			v.errorf(key(p+".priority_queue_policy", k), "priority queue policy must have priority level in range [1, %d] for %s, got %d", levels, v.modelName(), k)
		}
	}
	if !db.GetPreserveOrdering() {
		return
	}
	if levels > 1 {
		v.errorf(p+".priority_levels", "only one priority level is allowed when 'preserve_ordering' is true, got %d", levels)
	}
	if db.GetDefaultQueuePolicy().GetTimeoutAction() == configpb.ModelQueuePolicy_DELAY {
		v.errorf(p+".default_queue_policy.timeout_action", "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for %s; use REJECT", v.modelName())
	}
	for _, k := range keys {
		if db.GetPriorityQueuePolicy()[k].GetTimeoutAction() == configpb.ModelQueuePolicy_DELAY {
			v.errorf(key(p+".priority_queue_policy", k)+".timeout_action", "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for %s; use REJECT", v.modelName())
		}
	}
}

func (v *validator) warmup() {
	c := v.c
	if len(c.GetModelWarmup()) == 0 {
		return
	}
	if isEnsemble(c) {
		v.errorf("model_warmup", "model_warmup can not be specified for ensemble '%s'; warm up its step models instead", v.modelName())
		return
	}
	inputs := map[string]*configpb.ModelInput{}
	for _, in := range c.GetInput() {
		inputs[in.GetName()] = in
	}
	controls := map[string]bool{}
	for _, ci := range c.GetSequenceBatching().GetControlInput() {
		controls[ci.GetName()] = true
	}
	for _, st := range c.GetSequenceBatching().GetState() {
		controls[st.GetInputName()] = true
	}
	mbs := c.GetMaxBatchSize()
	for i, w := range c.GetModelWarmup() {
		p := at("model_warmup", i)
		if w.GetName() == "" {
			v.errorf(p+".name", "warmup sample must have a name")
		}
		switch bs := w.GetBatchSize(); {
		case bs == 0:
			v.errorf(p+".batch_size", "warmup batch_size must be >= 1")
		case mbs == 0 && bs != 1:
			v.errorf(p+".batch_size", "warmup batch_size must be 1 for a model that does not batch, got %d", bs)
		case mbs > 0 && int64(bs) > int64(mbs):
			v.errorf(p+".batch_size", "warmup batch_size %d exceeds max_batch_size %d", bs, mbs)
		}
		names := make([]string, 0, len(w.GetInputs()))
		for n := range w.GetInputs() {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			wi := w.GetInputs()[n]
			ip := key(p+".inputs", n)
			in, ok := inputs[n]
			if !ok && !controls[n] && len(inputs) > 0 {
				v.errorf(ip, "warmup input %q is not a model input; inputs are %s", n, inputNames(c))
			}
			if wi.GetDataType() == configpb.DataType_TYPE_INVALID {
				v.errorf(ip+".data_type", "warmup input %q must specify data_type", n)
			} else if ok && wi.GetDataType() != in.GetDataType() {
				v.errorf(ip+".data_type", "warmup input %q has data type %s but the model input is %s", n, wi.GetDataType(), in.GetDataType())
			}
			for j, d := range wi.GetDims() {
				if d < 0 {
					v.errorf(at(ip+".dims", j), "warmup dims must be concrete sizes (no -1); got %d", d)
				}
			}
			if ok && !matchDims(in.GetDims(), wi.GetDims()) {
				v.errorf(ip+".dims", "warmup input %q has dims %s that do not fit the input's dims %s (without the batch dimension)", n, dimsString(wi.GetDims()), dimsString(in.GetDims()))
			}
			if wi.GetInputDataType() == nil {
				v.errorf(ip, "warmup input %q must set zero_data, random_data or input_data_file", n)
			}
		}
		for _, in := range c.GetInput() {
			if _, ok := w.GetInputs()[in.GetName()]; !ok && !in.GetOptional() && in.GetName() != "" {
				v.errorf(p+".inputs", "warmup sample %q gives no data for model input %q; every required input needs warmup data", w.GetName(), in.GetName())
			}
		}
	}
}

func inputNames(c *configpb.ModelConfig) string {
	m := map[string]bool{}
	for _, in := range c.GetInput() {
		m[in.GetName()] = true
	}
	return joinKeys(m)
}

// matchDims reports whether concrete dims fit a shape with wildcards.
func matchDims(shape, dims []int64) bool {
	if len(shape) != len(dims) {
		return false
	}
	for i := range shape {
		if shape[i] != WildcardDim && dims[i] != WildcardDim && shape[i] != dims[i] {
			return false
		}
	}
	return true
}

// ensembleTensor is a node of Triton's ensemble data-flow graph.
type ensembleTensor struct {
	ready    bool
	isOutput bool
	prev     []*ensembleTensor
	next     []*ensembleTensor
}

// ensemble checks the ensemble on its own (ValidateEnsembleSchedulingConfig
// and BuildEnsembleGraph): every step is complete and every tensor flows
// from the ensemble inputs to the ensemble outputs.
func (v *validator) ensemble() {
	c := v.c
	es := c.GetEnsembleScheduling()
	name := v.modelName()
	if !isEnsemble(c) {
		if es != nil {
			v.errorf("ensemble_scheduling", "ensemble scheduling cannot be set for model %q whose platform is not ensemble; set platform: \"ensemble\"", name)
		}
		return
	}
	if es == nil {
		v.errorf("ensemble_scheduling", "ensemble scheduling must be set for ensemble %s whose platform is ensemble", name)
		return
	}
	if len(es.GetStep()) == 0 {
		v.errorf("ensemble_scheduling.step", "must specify 'step' for ensemble '%s'", name)
		return
	}
	tensors, ok := v.ensembleGraph(es, name)
	if !ok {
		return
	}
	v.ensembleInputs(tensors, name)
	v.ensembleOutputs(tensors, name)
}

// ensembleGraph builds the data-flow graph of the steps: each step's output
// tensors depend on all of its input tensors. It reports a step that is not
// complete and returns false, as Triton stops at the first.
func (v *validator) ensembleGraph(es *configpb.ModelEnsembling, name string) (map[string]*ensembleTensor, bool) {
	tensors := map[string]*ensembleTensor{}
	get := func(n string, isOutput bool) *ensembleTensor {
		t, ok := tensors[n]
		if !ok {
			t = &ensembleTensor{isOutput: isOutput}
			tensors[n] = t
		}
		return t
	}
	for i, st := range es.GetStep() {
		p := at("ensemble_scheduling.step", i)
		switch {
		case st.GetModelName() == "":
			v.errorf(p+".model_name", "must specify 'model_name' in step %d of ensemble '%s'", i, name)
			return nil, false
		case len(st.GetInputMap()) == 0:
			v.errorf(p+".input_map", "must specify 'input_map' in step %d of ensemble '%s'", i, name)
			return nil, false
		case len(st.GetOutputMap()) == 0:
			v.errorf(p+".output_map", "must specify 'output_map' in step %d of ensemble '%s'", i, name)
			return nil, false
		}
		var outs []*ensembleTensor
		for _, k := range slices.Sorted(maps.Keys(st.GetOutputMap())) {
			tn := st.GetOutputMap()[k]
			if t, exists := tensors[tn]; exists && t.isOutput {
				v.errorf(key(p+".output_map", k), "ensemble tensor '%s' can appear in an output map only once for ensemble '%s' (step %d)", tn, name, i)
				return nil, false
			}
			t := get(tn, true)
			t.isOutput = true
			outs = append(outs, t)
		}
		for _, k := range slices.Sorted(maps.Keys(st.GetInputMap())) {
			t := get(st.GetInputMap()[k], false)
			for _, o := range outs {
				o.prev = append(o.prev, t)
				t.next = append(t.next, o)
			}
		}
	}
	return tensors, true
}

// ensembleInputs marks every tensor that can be computed from the ensemble
// inputs ready, reporting inputs that no step reads.
func (v *validator) ensembleInputs(tensors map[string]*ensembleTensor, name string) {
	var queue []*ensembleTensor
	for i, in := range v.c.GetInput() {
		t, ok := tensors[in.GetName()]
		if !ok {
			v.errorf(at("input", i), "ensemble input '%s' for ensemble %s' is not used: no step maps it in input_map", in.GetName(), name)
			continue
		}
		t.ready = true
		queue = append(queue, t)
	}
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		for _, n := range t.next {
			if n.ready {
				continue
			}
			ready := true
			for _, pv := range n.prev {
				ready = ready && pv.ready
			}
			if ready {
				n.ready = true
				queue = append(queue, n)
			}
		}
	}
}

// ensembleOutputs reports ensemble outputs that no step writes or that the
// inputs do not reach, and intermediate tensors that are never produced or
// never consumed.
func (v *validator) ensembleOutputs(tensors map[string]*ensembleTensor, name string) {
	outputs := map[string]bool{}
	for i, out := range v.c.GetOutput() {
		t, ok := tensors[out.GetName()]
		switch {
		case !ok:
			v.errorf(at("output", i), "ensemble output '%s' for ensemble %s' is not used: no step writes it in output_map", out.GetName(), name)
		case !t.ready:
			msg := fmt.Sprintf("output '%s' for ensemble '%s' is not written", out.GetName(), name)
			if miss := unreachable(tensors, t); len(miss) > 0 {
				msg += fmt.Sprintf(": at least one of its depending tensors, '%s', is not connected to the ensemble inputs", strings.Join(miss, "', '"))
			}
			v.errorf(at("output", i), "%s", msg)
		}
		outputs[out.GetName()] = true
	}
	for _, tn := range slices.Sorted(maps.Keys(tensors)) {
		t := tensors[tn]
		if outputs[tn] {
			continue
		}
		if !t.ready || len(t.next) == 0 {
			v.errorf("ensemble_scheduling", "ensemble tensor '%s' is unused in ensemble '%s': it is never produced from the ensemble inputs or never consumed", tn, name)
		}
	}
}

// unreachable names the tensors upstream of t that nothing produces.
func unreachable(tensors map[string]*ensembleTensor, t *ensembleTensor) []string {
	seen := map[*ensembleTensor]bool{}
	var roots []*ensembleTensor
	var walk func(*ensembleTensor)
	walk = func(x *ensembleTensor) {
		if seen[x] {
			return
		}
		seen[x] = true
		if !x.ready && !x.isOutput {
			roots = append(roots, x)
		}
		for _, pv := range x.prev {
			walk(pv)
		}
	}
	walk(t)
	var names []string
	for _, n := range slices.Sorted(maps.Keys(tensors)) {
		for _, r := range roots {
			if tensors[n] == r {
				names = append(names, n)
			}
		}
	}
	return names
}
