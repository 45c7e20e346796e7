package pbtxt

import (
	"strings"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// The rules for sequence_batching come from three places in Triton, and a
// config that breaks any of them fails to load:
//   - the core's ValidateModelConfig, through GetBooleanSequenceControlProperties
//     and GetTypedSequenceControlProperties (control tensors, the oldest and
//     direct strategies);
//   - the sequence batcher itself: SequenceBatchScheduler::Create and
//     GenerateInitialStateData (implicit state and its initial value) and
//     SequenceStates::Initialize (state buffers);
//   - the backends, which bind one model tensor per control and per state:
//     ONNX Runtime counts config inputs, controls and states against the
//     model's inputs (ModelInstanceState ValidateInputs), TensorRT refuses a
//     tensor that "has already appeared as an input or output".
//
// dynamic_batching, sequence_batching and ensemble_scheduling are one oneof
// (scheduling_choice) in model_config.proto, so Parse already refuses a
// config that sets two of them.

type controlKind = configpb.ModelSequenceBatching_Control_Kind

const kindCorrID = configpb.ModelSequenceBatching_Control_CONTROL_SEQUENCE_CORRID

func (v *validator) sequenceBatching() {
	sb := v.c.GetSequenceBatching()
	if sb == nil {
		return
	}
	v.seqControls(sb)
	v.seqStrategy(sb)
	v.seqStates(sb)
	v.seqRoles(sb)
}

// seqControls checks each control tensor: it has a name no other
// control_input uses, each kind appears once in all, and one control_input
// carries one control.
func (v *validator) seqControls(sb *configpb.ModelSequenceBatching) {
	kinds := map[controlKind]string{}
	names := map[string]string{}
	for i, ci := range sb.GetControlInput() {
		p := at("sequence_batching.control_input", i)
		name := ci.GetName()
		prev, dup := names[name]
		switch {
		case name == "":
			v.errorf(p+".name", "sequence batching control tensor must have a name (the model input that receives the control) for %s", v.modelName())
		case dup:
			v.errorf(p+".name", "sequence batching control tensor '%s' is specified for multiple control kinds for %s (already at %s); give each control its own model input", name, v.modelName(), prev)
		default:
			names[name] = p
		}
		if len(ci.GetControl()) == 0 {
			v.errorf(p+".control", "control input %q must specify at least one control", name)
		}
		for j, ctl := range ci.GetControl() {
			cp := at(p+".control", j)
			kind := ctl.GetKind()
			if prev, dup := kinds[kind]; dup {
				v.errorf(cp+".kind", "sequence batching specifies multiple %s tensors for %s (already at %s)", kind, v.modelName(), prev)
			} else {
				kinds[kind] = cp
				if j > 0 {
					v.errorf(cp+".kind", "control input '%s' already carries %s at %s; the backends bind one model input per control, so give %s its own control_input", name, ci.GetControl()[0].GetKind(), at(p+".control", 0), kind)
				}
			}
			v.seqControl(cp, ctl)
		}
	}
}

// seqControl checks the values of one control: START, END and READY send
// exactly one of the false/true pairs, CORRID sends the correlation id in
// one of the allowed types.
func (v *validator) seqControl(cp string, ctl *configpb.ModelSequenceBatching_Control) {
	kind := ctl.GetKind()
	var set []string
	for _, l := range []struct {
		field string
		n     int
	}{
		{"int32_false_true", len(ctl.GetInt32FalseTrue())},
		{"fp32_false_true", len(ctl.GetFp32FalseTrue())},
		{"bool_false_true", len(ctl.GetBoolFalseTrue())},
	} {
		if l.n == 0 {
			continue
		}
		set = append(set, l.field)
		if l.n != 2 && kind != kindCorrID {
			v.errorf(cp+"."+l.field, "sequence batching control '%s' must have exactly 2 entries (false, then true) for %s, got %d", l.field, kind, l.n)
		}
	}
	if kind == kindCorrID {
		if len(set) > 0 {
			v.errorf(cp+"."+set[0], "sequence batching must not specify 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID: it carries the correlation id; set data_type instead")
		}
		switch ctl.GetDataType() {
		case configpb.DataType_TYPE_UINT64, configpb.DataType_TYPE_INT64, configpb.DataType_TYPE_UINT32, configpb.DataType_TYPE_INT32, configpb.DataType_TYPE_STRING:
		default:
			v.errorf(cp+".data_type", "unexpected data type %s for control CONTROL_SEQUENCE_CORRID for %s; allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING", ctl.GetDataType(), v.modelName())
		}
		return
	}
	switch len(set) {
	case 0:
		v.errorf(cp, "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for %s for %s", kind, v.modelName())
	case 1:
		if dt := ctl.GetDataType(); dt != configpb.DataType_TYPE_INVALID && dt != controlType(ctl) {
			v.warnf(cp+".data_type", "data_type %s is ignored for %s: Triton sends %s values because the control sets '%s'", dt, kind, controlType(ctl), set[0])
		}
	default:
		v.errorf(cp, "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' for %s (%s); keep one", kind, strings.Join(set, ", "))
	}
}

// seqStrategy checks the oldest and direct strategies.
func (v *validator) seqStrategy(sb *configpb.ModelSequenceBatching) {
	mbs := v.c.GetMaxBatchSize()
	if o := sb.GetOldest(); o != nil {
		for i, s := range o.GetPreferredBatchSize() {
			p := at("sequence_batching.oldest.preferred_batch_size", i)
			switch {
			case s < 1:
				v.errorf(p, "sequence batching preferred batch size must be positive, got %d", s)
			case s > mbs:
				v.errorf(p, "sequence batching preferred batch size %d must be <= max_batch_size %d", s, mbs)
			}
		}
		// The scheduler keeps max(1, max_batch_size) candidate sequences
		// unless the field is positive.
		if n := o.GetMaxCandidateSequences(); n < 0 {
			v.warnf("sequence_batching.oldest.max_candidate_sequences", "max_candidate_sequences %d is ignored: Triton keeps %d candidate sequences (max_batch_size, at least 1) unless it is positive", n, max(1, mbs))
		}
	}
	if d := sb.GetDirect(); d != nil {
		if u := d.GetMinimumSlotUtilization(); u < 0 || u > 1 {
			v.errorf("sequence_batching.direct.minimum_slot_utilization", "sequence batching minimum slot utilization must be in range [0, 1], got %v", u)
		}
	}
}

// seqStates checks the implicit states: their tensors, their buffers and
// their initial values.
func (v *validator) seqStates(sb *configpb.ModelSequenceBatching) {
	mbs := v.c.GetMaxBatchSize()
	inputs, outputs := map[string]int{}, map[string]int{}
	states := sb.GetState()
	for i, st := range states {
		p := at("sequence_batching.state", i)
		in, out := st.GetInputName(), st.GetOutputName()
		if in == "" {
			v.errorf(p+".input_name", "a sequence state must name input_name, the model input that receives the state")
		}
		if out == "" {
			v.errorf(p+".output_name", "a sequence state must name output_name, the model output that updates the state")
		}
		v.ioShape(p, "state", firstNonEmpty(in, p), st.GetDataType(), st.GetDims(), nil, mbs)
		if k, dup := inputs[in]; dup && in != "" {
			if len(st.GetInitialState()) > 0 && len(states[k].GetInitialState()) > 0 {
				v.errorf(p+".input_name", "state input name '%s' specified more than once (also at state[%d]), both with an initial_state", in, k)
			} else {
				v.warnf(p+".input_name", "state input name '%s' is already used by state[%d]; Triton ignores this state", in, k)
			}
		} else if in != "" {
			inputs[in] = i
		}
		if k, dup := outputs[out]; dup && out != "" {
			v.warnf(p+".output_name", "state output name '%s' is already used by state[%d]; Triton ignores this state", out, k)
		} else if out != "" {
			outputs[out] = i
		}
		v.stateBuffer(p, st)
		if n := len(st.GetInitialState()); n > 1 {
			v.errorf(p+".initial_state", "initial_state field for state input '%s' must contain exactly one or zero element, found %d", in, n)
		}
		for j, is := range st.GetInitialState() {
			v.initialState(at(p+".initial_state", j), is, st)
		}
	}
}

// stateBuffer checks use_growable_memory, which needs one buffer shared by
// input and output, on the GPU.
func (v *validator) stateBuffer(p string, st *configpb.ModelSequenceBatching_State) {
	if !st.GetUseGrowableMemory() {
		return
	}
	if !st.GetUseSameBufferForInputOutput() {
		v.errorf(p+".use_growable_memory", "in order to use 'use_growable_memory' for state input '%s', also set use_same_buffer_for_input_output: true", st.GetInputName())
	}
	for i, g := range v.c.GetInstanceGroup() {
		if k := g.GetKind(); k == configpb.ModelInstanceGroup_KIND_CPU || k == configpb.ModelInstanceGroup_KIND_MODEL {
			v.errorf(p+".use_growable_memory", "'use_growable_memory' only works with KIND_GPU model instances, but instance_group[%d] is %s; use kind: KIND_GPU or set use_growable_memory: false for state input '%s'", i, k, st.GetInputName())
			return
		}
	}
}

// initialState checks an initial value against its state.
func (v *validator) initialState(ip string, is *configpb.ModelSequenceBatching_InitialState, st *configpb.ModelSequenceBatching_State) {
	in := st.GetInputName()
	if is.GetName() == "" {
		v.errorf(ip+".name", "field 'name' must be set when using initial_state for state input '%s'", in)
	}
	if is.GetStateData() == nil {
		v.errorf(ip, "initial_state for state input '%s' must set zero_data or data_file", in)
	}
	if is.GetDataType() != st.GetDataType() {
		v.errorf(ip+".data_type", "the data type %s of 'initial_state' for state '%s' does not match the state data type %s", is.GetDataType(), in, st.GetDataType())
	}
	dims, sdims := is.GetDims(), st.GetDims()
	if len(dims) != len(sdims) {
		v.errorf(ip+".dims", "number of dimensions in 'initial_state' %s doesn't match the 'state' dimensions %s for state input '%s'", dimsString(dims), dimsString(sdims), in)
		return
	}
	for k, d := range dims {
		switch sd := sdims[k]; {
		case d == WildcardDim:
			v.errorf(at(ip+".dims", k), "'initial_state' for state input '%s' contains a variable dimension; give the size of the initial value", in)
		case d < 0:
			v.errorf(at(ip+".dims", k), "'initial_state' dimension for state input '%s' must be a size >= 0, got %d", in, d)
		case sd != WildcardDim && d != sd:
			v.errorf(at(ip+".dims", k), "'initial_state' dim %d for state input '%s' doesn't match the 'state' dim %d", d, in, sd)
		}
	}
}

// seqRoles checks that a model input plays one role: a listed input, a
// control or a state, never two.
func (v *validator) seqRoles(sb *configpb.ModelSequenceBatching) {
	roles := map[string]string{}
	for i, in := range v.c.GetInput() {
		if _, ok := roles[in.GetName()]; !ok && in.GetName() != "" {
			roles[in.GetName()] = at("input", i)
		}
	}
	for i, ci := range sb.GetControlInput() {
		n := ci.GetName()
		prev, ok := roles[n]
		switch {
		case n == "":
		case !ok:
			roles[n] = at("sequence_batching.control_input", i)
		case strings.HasPrefix(prev, "input["):
			v.errorf(at("sequence_batching.control_input", i)+".name", "control tensor '%s' is also listed as a model input at %s; the sequence batcher supplies it, so remove it from input (ONNX Runtime would count it twice, TensorRT would bind it twice)", n, prev)
		}
	}
	for i, st := range sb.GetState() {
		n := st.GetInputName()
		p := at("sequence_batching.state", i) + ".input_name"
		prev, ok := roles[n]
		switch {
		case n == "":
		case !ok:
			roles[n] = p
		case strings.HasPrefix(prev, "sequence_batching.control_input"):
			v.errorf(p, "state input '%s' is also the control tensor at %s; a model input is either a control or a state", n, prev)
		case strings.HasPrefix(prev, "input[") && BackendOf(v.c) == BackendONNX:
			v.errorf(p, "state input '%s' is also listed as a model input at %s; the sequence batcher supplies it, so remove it from input (ONNX Runtime counts it twice and refuses the model)", n, prev)
		case strings.HasPrefix(prev, "input["):
			v.warnf(p, "state input '%s' is also listed as a model input at %s; the sequence batcher supplies it, so remove it from input", n, prev)
		}
	}
}

// checkSequenceSignature checks control and state tensors against the
// model: controls must be inputs of shape [1] (after the batch dimension;
// TensorRT also takes [1,1,...])
// and of the type their values have (ONNX Runtime's
// ValidateBooleanSequenceControl and ValidateTypedSequenceControl,
// TensorRT's ValidateControlDimsDynamic); states must be an input and an
// output of the state's type and shape.
func checkSequenceSignature(col *collector, c *configpb.ModelConfig, sig Signature, batchErr bool) {
	mbs := c.GetMaxBatchSize()
	model := map[string]TensorSig{}
	for _, t := range sig.Inputs {
		model[t.Name] = t
	}
	for i, ci := range c.GetSequenceBatching().GetControlInput() {
		p := at("sequence_batching.control_input", i)
		t, ok := model[ci.GetName()]
		if !ok {
			col.errorf(p+".name", "configuration specified sequence control '%s', but the model does not provide that input; inputs are %s", ci.GetName(), sigNames(sig.Inputs))
			continue
		}
		for j, ctl := range ci.GetControl() {
			if want := controlType(ctl); want != configpb.DataType_TYPE_INVALID && want != t.DataType {
				col.errorf(at(p+".control", j), "sequence control '%s': the model expects data-type %s but the control %s sends %s values", ci.GetName(), t.DataType, ctl.GetKind(), want)
			}
		}
		if t.Unranked {
			continue
		}
		debatched := t.Shape
		if mbs > 0 && len(debatched) > 0 {
			debatched = debatched[1:]
		}
		// ONNX Runtime wants exactly [1]; TensorRT takes any rank of ones.
		ok = len(debatched) == 1 || (len(debatched) > 1 && BackendOf(c) != BackendONNX)
		for _, d := range debatched {
			ok = ok && d == 1
		}
		if !ok {
			col.errorf(p+".name", "sequence control '%s' in the model has dims %s (full shape %s) but dims [1] is expected after the batch dimension", ci.GetName(), dimsString(debatched), dimsString(t.Shape))
		}
	}
	for i, st := range c.GetSequenceBatching().GetState() {
		p := at("sequence_batching.state", i)
		if n := st.GetInputName(); n != "" {
			if _, ok := model[n]; !ok {
				col.errorf(p+".input_name", "state input '%s' is not an input of the model; inputs are %s", n, sigNames(sig.Inputs))
			} else {
				checkTensor(col, p, "state input", n, st.GetDataType(), st.GetDims(), nil, mbs, sig.Inputs, batchErr, false)
			}
		}
		if n := st.GetOutputName(); n != "" {
			if !hasTensor(sig.Outputs, n) {
				col.errorf(p+".output_name", "state output '%s' is not an output of the model; outputs are %s", n, sigNames(sig.Outputs))
			} else {
				checkTensor(col, p, "state output", n, st.GetDataType(), st.GetDims(), nil, mbs, sig.Outputs, batchErr, false)
			}
		}
	}
}

func hasTensor(ts []TensorSig, name string) bool {
	for _, t := range ts {
		if t.Name == name {
			return true
		}
	}
	return false
}

// dataTypeSize is the size in bytes of one element (Triton's
// GetDataTypeByteSize); 0 for TYPE_STRING and TYPE_INVALID.
func dataTypeSize(dt configpb.DataType) int64 {
	switch dt {
	case configpb.DataType_TYPE_BOOL, configpb.DataType_TYPE_UINT8, configpb.DataType_TYPE_INT8:
		return 1
	case configpb.DataType_TYPE_UINT16, configpb.DataType_TYPE_INT16, configpb.DataType_TYPE_FP16, configpb.DataType_TYPE_BF16:
		return 2
	case configpb.DataType_TYPE_UINT32, configpb.DataType_TYPE_INT32, configpb.DataType_TYPE_FP32:
		return 4
	case configpb.DataType_TYPE_UINT64, configpb.DataType_TYPE_INT64, configpb.DataType_TYPE_FP64:
		return 8
	}
	return 0
}

// initialStateBytes is how many bytes Triton reads from an initial_state
// data_file, or -1 when it reads the whole file (strings) or cannot tell.
func initialStateBytes(is *configpb.ModelSequenceBatching_InitialState) int64 {
	size := dataTypeSize(is.GetDataType())
	if size == 0 || len(is.GetDims()) == 0 {
		return -1
	}
	n := size
	for _, d := range is.GetDims() {
		if d < 0 {
			return -1
		}
		if d > 0 && n > (1<<62)/d {
			return -1
		}
		n *= d
	}
	return n
}
