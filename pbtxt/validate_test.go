package pbtxt

import (
	"strings"
	"testing"
)

func TestValidateRules(t *testing.T) {
	const io = `input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ] `
	for _, tc := range []struct {
		name, config string
		path         string
		keywords     []string
	}{
		{"name mismatch", `name: "other" backend: "onnxruntime" ` + io, "name", []string{`does not match its directory "m"`}},
		{"unknown platform hint", `platform: "onnxruntime_onx" ` + io, "platform", []string{`did you mean "onnxruntime_onnx"?`}},
		{"platform backend pair", `platform: "tensorrt_plan" backend: "onnxruntime" ` + io, "backend", []string{`platform "tensorrt_plan" is served by backend "tensorrt"`}},
		{"no backend without autofill", io, "platform", []string{"could not determine the backend"}},
		{"ensemble without scheduling", `platform: "ensemble" ` + io, "ensemble_scheduling", []string{"ensemble scheduling must be set"}},
		{"scheduling without ensemble", `backend: "onnxruntime" ensemble_scheduling { } ` + io, "ensemble_scheduling", []string{"whose platform is not ensemble"}},
		{"missing data type", `backend: "onnxruntime" input [ { name: "x" dims: [ 1 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]`, "input[0].data_type", []string{"must specify 'data_type'"}},
		{"duplicate input", `backend: "onnxruntime" input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]`, "input[1].name", []string{"already declared at input[0]"}},
		{"format needs 3 dims", `backend: "onnxruntime" max_batch_size: 1 input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 224, 224 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]`, "input[0].dims", []string{"FORMAT_NHWC", "exactly 3 dims"}},
		{"shape tensor outside TensorRT", `backend: "onnxruntime" input [ { name: "x" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]`, "input[0].is_shape_tensor", []string{"only supported by the TensorRT platform"}},
		{"preferred above max", `backend: "onnxruntime" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 2, 8 ] } ` + io, "dynamic_batching.preferred_batch_size[1]", []string{"8 must be <= max_batch_size 4"}},
		{"preferred zero", `backend: "onnxruntime" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 0 ] } ` + io, "dynamic_batching.preferred_batch_size[0]", []string{"must be positive"}},
		{"ordering with priorities", `backend: "onnxruntime" max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 } ` + io, "dynamic_batching.priority_levels", []string{"only one priority level"}},
		{"profile outside TensorRT", `backend: "onnxruntime" instance_group [ { profile: [ "0" ] } ] ` + io, "instance_group[0].profile", []string{"only TensorRT models have"}},
		{"profile not a number", `platform: "tensorrt_plan" instance_group [ { profile: [ "first" ] } ] ` + io, "instance_group[0].profile[0]", []string{`"first" must be a non-negative integer`}},
		{"TensorRT on CPU", `platform: "tensorrt_plan" instance_group [ { kind: KIND_CPU } ] ` + io, "instance_group[0].kind", []string{"runs only on GPU"}},
		{"gpu beyond machine", `backend: "onnxruntime" instance_group [ { kind: KIND_GPU gpus: [ 0, 2 ] } ] ` + io, "instance_group[0].gpus[1]", []string{"gpu id 2", "GPUs 0..1"}},
		{"ensemble instance group", `platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] } instance_group [ { } ] ` + io, "instance_group", []string{"should not be specified for ensemble"}},
		{"latest zero", `backend: "onnxruntime" version_policy { latest { } } ` + io, "version_policy.latest.num_versions", []string{"at least 1"}},
		{"specific empty", `backend: "onnxruntime" version_policy { specific { } } ` + io, "version_policy.specific.versions", []string{"at least one version"}},
		{"warmup batch", `backend: "onnxruntime" model_warmup [ { name: "w" batch_size: 2 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ] ` + io, "model_warmup[0].batch_size", []string{"must be 1 for a model that does not batch"}},
		{"warmup wrong type", `backend: "onnxruntime" model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_INT8 dims: [ 3 ] zero_data: true } } } ] ` + io, `model_warmup[0].inputs["x"].data_type`, []string{"TYPE_INT8 but the model input is TYPE_FP32"}},
		{"warmup no data", `backend: "onnxruntime" model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 3 ] } } } ] ` + io, `model_warmup[0].inputs["x"]`, []string{"must set zero_data, random_data or input_data_file"}},
		{"warmup missing input", `backend: "onnxruntime" model_warmup [ { name: "w" batch_size: 1 } ] ` + io, "model_warmup[0].inputs", []string{`no data for model input "x"`}},
		{"warmup dims", `backend: "onnxruntime" model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ] ` + io, `model_warmup[0].inputs["x"].dims`, []string{"[4] that do not fit"}},
		{"cache with decoupled", `backend: "python" response_cache { enable: true } model_transaction_policy { decoupled: true } ` + io, "response_cache.enable", []string{"decoupled"}},
		{"cache with sequences", `backend: "onnxruntime" response_cache { enable: true } sequence_batching { } ` + io, "response_cache.enable", []string{"sequence batching"}},
		{"accelerator name", `backend: "onnxruntime" optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrtt" } ] } } ` + io, "optimization.execution_accelerators.gpu_execution_accelerator[0].name", []string{`"tensorrtt"`, "tensorrt, cuda"}},
		{"precision mode", `backend: "onnxruntime" optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "fp16" } } ] } } ` + io, `optimization.execution_accelerators.gpu_execution_accelerator[0].parameters["precision_mode"]`, []string{`"fp16" is not one of FP32, FP16, INT8`}},
		{"compute capability", `platform: "tensorrt_plan" cc_model_filenames { key: "sm86" value: "a.plan" } ` + io, `cc_model_filenames["sm86"]`, []string{`must look like "8.6"`}},
		{"corrid type", `backend: "onnxruntime" sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] } ` + io, "sequence_batching.control_input[0].control[0].data_type", []string{"TYPE_UINT64"}},
		{"false true length", `backend: "onnxruntime" sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1, 2 ] } ] } ] } ` + io, "sequence_batching.control_input[0].control[0]", []string{"exactly 2 entries"}},
		{"optional input with batching", `backend: "onnxruntime" max_batch_size: 2 input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] optional: true } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]`, "input[0].optional", []string{"optional input 'x' is not supported by the ONNX Runtime backend for models that support batching"}},
		{"label path", `backend: "onnxruntime" input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "../l.txt" } ]`, "output[0].label_filename", []string{"without '/'"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			ps := Validate(c, ValidateOptions{DirName: "m", GPUs: 2})
			if !hasProblem(ps, tc.path, tc.keywords...) {
				t.Errorf("Validate(%s) =\n%s\nwant an error at %s containing %q", tc.name, problemList(ps), tc.path, tc.keywords)
			}
		})
	}
}

func TestValidateCleanConfigHasNoProblems(t *testing.T) {
	c, err := Parse([]byte(`name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
		input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, -1 ] } ]
		output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] reshape { shape: [ 1, 10 ] } } ]
		dynamic_batching { preferred_batch_size: [ 4, 8 ] priority_levels: 2 default_priority_level: 2 priority_queue_policy { key: 1 value { timeout_action: DELAY } } }
		instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]
		model_warmup [ { name: "w" batch_size: 8 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 3, 64, 64 ] random_data: true } } } ]`))
	if err != nil {
		t.Fatal(err)
	}
	if ps := Validate(c, ValidateOptions{DirName: "m", GPUs: 1}); len(ps) != 0 {
		t.Errorf("Validate(clean config) = %v, want no problems", ps)
	}
	if ps := Validate(c, ValidateOptions{}); len(ps) != 0 {
		t.Errorf("Validate(clean config, no options) = %v, want no problems", ps)
	}
	if !strings.Contains(Problem{File: "f", Path: "p", Message: "m", Severity: SeverityWarning}.String(), "f: warning: p: m") {
		t.Error("Problem.String() does not read file: severity: path: message")
	}
}
