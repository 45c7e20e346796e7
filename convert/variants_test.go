package convert

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

func TestCheckPlan(t *testing.T) {
	m, err := onnx.Load(tinynet)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ids  []string
		o    PlanOptions
		want string
	}{
		{[]string{"onnx-int8"}, PlanOptions{}, "int8 needs calibration"},
		{[]string{"onnx-int8"}, PlanOptions{RandomRanges: true}, "int8 needs calibration"},
		{[]string{"trt-int8"}, PlanOptions{RandomRanges: true}, ""},
		{[]string{"onnx-fp32-b8"}, PlanOptions{}, ""},
	}
	for _, c := range cases {
		_, err := CheckPlan(m, variants(t, c.ids...), c.o)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckPlan(%v, %+v) = %v, want %q", c.ids, c.o, err, c.want)
		}
	}
}

// The flags' values are checked when the command line is parsed (cmd's
// TestFlagValuesCheckedAtParse: fp8, --max-batch -2); the matrix expands them.
func TestMatrixExpand(t *testing.T) {
	mx := Matrix{Precisions: []manifest.Precision{manifest.FP32, manifest.FP16}, Runtimes: []manifest.Runtime{manifest.RuntimeONNX, manifest.RuntimeTRT}, MaxBatches: []int{1, 16}}
	if n := len(mx.Expand()); n != 8 {
		t.Errorf("Expand() = %d variants, want 8", n)
	}
	if got := (Matrix{}).Expand(); len(got) != 1 || got[0] != (manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: manifest.FP32}) {
		t.Errorf("Matrix{}.Expand() = %+v, want the one default variant onnx-fp32", got)
	}
}
