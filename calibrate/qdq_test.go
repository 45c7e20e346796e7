package calibrate

import (
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// rangesFor gives every observed tensor of m a range of amax 4.
func rangesFor(t *testing.T, m *onnx.Model) Ranges {
	t.Helper()
	names, err := Observed(m)
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges{Version: RangesVersion, Method: MinMax}
	for _, n := range names {
		r.Tensors = append(r.Tensors, TensorRange{Tensor: n, Method: MinMax, Amax: 4, Scale: 4.0 / 127})
	}
	return r
}

func TestQuantizePlacement(t *testing.T) {
	m := &onnx.Model{Proto: testmodels.Classifier(1)}
	q, err := Quantize(m, rangesFor(t, m), QuantizeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Activations: the image, inputs of every Conv and the Gemm, and the
	// skip input of each residual Add (the Conv branch is not quantized).
	want := []string{"images", "Conv_1_out", "Relu_3_out", "Add_5_out", "Relu_7_out", "AveragePool_10_out", "Flatten_13_out"}
	if !slices.Equal(q.Activations, want) {
		t.Errorf("Quantize().Activations = %v, want %v", q.Activations, want)
	}
	axes := map[string]int{}
	for _, w := range q.Weights {
		axes[w.Tensor] = w.Axis
	}
	if axes["stem.weight"] != 0 || axes["fc.weight"] != 1 || len(axes) != 7 {
		t.Errorf("weight axes = %v, want Conv 0 and Gemm(transB=0) 1 for 7 weights", axes)
	}
	if q.Opset != 13 || q.Model.Opset() != 13 {
		t.Errorf("opset = %d / %d, want 13", q.Opset, q.Model.Opset())
	}
	g := q.Model.Graph()
	ix := onnx.NewIndex(g)
	for _, n := range g.GetNode() {
		switch n.GetOpType() {
		case "QuantizeLinear", "DequantizeLinear":
			if len(n.GetInput()) != 3 {
				t.Fatalf("%s %s has %d inputs, want 3 (zero point always present)", n.GetOpType(), n.GetName(), len(n.GetInput()))
			}
			zp, scale := ix.Initializers[n.GetInput()[2]], ix.Initializers[n.GetInput()[1]]
			if onnx.DataType(zp.GetDataType()) != onnx.Int8 {
				t.Errorf("%s zero point is %v, want int8", n.GetName(), onnx.DataType(zp.GetDataType()))
			}
			st, _ := onnx.Decode(scale)
			for _, s := range st.Data.([]float32) {
				if !(s > 0) {
					t.Errorf("%s scale %v, want > 0", n.GetName(), s)
				}
			}
		case "Add":
			if !slices.Contains(n.GetInput(), "Conv_4_out") && !slices.Contains(n.GetInput(), "Conv_8_out") {
				t.Errorf("Add %s inputs %v: the Conv branch input must stay unquantized", n.GetName(), n.GetInput())
			}
		}
	}
	if ix.Initializers["fc.weight"] != nil {
		t.Errorf("the fp32 weight fc.weight is still in the model")
	}
	if ix.Initializers["fc.bias"] == nil || onnx.DataType(ix.Initializers["fc.bias"].GetDataType()) != onnx.Float {
		t.Errorf("the bias must stay an fp32 initializer")
	}
}

func TestWeightAxis(t *testing.T) {
	node := func(op string, transB int64) *onnxpb.NodeProto {
		n := &onnxpb.NodeProto{OpType: &op}
		if transB >= 0 {
			n.Attribute = []*onnxpb.AttributeProto{intAttrProto("transB", transB)}
		}
		return n
	}
	tests := []struct {
		op     string
		transB int64
		rank   int
		want   int
	}{
		{"Conv", -1, 4, 0}, {"ConvTranspose", -1, 4, 1}, {"Gemm", -1, 2, 1}, {"Gemm", 0, 2, 1},
		{"Gemm", 1, 2, 0}, {"MatMul", -1, 2, 1}, {"MatMul", -1, 3, 2}, {"MatMul", -1, 1, -1}, {"Relu", -1, 2, -1},
	}
	for _, tt := range tests {
		if got := weightAxis(node(tt.op, tt.transB), 1, tt.rank); got != tt.want {
			t.Errorf("weightAxis(%s transB=%d, rank %d) = %d, want %d", tt.op, tt.transB, tt.rank, got, tt.want)
		}
	}
}

func TestQuantizeWeight(t *testing.T) {
	w, _ := onnx.NewTensor("w", []int64{2, 3}, []float32{1, -2, 0.5, 0, 0, 0})
	p, _ := onnx.Encode(w, onnx.Raw)
	q, s, err := quantizeWeight(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{2.0 / 127, 1}; !slices.Equal(s, want) {
		t.Errorf("quantizeWeight scales = %v, want %v (an all-zero channel gets 1)", s, want)
	}
	if want := []int8{64, -127, 32, 0, 0, 0}; !slices.Equal(q, want) {
		t.Errorf("quantizeWeight values = %v, want %v (round half to even)", q, want)
	}
}

func TestRaiseOpsetSoftmax(t *testing.T) {
	b := testmodels.NewBuilder("sm", 1)
	x := b.Input("x", onnx.Float, 2, 3, 4)
	b.Node("Softmax", []string{b.Node("Dropout", []string{x})})
	b.Rename("y")
	b.Output("y", onnx.Float, 2, 3, 4)
	m := &onnx.Model{Proto: b.Model(9, 3)}
	got, err := raiseOpset(m, 13)
	if err != nil || got != 13 {
		t.Fatalf("raiseOpset(9 -> 13) = %d, %v", got, err)
	}
	var ops []string
	for _, n := range m.Graph().GetNode() {
		ops = append(ops, n.GetOpType())
	}
	if want := []string{"Identity", "Shape", "Flatten", "Softmax", "Reshape"}; !slices.Equal(ops, want) {
		t.Errorf("raiseOpset rewrote to %v, want %v", ops, want)
	}
	b = testmodels.NewBuilder("slice", 1)
	b.Node("Slice", []string{b.Input("x", onnx.Float, 4)})
	if _, err := raiseOpset(&onnx.Model{Proto: b.Model(9, 3)}, 13); err == nil {
		t.Errorf("raiseOpset over Slice-1 = nil error, want a refusal")
	}
}
