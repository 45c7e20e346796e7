package pbtxt

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// findProblem reports whether ps has a problem of severity sev at exactly
// path whose message contains every keyword.
func findProblem(ps Problems, sev Severity, path string, keywords ...string) bool {
	for _, p := range ps {
		if p.Severity != sev || p.Path != path {
			continue
		}
		ok := true
		for _, k := range keywords {
			ok = ok && strings.Contains(p.Message, k)
		}
		if ok {
			return true
		}
	}
	return false
}

// seqConfig is a sequence model with one data input; cases add controls,
// states and strategies inside sequence_batching.
func seqConfig(extra, batching string) string {
	return `backend: "onnxruntime" max_batch_size: 4
		input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
		output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ] ` + extra + `
		sequence_batching { ` + batching + ` }`
}

const (
	startCtl = `{ name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }`
	readyCtl = `{ name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }`
	stateOK  = `{ input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ -1, 8 ] }`
)

func TestValidateSequenceRules(t *testing.T) {
	for _, tc := range []struct {
		name, extra, batching string
		sev                   Severity
		path                  string
		keywords              []string
	}{
		// GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties
		{"control without name", "", `control_input [ { control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].name", []string{"control tensor must have a name"}},
		{"one tensor for two kinds", "", `control_input [ ` + startCtl + `, { name: "START" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[1].name", []string{"control tensor 'START' is specified for multiple control kinds", "already at sequence_batching.control_input[0]"}},
		{"kind twice", "", `control_input [ ` + startCtl + `, { name: "S2" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[1].control[0].kind", []string{"multiple CONTROL_SEQUENCE_START tensors"}},
		{"two controls in one input", "", `control_input [ { name: "SE" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }, { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[1].kind", []string{"already carries CONTROL_SEQUENCE_START", "give CONTROL_SEQUENCE_END its own control_input"}},
		{"no false true", "", `control_input [ { name: "E" control [ { kind: CONTROL_SEQUENCE_END } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0]", []string{"must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_END"}},
		{"two false true kinds", "", `control_input [ { name: "E" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] bool_false_true: [ false, true ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0]", []string{"more than one from", "int32_false_true, bool_false_true"}},
		{"fp32 pair of three", "", `control_input [ { name: "R" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1, 2 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0].fp32_false_true", []string{"'fp32_false_true' must have exactly 2 entries", "got 3"}},
		{"bool pair of one", "", `control_input [ { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ true ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0].bool_false_true", []string{"exactly 2 entries"}},
		{"ignored data type", "", `control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START data_type: TYPE_BOOL int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityWarning, "sequence_batching.control_input[0].control[0].data_type", []string{"TYPE_BOOL is ignored", "sends TYPE_INT32 values"}},
		{"corrid with values", "", `control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0].int32_false_true", []string{"must not specify", "CONTROL_SEQUENCE_CORRID"}},
		{"corrid type", "", `control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP16 } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0].data_type", []string{"unexpected data type TYPE_FP16 for control CONTROL_SEQUENCE_CORRID", "TYPE_STRING"}},
		{"corrid without type", "", `control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].control[0].data_type", []string{"unexpected data type TYPE_INVALID"}},
		// backends: one model input, one role
		{"control listed as input", "", `control_input [ { name: "x" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]`,
			SeverityError, "sequence_batching.control_input[0].name", []string{"control tensor 'x' is also listed as a model input at input[0]", "remove it from input"}},
		{"state listed as input", "", `state [ { input_name: "x" output_name: "h_out" data_type: TYPE_FP32 dims: [ 3 ] } ]`,
			SeverityError, "sequence_batching.state[0].input_name", []string{"state input 'x' is also listed as a model input at input[0]", "ONNX Runtime"}},
		{"state is a control", "", `control_input [ ` + startCtl + ` ] state [ { input_name: "START" output_name: "h_out" data_type: TYPE_INT32 dims: [ 1 ] } ]`,
			SeverityError, "sequence_batching.state[0].input_name", []string{"state input 'START' is also the control tensor at sequence_batching.control_input[0]"}},
		// ValidateModelConfig: strategies
		{"oldest preferred zero", "", `oldest { preferred_batch_size: [ 0 ] }`,
			SeverityError, "sequence_batching.oldest.preferred_batch_size[0]", []string{"preferred batch size must be positive"}},
		{"oldest preferred above max", "", `oldest { preferred_batch_size: [ 2, 8 ] }`,
			SeverityError, "sequence_batching.oldest.preferred_batch_size[1]", []string{"preferred batch size 8 must be <= max_batch_size 4"}},
		{"oldest negative candidates", "", `oldest { max_candidate_sequences: -3 }`,
			SeverityWarning, "sequence_batching.oldest.max_candidate_sequences", []string{"-3 is ignored", "keeps 4 candidate sequences"}},
		{"direct utilization", "", `direct { minimum_slot_utilization: 1.5 }`,
			SeverityError, "sequence_batching.direct.minimum_slot_utilization", []string{"must be in range [0, 1], got 1.5"}},
		// SequenceBatchScheduler::Create, GenerateInitialStateData, SequenceStates::Initialize
		{"state without input name", "", `state [ { output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] } ]`,
			SeverityError, "sequence_batching.state[0].input_name", []string{"must name input_name"}},
		{"state without output name", "", `state [ { input_name: "h_in" data_type: TYPE_FP32 dims: [ 8 ] } ]`,
			SeverityError, "sequence_batching.state[0].output_name", []string{"must name output_name"}},
		{"state without type", "", `state [ { input_name: "h_in" output_name: "h_out" dims: [ 8 ] } ]`,
			SeverityError, "sequence_batching.state[0].data_type", []string{"state 'h_in' must specify 'data_type'"}},
		{"state zero dim", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 0 ] } ]`,
			SeverityError, "sequence_batching.state[0].dims[0]", []string{"dimension must be integer >= 1, or -1"}},
		{"state input twice", "", `state [ ` + stateOK + `, { input_name: "h_in" output_name: "c_out" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]`,
			SeverityWarning, "sequence_batching.state[1].input_name", []string{"'h_in' is already used by state[0]", "ignores this state"}},
		{"state input twice with initial values", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] initial_state [ { name: "a" data_type: TYPE_FP32 dims: [ 8 ] zero_data: true } ] }, { input_name: "h_in" output_name: "c_out" data_type: TYPE_FP32 dims: [ 8 ] initial_state [ { name: "b" data_type: TYPE_FP32 dims: [ 8 ] zero_data: true } ] } ]`,
			SeverityError, "sequence_batching.state[1].input_name", []string{"state input name 'h_in' specified more than once"}},
		{"state output twice", "", `state [ ` + stateOK + `, { input_name: "c_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] } ]`,
			SeverityWarning, "sequence_batching.state[1].output_name", []string{"'h_out' is already used by state[0]"}},
		{"growable without shared buffer", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] use_growable_memory: true } ]`,
			SeverityError, "sequence_batching.state[0].use_growable_memory", []string{"also set use_same_buffer_for_input_output: true"}},
		{"growable on CPU", `instance_group [ { kind: KIND_CPU } ]`, `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] use_same_buffer_for_input_output: true use_growable_memory: true } ]`,
			SeverityError, "sequence_batching.state[0].use_growable_memory", []string{"only works with KIND_GPU", "instance_group[0] is KIND_CPU"}},
		{"two initial states", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] initial_state [ { name: "a" data_type: TYPE_FP32 dims: [ 8 ] zero_data: true }, { name: "b" data_type: TYPE_FP32 dims: [ 8 ] zero_data: true } ] } ]`,
			SeverityError, "sequence_batching.state[0].initial_state", []string{"must contain exactly one or zero element, found 2"}},
		{"initial state without name", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] initial_state [ { data_type: TYPE_FP32 dims: [ 8 ] zero_data: true } ] } ]`,
			SeverityError, "sequence_batching.state[0].initial_state[0].name", []string{"field 'name' must be set"}},
		{"initial state without data", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] initial_state [ { name: "a" data_type: TYPE_FP32 dims: [ 8 ] } ] } ]`,
			SeverityError, "sequence_batching.state[0].initial_state[0]", []string{"must set zero_data or data_file"}},
		{"initial state type", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] initial_state [ { name: "a" data_type: TYPE_FP16 dims: [ 8 ] zero_data: true } ] } ]`,
			SeverityError, "sequence_batching.state[0].initial_state[0].data_type", []string{"TYPE_FP16", "does not match the state data type TYPE_FP32"}},
		{"initial state rank", "", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 2, 8 ] initial_state [ { name: "a" data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } ] } ]`,
			SeverityError, "sequence_batching.state[0].initial_state[0].dims", []string{"[16] doesn't match the 'state' dimensions [2,8]"}},
		{"initial state variable dim", "", `state [ ` + strings.Replace(stateOK, "}", `initial_state [ { name: "a" data_type: TYPE_FP32 dims: [ -1, 8 ] zero_data: true } ] }`, 1) + ` ]`,
			SeverityError, "sequence_batching.state[0].initial_state[0].dims[0]", []string{"contains a variable dimension"}},
		{"initial state dim mismatch", "", `state [ ` + strings.Replace(stateOK, "}", `initial_state [ { name: "a" data_type: TYPE_FP32 dims: [ 2, 4 ] data_file: "h.bin" } ] }`, 1) + ` ]`,
			SeverityError, "sequence_batching.state[0].initial_state[0].dims[1]", []string{"dim 4 for state input 'h_in' doesn't match the 'state' dim 8"}},
		// response cache (ValidateModelConfig)
		{"cache with sequences", `response_cache { enable: true }`, `control_input [ ` + startCtl + ` ]`,
			SeverityError, "response_cache.enable", []string{"does not support sequence batching"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(seqConfig(tc.extra, tc.batching)))
			if err != nil {
				t.Fatal(err)
			}
			ps := Validate(c, ValidateOptions{DirName: "m"})
			if !findProblem(ps, tc.sev, tc.path, tc.keywords...) {
				t.Errorf("Validate(%s) =\n%s\nwant a %s at %s containing %q", tc.name, problemList(ps), tc.sev, tc.path, tc.keywords)
			}
		})
	}
}

// A model has one scheduler: model_config.proto puts dynamic_batching,
// sequence_batching and ensemble_scheduling in one oneof, and Triton's text
// parser refuses a config that sets two.
func TestParseOneScheduler(t *testing.T) {
	for _, tc := range []struct{ config, want string }{
		{`dynamic_batching { } sequence_batching { }`, `"sequence_batching" cannot be set together with "dynamic_batching"`},
		{`sequence_batching { } ensemble_scheduling { }`, `"ensemble_scheduling" cannot be set together with "sequence_batching"`},
		{`sequence_batching { state [ { initial_state [ { zero_data: true data_file: "h.bin" } ] } ] }`, `"data_file" cannot be set together with "zero_data"`},
		{`sequence_batching { oldest { } direct { } }`, `"direct" cannot be set together with "oldest"`},
	} {
		if _, err := Parse([]byte(tc.config)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v, want an error containing %q", tc.config, err, tc.want)
		}
	}
}

func TestValidateSequenceCleanConfig(t *testing.T) {
	c, err := Parse([]byte(seqConfig(`instance_group [ { kind: KIND_GPU } ]`, `
		max_sequence_idle_microseconds: 5000000
		oldest { max_candidate_sequences: 16 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 }
		control_input [ `+startCtl+`, `+readyCtl+`,
			{ name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
			{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]
		state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ -1, 8 ]
			use_same_buffer_for_input_output: true use_growable_memory: true
			initial_state [ { name: "zeros" data_type: TYPE_FP32 dims: [ 1, 8 ] zero_data: true } ] } ]`)))
	if err != nil {
		t.Fatal(err)
	}
	if ps := Validate(c, ValidateOptions{DirName: "m", GPUs: 1}); len(ps) != 0 {
		t.Errorf("Validate(clean sequence config) =\n%s\nwant no problems", problemList(ps))
	}
}

// sig builds a signature from name/type/shape triples.
func sigOf(ins, outs []TensorSig) Signature { return Signature{Inputs: ins, Outputs: outs} }

func tsig(name string, dt configpb.DataType, shape ...int64) TensorSig {
	return TensorSig{Name: name, DataType: dt, Shape: shape}
}

const (
	f32 = configpb.DataType_TYPE_FP32
	i32 = configpb.DataType_TYPE_INT32
)

func TestCheckSignatureSequence(t *testing.T) {
	model := sigOf(
		[]TensorSig{tsig("x", f32, -1, 3), tsig("START", i32, -1, 1), tsig("READY", i32, -1, 2), tsig("h_in", f32, -1, -1, 8)},
		[]TensorSig{tsig("y", f32, -1, 3), tsig("h_out", f32, -1, -1, 8)})
	for _, tc := range []struct {
		name, batching string
		path           string
		keywords       []string
	}{
		{"control not in model", `control_input [ { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]`,
			"sequence_batching.control_input[0].name", []string{"sequence control 'END', but the model does not provide that input", "READY, START, h_in, x"}},
		{"control type", `control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]`,
			"sequence_batching.control_input[0].control[0]", []string{"the model expects data-type TYPE_INT32", "sends TYPE_FP32 values"}},
		{"control shape", `control_input [ ` + readyCtl + ` ]`,
			"sequence_batching.control_input[0].name", []string{"sequence control 'READY' in the model has dims [2]", "dims [1] is expected"}},
		{"state input not in model", `state [ { input_name: "c_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]`,
			"sequence_batching.state[0].input_name", []string{"state input 'c_in' is not an input of the model"}},
		{"state output not in model", `state [ { input_name: "h_in" output_name: "c_out" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]`,
			"sequence_batching.state[0].output_name", []string{"state output 'c_out' is not an output of the model; outputs are h_out, y"}},
		{"state type", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP16 dims: [ -1, 8 ] } ]`,
			"sequence_batching.state[0].data_type", []string{"unexpected datatype TYPE_FP16 for inference state input 'h_in', expecting TYPE_FP32"}},
		{"state dims", `state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ] } ]`,
			"sequence_batching.state[0].dims", []string{"state input 'h_in': the model expects 3 dimensions (shape [-1,-1,8])", "set dims: [-1,8]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(seqConfig("", tc.batching)))
			if err != nil {
				t.Fatal(err)
			}
			ps := CheckSignature(c, model)
			if !findProblem(ps, SeverityError, tc.path, tc.keywords...) {
				t.Errorf("CheckSignature(%s) =\n%s\nwant an error at %s containing %q", tc.name, problemList(ps), tc.path, tc.keywords)
			}
		})
	}
	c, err := Parse([]byte(seqConfig("", `control_input [ `+startCtl+` ] state [ `+stateOK+` ]`)))
	if err != nil {
		t.Fatal(err)
	}
	clean := sigOf(
		[]TensorSig{tsig("x", f32, -1, 3), tsig("START", i32, -1, 1), tsig("h_in", f32, -1, -1, 8)},
		[]TensorSig{tsig("y", f32, -1, 3), tsig("h_out", f32, -1, -1, 8)})
	if ps := CheckSignature(c, clean); len(ps) != 0 {
		t.Errorf("CheckSignature(matching controls and state) =\n%s\nwant no problems", problemList(ps))
	}
	fixed := sigOf([]TensorSig{tsig("x", f32, -1, 3), tsig("START", i32, 1, 1)}, []TensorSig{tsig("y", f32, -1, 3)})
	c, err = Parse([]byte(seqConfig("", `control_input [ `+startCtl+` ]`)))
	if err != nil {
		t.Fatal(err)
	}
	if ps := CheckSignature(c, fixed); !findProblem(ps, SeverityError, "max_batch_size", "does not support batching", "START [1,1]") {
		t.Errorf("CheckSignature(control with a fixed batch dimension) =\n%s\nwant the batch reported", problemList(ps))
	}
}
