package cmd

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

func TestImportCorpus(t *testing.T) {
	dir := testutil.Corpus(t, "savedmodel", "real", "mlperf-tiny-kws-dscnn")
	out := filepath.Join(t.TempDir(), "kws.onnx")
	stdout, stderr, code := run(t, "import", dir, "-o", out, "--format", "json")
	if code != 0 {
		t.Fatalf("import = %d, stderr %s", code, stderr)
	}
	var r importResult
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Inputs) != 1 || r.Inputs[0].ONNX != "input_1" || r.Outputs[0].ONNX != "dense" {
		t.Errorf("import mapping = %+v / %+v, want input_1 -> dense", r.Inputs, r.Outputs)
	}
	m, err := onnx.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.Opset() != 17 || m.Inputs()[0].Name != "input_1" {
		t.Errorf("model opset %d inputs %v", m.Opset(), m.Inputs())
	}
}

func TestImportErrors(t *testing.T) {
	corpus := testutil.Corpus(t, "savedmodel", "tf-serving")
	out := filepath.Join(t.TempDir(), "m.onnx")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"no output", []string{"import", filepath.Join(corpus, "matrix_half_plus_two")}, ExitUsage, []string{"--output is required"}},
		{"no saved_model.pb", []string{"import", filepath.Join(corpus, "bad_half_plus_two"), "-o", out}, ExitFailure, []string{"no saved_model.pb"}},
		// A tf.Example signature takes serialized strings, which ONNX
		// cannot parse: refused naming the signature and its input.
		{"string input", []string{"import", filepath.Join(corpus, "saved_model_half_plus_two_tf2_cpu"), "--signature", "regress_x_to_y", "-o", out},
			ExitFailure, []string{`signature "regress_x_to_y"`, "DT_STRING", "tf.Example"}},
		{"unknown signature", []string{"import", filepath.Join(corpus, "matrix_half_plus_two"), "--signature", "nope", "-o", out}, ExitFailure, []string{`no signature "nope"`}},
		{"opset", []string{"import", filepath.Join(corpus, "matrix_half_plus_two"), "--opset", "9", "-o", out}, ExitFailure, []string{"only opset 17"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := run(t, tc.args...)
			if code != tc.code {
				t.Errorf("%v = exit %d, want %d (stderr %s)", tc.args, code, tc.code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not mention %q", stderr, w)
				}
			}
		})
	}
}
