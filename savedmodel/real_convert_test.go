package savedmodel_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
)

func wave(dims []int64, seed float64) *onnx.Tensor {
	n, _ := onnx.NumElements(dims)
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(0.5*math.Sin(float64(i)*0.0371*seed) + 0.25*math.Sin(float64(i)*0.00513))
	}
	return &onnx.Tensor{Type: onnx.Float, Dims: dims, Data: x}
}

func TestRealTF1Regression(t *testing.T) {
	dir := testutil.Corpus(t, "savedmodel", "real", "tf1-regression-tf2onnx")
	x := []float32{-2, 0, 1, 3.5}
	_, out := importRun(t, dir, savedmodel.ConvertOptions{}, map[string]*onnx.Tensor{"X": {Type: onnx.Float, Dims: []int64{4}, Data: x}})
	want := make([]float64, len(x))
	for i, v := range x {
		want[i] = 0.21396178*float64(v) + 1.0495254
	}
	compare(t, "pred", floats(t, out["pred"]), want, 1e-6)
}

// TestRealBasicPitch compares kiln's import with the upstream tf2onnx
// export stored beside the SavedModel, in ONNX Runtime on the same input.
func TestRealBasicPitch(t *testing.T) {
	dir := testutil.Corpus(t, "savedmodel", "real", "basic-pitch-nmp")
	in := map[string]*onnx.Tensor{"input_2": wave([]int64{1, 43844, 1}, 1)}
	c, got := importRun(t, dir, savedmodel.ConvertOptions{}, in)
	ref, err := onnx.Load(filepath.Join(dir, "reference.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	refIn := map[string]*onnx.Tensor{ref.Inputs()[0].Name: in["input_2"]}
	want := runModel(t, ref, refIn)
	for _, o := range c.Outputs {
		w, ok := want[o.Tensor] // tf2onnx names outputs by graph tensor
		if !ok {
			t.Fatalf("reference.onnx has no output %s (has %v)", o.Tensor, keys(want))
		}
		compare(t, o.Key, floats(t, got[o.ONNX]), floats(t, w), 1e-4)
	}
}

func TestRealKWSDSCNN(t *testing.T) {
	dir := testutil.Corpus(t, "savedmodel", "real", "mlperf-tiny-kws-dscnn")
	_, out := importRun(t, dir, savedmodel.ConvertOptions{}, map[string]*onnx.Tensor{"input_1": wave([]int64{2, 49, 10, 1}, 3)})
	p := floats(t, out["dense"])
	if len(p) != 24 {
		t.Fatalf("dense has %d values, want 24", len(p))
	}
	for b := range 2 {
		sum := 0.0
		for _, v := range p[b*12 : b*12+12] {
			sum += v
		}
		if math.Abs(sum-1) > 1e-5 {
			t.Errorf("softmax row %d sums to %g", b, sum)
		}
	}
}
