package pbtxt

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

// CheckSignature against an ONNX model's signature, one case per rule of
// ONNX Runtime's ValidateInputs, ValidateOutputs and AutoCompleteMaxBatch.
func TestCheckSignatureONNX(t *testing.T) {
	model := sigOf(
		[]TensorSig{tsig("images", f32, -1, 3, 224, 224), tsig("scale", f32, -1), {Name: "any", DataType: f32, Unranked: true}, {Name: "opt", DataType: f32, Shape: []int64{-1, 2}, Optional: true}},
		[]TensorSig{tsig("logits", f32, -1, 1000), tsig("count", i32)})
	const (
		images = `{ name: "images" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }`
		scale  = `{ name: "scale" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }`
		anyIn  = `{ name: "any" data_type: TYPE_FP32 dims: [ 5, 5 ] }`
		logits = `{ name: "logits" data_type: TYPE_FP32 dims: [ 1000 ] }`
	)
	batching := func(ins, outs string) string {
		return `platform: "onnxruntime_onnx" max_batch_size: 4 input [ ` + ins + ` ] output [ ` + outs + ` ]`
	}
	for _, tc := range []struct {
		name, config string
		path         string
		keywords     []string
	}{
		{"unknown input", batching(images+`, `+scale+`, `+anyIn+`, { name: "mask" data_type: TYPE_FP32 dims: [ 1 ] }`, logits), "input[3].name",
			[]string{"unexpected inference input 'mask', allowed inputs are: any, images, opt, scale"}},
		{"too many inputs", batching(images+`, `+scale+`, `+anyIn+`, { name: "opt" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "mask" data_type: TYPE_FP32 dims: [ 1 ] }`, logits), "input",
			[]string{"configuration expects 5 inputs, model provides 4"}},
		{"missing input", batching(images+`, `+anyIn, logits), "input",
			[]string{`model input "scale" (TYPE_FP32 [-1]) is missing from the config`}},
		{"input type", batching(`{ name: "images" data_type: TYPE_FP16 dims: [ 3, 224, 224 ] }, `+scale+`, `+anyIn, logits), "input[0].data_type",
			[]string{"unexpected datatype TYPE_FP16 for inference input 'images', expecting TYPE_FP32"}},
		{"output type", batching(images+`, `+scale+`, `+anyIn, `{ name: "logits" data_type: TYPE_FP64 dims: [ 1000 ] }`), "output[0].data_type",
			[]string{"unexpected datatype TYPE_FP64 for inference output 'logits', expecting TYPE_FP32"}},
		{"input dims", batching(`{ name: "images" data_type: TYPE_FP32 dims: [ 3, 256, 256 ] }, `+scale+`, `+anyIn, logits), "input[0].dims",
			[]string{"the model expects 4 dimensions (shape [-1,3,224,224])", "complete shape [-1,3,256,256]", "set dims: [3,224,224]"}},
		{"reshape is what the model sees", batching(`{ name: "images" data_type: TYPE_FP32 dims: [ 150528 ] reshape { shape: [ 3, 224, 225 ] } }, `+scale+`, `+anyIn, logits), "input[0].reshape.shape",
			[]string{"complete shape [-1,3,224,225]", "set reshape.shape: [3,224,224]"}},
		{"scalar output with batching", batching(images+`, `+scale+`, `+anyIn, logits+`, { name: "count" data_type: TYPE_INT32 dims: [ 1 ] }`), "max_batch_size",
			[]string{"does not support batching", "count []"}},
		{"scalar takes only ones", `platform: "onnxruntime_onnx" input [ { name: "images" data_type: TYPE_FP32 dims: [ -1, 3, 224, 224 ] } ] output [ { name: "count" data_type: TYPE_INT32 dims: [ 2 ] } ]`, "output[0].dims",
			[]string{"scalar tensor 'count' should only provide 1", "gives [2]"}},
		{"full shape without batching", `platform: "onnxruntime_onnx" input [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ] output [ { name: "count" data_type: TYPE_INT32 dims: [ 1 ] } ]`, "input[0].dims",
			[]string{"the model expects 4 dimensions (shape [-1,3,224,224]) but the model configuration specifies 3 dimensions", "set dims: [-1,3,224,224]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			ps := CheckSignature(c, model)
			if !findProblem(ps, SeverityError, tc.path, tc.keywords...) {
				t.Errorf("CheckSignature(%s) =\n%s\nwant an error at %s containing %q", tc.name, problemList(ps), tc.path, tc.keywords)
			}
		})
	}
	for _, config := range []string{
		batching(images+`, `+scale+`, `+anyIn, logits),
		`platform: "onnxruntime_onnx" input [ { name: "images" data_type: TYPE_FP32 dims: [ -1, 3, 224, 224 ] }, { name: "scale" data_type: TYPE_FP32 dims: [ -1 ] }, ` + anyIn + ` ] output [ { name: "count" data_type: TYPE_INT32 dims: [ 1 ] } ]`,
	} {
		c, err := Parse([]byte(config))
		if err != nil {
			t.Fatal(err)
		}
		if ps := CheckSignature(c, model); len(ps) != 0 {
			t.Errorf("CheckSignature(%s) =\n%s\nwant no problems", config, problemList(ps))
		}
	}
}

// The whole path on real files: LintRepository reads each model.onnx and
// checks the config against it, and reads initial state files.
func TestLintRepositoryONNXSignature(t *testing.T) {
	repo := t.TempDir()
	mk := func(name, config string, ins, outs []tensor) string {
		t.Helper()
		dir := filepath.Join(repo, name)
		if err := os.MkdirAll(filepath.Join(dir, "1"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		writeONNX(t, filepath.Join(dir, "1", "model.onnx"), ins, outs)
		return dir
	}
	mk("scalar", `platform: "onnxruntime_onnx" input [ { name: "s" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]`,
		[]tensor{{"s", onnx.Float, nil}}, []tensor{{"y", onnx.Float, nil}})
	mk("fixed_batch", `platform: "onnxruntime_onnx" max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]`,
		[]tensor{{"x", onnx.Float, []int64{1, 4}}}, []tensor{{"y", onnx.Float, []int64{1, 4}}})
	seq := mk("stateful", `platform: "onnxruntime_onnx" max_batch_size: 4
		input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 8 ] } ]
		sequence_batching { state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 8 ]
			initial_state [ { name: "h0" data_type: TYPE_FP32 dims: [ 8 ] data_file: "h0.bin" } ] } ] }`,
		[]tensor{{"x", onnx.Float, []int64{-1, 8}}, {"h_in", onnx.Float, []int64{-1, 8}}}, []tensor{{"y", onnx.Float, []int64{-1, 8}}, {"h_out", onnx.Float, []int64{-1, 8}}})
	if err := os.MkdirAll(filepath.Join(seq, "initial_state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seq, "initial_state", "h0.bin"), make([]byte, 16), 0o644); err != nil {
		t.Fatal(err)
	}
	ps, err := LintRepository(repo, LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var scalar Problems
	for _, p := range ps {
		if filepath.Base(p.File) == "scalar" {
			scalar = append(scalar, p)
		}
	}
	if len(scalar) != 0 {
		t.Errorf("LintRepository: a scalar model tensor with dims [1] and no batching has problems\n%s", problemList(scalar))
	}
	if !findProblem(ps, SeverityError, "max_batch_size", "does not support batching while non-zero max_batch_size is specified", "x [1,4]") {
		t.Errorf("LintRepository(fixed batch dimension, max_batch_size 8) =\n%s\nwant the batch reported", problemList(ps))
	}
	if !findProblem(ps, SeverityError, "sequence_batching.state[0].initial_state[0].data_file", "expects 32 bytes (TYPE_FP32 [8])", "h0.bin only has 16 bytes") {
		t.Errorf("LintRepository(short initial state file) =\n%s\nwant its size reported", problemList(ps))
	}
	if err := os.WriteFile(filepath.Join(seq, "initial_state", "h0.bin"), make([]byte, 32), 0o644); err != nil {
		t.Fatal(err)
	}
	if ps, err := LintPath(seq, LintOptions{}); err != nil || len(ps) != 0 {
		t.Errorf("LintPath(stateful model, state matches model.onnx) = %v, %v\nwant no problems", problemList(ps), err)
	}
}
