package pbtxt

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// validCorpus lists the corpus configs that Triton accepts.
func validCorpus(t *testing.T) []string {
	root := testutil.Corpus(t, "triton-configs")
	var files []string
	for _, pat := range []string{
		"docs_model_repository/*/config.pbtxt",
		"gke_tf_inference_tutorial/*/config.pbtxt",
		"gke_marketplace_bert/*/config.pbtxt",
		"jetson_peoplenet/sample_1/*/config.pbtxt",
		"mlflow_example/*/config.pbtxt",
		"qa_*/*.pbtxt",
		"qa_*/*/config.pbtxt",
		"model_navigator/valid_config.pbtxt",
	} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	if len(files) < 25 {
		t.Fatalf("found only %d valid corpus configs; is the corpus complete?", len(files))
	}
	return files
}

func TestCorpusValidConfigs(t *testing.T) {
	for _, path := range validCorpus(t) {
		rel := strings.TrimPrefix(path, testutil.Corpus(t, "triton-configs")+"/")
		t.Run(rel, func(t *testing.T) {
			c, err := ParseFile(path)
			if err != nil {
				t.Fatalf("ParseFile(%s) = %v, want no error", rel, err)
			}
			ps, err := LintFile(path, LintOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.Severity == SeverityError {
					t.Errorf("LintFile(%s): unexpected %v", rel, p)
				} else {
					t.Logf("%v", p)
				}
			}
			out := Print(c)
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("Parse(Print(%s)) = %v\n%s", rel, err, out)
			}
			if !proto.Equal(c, back) {
				t.Errorf("Parse(Print(%s)) differs from the original\n%s", rel, out)
			}
			if again := Print(back); string(again) != string(out) {
				t.Errorf("Print is not stable for %s:\n%s\n---\n%s", rel, out, again)
			}
		})
	}
}

func TestGoldenPrint(t *testing.T) {
	root := testutil.Corpus(t, "triton-configs")
	cases := map[string]string{
		"simple_dyna_sequence": "docs_model_repository/simple_dyna_sequence/config.pbtxt",
		"densenet_onnx":        "docs_model_repository/densenet_onnx/config.pbtxt",
		"gke_original":         "gke_tf_inference_tutorial/original/config.pbtxt",
		"ensemble_add_sub":     "qa_simple_ensemble/ensemble_add_sub_int32_int32_int32/config.pbtxt",
		"onnx_tensorrt_fp16":   "docs_snippets/optimization_onnx_tensorrt_fp16_accelerator.pbtxt",
		"mlflow":               "mlflow_example/onnx_float32_int32_int32/config.pbtxt",
	}
	for name, rel := range cases {
		c, err := ParseFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		testutil.Golden(t, name, Print(c))
	}
}

func TestModelNavigatorInvalid(t *testing.T) {
	path := filepath.Join(testutil.Corpus(t, "triton-configs"), "model_navigator", "invalid_config.pbtxt")
	ps, err := LintFile(path, LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasProblem(ps, "input[0].dims", "must specify 'dims'") {
		t.Errorf("LintFile(invalid_config.pbtxt) = %v, want an error at input[0].dims about empty dims", ps)
	}
}

// hasProblem reports whether ps has an error whose path starts with path
// and whose message contains every keyword.
func hasProblem(ps Problems, path string, keywords ...string) bool {
	for _, p := range ps {
		if p.Severity != SeverityError || !strings.HasPrefix(p.Path, path) {
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

type want struct {
	path     string
	keywords []string
}

func w(path string, keywords ...string) want { return want{path, keywords} }

// noautofillWant maps every case of L0_model_config/noautofill_platform to
// the field and words of the problem its expected file names.
var noautofillWant = map[string]want{
	"batch_input_less_source0":       w("batch_input[0].source_input", "'BATCH_ELEMENT_COUNT' expects 1 source input, got 0"),
	"batch_input_less_source2":       w("batch_input[0].source_input", "'BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO' expects 1 source input, got 0"),
	"batch_input_less_source3":       w("batch_input[0].source_input", "'BATCH_MAX_ELEMENT_COUNT_AS_SHAPE' expects 1 source input, got 0"),
	"batch_input_many_source1":       w("batch_input[0].source_input", "'BATCH_ACCUMULATED_ELEMENT_COUNT' expects 1 source input, got 2"),
	"batch_input_many_source2":       w("batch_input[0].source_input", "expects 1 source input, got 2"),
	"batch_input_unknown_source":     w("batch_input[0].source_input[0]", "unknown source input name 'UNKNOWN_INPUT'"),
	"batch_output_duplicated_target": w("batch_output[0].target_name[1]", "target output name 'OUTPUT' can only be specified once"),
	"batch_output_less_source":       w("batch_output[0].source_input", "'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0"),
	"batch_output_unknown_source":    w("batch_output[0].source_input[0]", "unknown source input name 'UNKNOWN_INPUT'"),
	"batch_output_unknown_target":    w("batch_output[0].target_name[0]", "unknown target output name 'UNKNOWN_OUTPUT'"),
	"control_kind_ready_multiple":    w("sequence_batching.control_input[2].control[0].kind", "multiple CONTROL_SEQUENCE_READY tensors"),
	"control_kind_start_multiple":    w("sequence_batching.control_input[1].control[0].kind", "multiple CONTROL_SEQUENCE_START tensors"),
	"control_tensor_no_value":        w("sequence_batching.control_input[1].control[0]", "'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_READY"),
	"default_priority_level0":        w("dynamic_batching.default_priority_level", "default priority level must be in range [1, 3]"),
	"default_priority_level1":        w("dynamic_batching.default_priority_level", "default priority level must be in range [1, 3]"),
	"invalid_cpu":                    w("instance_group[0].gpus", "invalid_cpu_0", "has kind KIND_CPU but specifies one or more GPU"),
	"invalid_gpu":                    w("instance_group[0].gpus[0]", "invalid_gpu_0", "invalid or unsupported gpu id 42"),
	"negative_gpu":                   w("instance_group[1].gpus[0]", "negative_gpu_1", "invalid or unsupported gpu id -1"),
	"negative_max_batch_size":        w("max_batch_size", "'max_batch_size' must be non-negative"),
	"preserve_ordering1":             w("dynamic_batching.default_queue_policy.timeout_action", "DELAY as timeout action when 'preserve_ordering' is true"),
	"preserve_ordering2":             w("dynamic_batching.priority_queue_policy[1].timeout_action", "DELAY as timeout action when 'preserve_ordering' is true"),
	"priority_level0":                w("dynamic_batching.priority_queue_policy[0]", "priority queue policy must have priority level in range [1, 3]"),
	"reshape_elementcount0":          w("input[0].reshape", "model input 'input' has different size for dims and reshape"),
	"reshape_elementcount1":          w("input[0].reshape", "model input 'input' has different size for dims and reshape"),
	"reshape_elementcount3":          w("output[0].reshape", "model output 'output' has different size for dims and reshape"),
	"reshape_nobatch_empty0":         w("input[0].reshape", "model input 'input' cannot have empty reshape for non-batching model"),
	"reshape_nobatch_variable0":      w("input[0].reshape", "model input 'input' has different size for dims and reshape"),
	"reshape_nobatch_variable1":      w("output[0].reshape", "model output 'output' has different size for dims and reshape"),
	"reshape_nobatch_variable2":      w("input[0].reshape", "model input 'input' has different size for dims and reshape"),
	"reshape_nobatch_variable4":      w("input[0].reshape", "model input 'input' has different number of variable-size dimensions"),
	"reshape_nobatch_variable5":      w("output[0].reshape", "model output 'output' has different number of variable-size dimensions"),
	"reshape_nobatch_zerodims1":      w("output[0].reshape.shape", "model output 'output' reshape dimensions must be integer >= 1, or -1"),
	"reshape_variable0":              w("input[0].reshape", "model input 'input' has different size for dims and reshape"),
	"reshape_variable2":              w("input[0].reshape", "model input 'input' has different size for dims and reshape"),
	"reshape_variable3":              w("output[0].reshape", "model output 'output' has different size for dims and reshape"),
	"reshape_variable4":              w("input[0].reshape", "model input 'input' has different number of variable-size dimensions"),
	"reshape_zerodims0":              w("input[0].reshape.shape", "model input 'input' reshape dimensions must be integer >= 1, or -1"),
	"reshape_zerodims1":              w("output[0].reshape.shape", "model output 'output' reshape dimensions must be integer >= 1, or -1"),
	"zerodims_input1":                w("input[0].dims", "model input 'input' dimension must be integer >= 1, or -1"),
	"zerodims_output0":               w("output[0].dims", "model output 'output' dimension must be integer >= 1, or -1"),
}

// withPlatform does what Triton's L0_model_config test does to each
// noautofill case: drop the platform line and append platform: "<p>".
func withPlatform(data []byte, platform string) []byte {
	var keep []string
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "platform:") {
			keep = append(keep, line)
		}
	}
	return []byte(strings.Join(keep, "\n") + "\nplatform: \"" + platform + "\"\n")
}

func TestTritonNoautofillSuite(t *testing.T) {
	root := testutil.Corpus(t, "triton-configs", "L0_model_config", "noautofill_platform")
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	caught, total := 0, 0
	for _, e := range entries {
		name := e.Name()
		wnt, ok := noautofillWant[name]
		if !ok {
			t.Errorf("case %s has no expected problem in noautofillWant", name)
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, name, ConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, platform := range []string{PlatformTensorRT, PlatformONNX, PlatformTorch} {
			total++
			t.Run(name+"/"+platform, func(t *testing.T) {
				c, err := Parse(withPlatform(data, platform))
				if err != nil {
					t.Fatalf("Parse = %v", err)
				}
				ps := Validate(c, ValidateOptions{DirName: name, GPUs: 8})
				if !hasProblem(ps, wnt.path, wnt.keywords...) {
					t.Errorf("Validate(%s with %s) = %v\nwant an error at %s containing %q", name, platform, ps, wnt.path, wnt.keywords)
					return
				}
				caught++
			})
		}
	}
	t.Logf("noautofill_platform: caught %d of %d cases (%d configs x 3 platforms)", caught, total, total/3)
}

// autofillWant maps the invalid autofill_noplatform cases whose files are
// all present (ONNX models, or configs only) to the expected problem.
var autofillWant = map[string]want{
	"common/no_version":                      w("backend", "could not determine backend for model 'no_version'"),
	"custom/no_delimiter":                    w("backend", "could not determine backend for model 'no_delimiter'"),
	"ensemble/circular_dependency":           w("ensemble_scheduling", "circular dependency between ensembles: circular_dependency", "-> circular_dependency_2 ->"),
	"ensemble/ensemble_scheduling_no_set":    w("ensemble_scheduling", "ensemble scheduling must be set for ensemble ensemble_scheduling_not_set"),
	"ensemble/inconsistent_data_type":        w("ensemble_scheduling", "inconsistent data type: TYPE_FP32 is inferred from model inconsistent_data_type while TYPE_INT32 is inferred from model int32_dim1_batch4"),
	"ensemble/inconsistent_shape":            w("ensemble_scheduling", "ensemble tensor temp_tensor: inconsistent shape: [-1,16] is inferred from model fp32_dim1_batch4 while [-1,16,16,16] is inferred from model fp32_dim3_batch4"),
	"ensemble/invalid_batch_size":            w("max_batch_size", "allows maximum batch size 3, but it contains model fp32_dim1_batch2 which only allows maximum batch size to be 2"),
	"ensemble/invalid_decoupled_branching":   w("ensemble_scheduling.step[2]", "step of model 'int32_dim1_nobatch_output2' receives inputs originated from different decoupled models"),
	"ensemble/invalid_decoupled_branching_2": w("output", "step of model 'invalid_decoupled_branching_2' receives inputs originated from different decoupled models"),
	"ensemble/invalid_output_map":            w("ensemble_scheduling.step[1].output_map[\"invalid_output\"]", "ensemble tensor temp_tensor_2 is mapped from non-existing output invalid_output in model fp32_dim1_batch4_output3"),
	"ensemble/model_warm_up_set":             w("model_warmup", "model_warmup can not be specified for ensemble 'model_warmup_set'"),
	"ensemble/no_model_name":                 w("ensemble_scheduling.step[1].model_name", "must specify 'model_name' in step 1"),
	"ensemble/no_output_map":                 w("ensemble_scheduling.step[1].output_map", "must specify 'output_map' in step 1"),
	"ensemble/no_required_version_2":         w("ensemble_scheduling.step[1].model_version", "depends on 'simple' whose required version 2 is not loaded"),
	"ensemble/no_required_version_3":         w("ensemble_scheduling.step[0].model_version", "depends on 'simple' whose required version 2 is not loaded"),
	"ensemble/no_step":                       w("ensemble_scheduling.step", "must specify 'step' for ensemble 'no_step'"),
	"ensemble/non_existing_model":            w("ensemble_scheduling.step[2].model_name", "not available or ambiguous: fp32_dim1_batch4_input4"),
	"ensemble/optimization_set":              w("optimization", "optimization should not be specified for ensemble 'optimization_set'"),
	"ensemble/redundant_tensor_as_input":     w("ensemble_scheduling", "ensemble tensor 'temp_tensor_6' is unused"),
	"ensemble/redundant_tensor_as_output":    w("ensemble_scheduling", "ensemble tensor 'temp_tensor_2' is unused"),
	"ensemble/tensor_to_input_overmapped":    w("ensemble_scheduling", "ensemble tensor 'temp_tensor_5' is unused"),
	"ensemble/unmapped_input":                w("ensemble_scheduling.step[1].input_map", "input INPUT0 in model fp32_dim1_batch4_input4 is not mapped to any ensemble tensors"),
	"ensemble/unreachable_input":             w("input[1]", "ensemble input 'data_2'", "is not used"),
	"ensemble/unreachable_output_2":          w("output[1]", "output 'prob_2' for ensemble 'unreachable_output_2' is not written"),
	"ensemble/unreachable_output_3":          w("output[1]", "output 'prob_2' for ensemble 'unreachable_output_3' is not written", "'not_written_tensor'"),
	"onnx/bad_max_batch_size":                w("max_batch_size", "does not support batching while non-zero max_batch_size is specified"),
	"onnx/bad_output_dims":                   w("output[1].dims", "output 'OUTPUT1': the model expects 2 dimensions (shape [-1,16])", "complete shape [-1,1]"),
	"onnx/too_many_inputs":                   w("input", "configuration expects 3 inputs, model provides 2"),
	"onnx/unknown_input":                     w("input[1].name", "unexpected inference input 'INPUT_UNKNOWN', allowed inputs are: INPUT0, INPUT1"),
	"onnx/unknown_output":                    w("output[0].name", "unexpected inference output 'OUTPUT_UNKNOWN', allowed outputs are: OUTPUT0, OUTPUT1"),
}

func TestTritonAutofillNegativeSuite(t *testing.T) {
	root := testutil.Corpus(t, "triton-configs", "L0_model_config", "autofill_noplatform")
	cases := make([]string, 0, len(autofillWant))
	for c := range autofillWant {
		cases = append(cases, c)
	}
	sort.Strings(cases)
	caught := 0
	for _, name := range cases {
		wnt := autofillWant[name]
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(root, filepath.FromSlash(name))
			if _, err := os.Stat(dir); err != nil {
				t.Fatalf("case directory missing: %v", err)
			}
			ps, err := LintPath(dir, LintOptions{})
			if err != nil {
				t.Fatalf("LintPath(%s) = %v", name, err)
			}
			if !hasProblem(ps, wnt.path, wnt.keywords...) {
				t.Errorf("LintPath(%s) =\n%s\nwant an error at %s containing %q", name, problemList(ps), wnt.path, wnt.keywords)
				return
			}
			caught++
		})
	}
	t.Logf("autofill_noplatform (cases with their files present): caught %d of %d", caught, len(cases))
}

func problemList(ps Problems) string {
	var sb strings.Builder
	for _, p := range ps {
		sb.WriteString("  " + p.String() + "\n")
	}
	return sb.String()
}

func TestTritonSpecialCases(t *testing.T) {
	root := testutil.Corpus(t, "triton-configs", "L0_model_config")
	for name, wnt := range map[string]want{
		"special_cases/invalid_platform": w("platform", "unknown platform \"onnxruntim\""),
		"special_cases/runtime_escape":   w("runtime", "'../dummy_runtime/libtriton_identity.so'", "escapes the backend directory"),
	} {
		t.Run(name, func(t *testing.T) {
			ps, err := LintFile(filepath.Join(root, name, ConfigFile), LintOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !hasProblem(ps, wnt.path, wnt.keywords...) {
				t.Errorf("LintFile(%s) = %v, want an error at %s containing %q", name, ps, wnt.path, wnt.keywords)
			}
		})
	}
	base := "name: \"m\"\nbackend: \"onnxruntime\"\nmax_batch_size: 1\ninput [ { name: \"x\" data_type: TYPE_FP32 dims: [ 1 ] } ]\noutput [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
	for name, wnt := range map[string]want{
		"empty_buckets":        w("model_metrics.metric_control[0].histogram_options.buckets", "histogram options must specify non-empty 'buckets'"),
		"empty_metric_family":  w("model_metrics.metric_control[0].metric_identifier.family", "metric identifier must specify non-empty 'family'"),
		"no_histogram_options": w("model_metrics.metric_control[0].histogram_options", "metric control must specify 'histogram_options'"),
		"no_metric_family":     w("model_metrics.metric_control[0].metric_identifier.family", "metric identifier must specify non-empty 'family'"),
	} {
		t.Run("model_metrics/"+name, func(t *testing.T) {
			partial, err := os.ReadFile(filepath.Join(root, "model_metrics", "invalid_config", name, "partial.pbtxt"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(append([]byte(base), partial...))
			if err != nil {
				t.Fatal(err)
			}
			if ps := Validate(c, ValidateOptions{}); !hasProblem(ps, wnt.path, wnt.keywords...) {
				t.Errorf("Validate(%s) = %v, want an error at %s containing %q", name, ps, wnt.path, wnt.keywords)
			}
		})
	}
}

func TestTritonAutofillSuccessONNX(t *testing.T) {
	root := testutil.Corpus(t, "triton-configs", "L0_model_config", "autofill_noplatform_success", "onnx")
	for _, tc := range []struct {
		name string
		gen  GenerateOptions
	}{
		{"no_config", GenerateOptions{Name: "no_config"}},
		{"no_config_no_batch", GenerateOptions{Name: "no_config_no_batch", InstanceKind: "cpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(root, tc.name)
			sig, err := LoadSignature(filepath.Join(dir, "1", "model.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			var expected []*configpb.ModelConfig
			files, _ := filepath.Glob(filepath.Join(dir, "expected*"))
			for _, f := range files {
				c, err := ParseFile(f)
				if err != nil {
					t.Fatal(err)
				}
				expected = append(expected, c)
			}
			if len(expected) == 0 {
				t.Fatal("no expected files")
			}
			matches := func(c *configpb.ModelConfig) bool {
				for _, e := range expected {
					if proto.Equal(e, c) {
						return true
					}
				}
				return false
			}
			// Triton's own path: the case's config (if any) auto-completed.
			c := &configpb.ModelConfig{}
			if data, err := os.ReadFile(filepath.Join(dir, ConfigFile)); err == nil {
				if c, err = Parse(data); err != nil {
					t.Fatal(err)
				}
			}
			if err := Autofill(c, tc.name, sig, AutofillOptions{DefaultMaxBatchSize: DefaultMaxBatchSize, GPUs: []int32{0}, Normalize: true}); err != nil {
				t.Fatalf("Autofill = %v", err)
			}
			if !matches(c) {
				t.Errorf("Autofill(%s) =\n%s\nwant one of the expected files", tc.name, Print(c))
			}
			// kiln's generator with Triton's defaults.
			opts := tc.gen
			opts.Complete, opts.GPUs = true, []int32{0}
			g, err := Generate(sig, opts)
			if err != nil {
				t.Fatalf("Generate = %v", err)
			}
			if !matches(g) {
				t.Errorf("Generate(%s) =\n%s\nwant one of the expected files", tc.name, Print(g))
			}
		})
	}
}
