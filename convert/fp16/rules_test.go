package fp16

import (
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// layerNormModel is two LayerNorms over the last axis written out as
// paddle2onnx writes them (PP-OCRv4 rec): ReduceMean, Sub, Pow(·, 2) with a
// Constant exponent of its own, ReduceMean, Add(eps), Sqrt, Div, Mul(w),
// Add(b). ONNX Runtime shares the equal exponents (ConstantSharing) and
// fuses each pattern into LayerNormalization at its default optimization
// level; with two patterns a float16 exponent broke the second fusion.
func layerNormModel(opset int64, layerNorms int) *onnx.Model {
	b := testmodels.NewBuilder("layernorm", 3)
	y := b.Input("x", onnx.Float, 2, 5, 16)
	for i := range layerNorms {
		w := b.RandNormal(fmt.Sprint("w", i), 1, 16)
		bias := b.RandNormal(fmt.Sprint("b", i), 0.1, 16)
		two := b.Node("Constant", nil, testmodels.Tensor("value", []int64{}, []float32{2}))
		eps := b.Node("Constant", nil, testmodels.Tensor("value", []int64{}, []float32{1e-5}))
		mean := b.Node("ReduceMean", []string{y}, testmodels.Ints("axes", -1))
		d := b.Node("Sub", []string{y, mean})
		p := b.Node("Pow", []string{d, two})
		v := b.Node("ReduceMean", []string{p}, testmodels.Ints("axes", -1))
		s := b.Node("Sqrt", []string{b.Node("Add", []string{v, eps})})
		n := b.Node("Div", []string{d, s})
		y = b.Node("Add", []string{b.Node("Mul", []string{n, w}), bias})
	}
	b.Rename("y")
	b.Output("y", onnx.Float, 2, 5, 16)
	return &onnx.Model{Proto: b.Model(opset, 7)}
}

func TestLayerNormPattern(t *testing.T) {
	initORT(t)
	for _, tc := range []struct {
		opset        int64
		powBlocked   bool
		exponentType onnx.DataType
	}{
		{9, true, onnx.Float},   // Pow-7: the exponent has the base's type
		{11, true, onnx.Float},  // still Pow-7
		{13, false, onnx.Float}, // Pow-12 and later: T1 is free
	} {
		m := layerNormModel(tc.opset, 2)
		h, rep, err := Convert(m, Options{KeepIOTypes: true})
		if err != nil {
			t.Fatalf("opset %d: Convert = %v", tc.opset, err)
		}
		pow := nodeByOp(h, "Pow")
		types := elemTypes(h.Graph(), nil)
		if got := types[pow.GetInput()[1]]; got != tc.exponentType {
			t.Errorf("opset %d: Pow exponent is %s, want %s", tc.opset, got, tc.exponentType)
		}
		if got := contains(rep.BlockedNodes, pow.GetName()); got != tc.powBlocked {
			t.Errorf("opset %d: Pow blocked = %v, want %v (blocked %v)", tc.opset, got, tc.powBlocked, rep.BlockedNodes)
		}
		x, _ := onnx.Random("x", onnx.Float, []int64{2, 5, 16}, 7)
		in := map[string]*onnx.Tensor{"x": x}
		want, err := runModel(m, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := runModel(h, in) // ORT's default level: all optimizations
		if err != nil {
			t.Fatalf("opset %d: running the fp16 model: %v", tc.opset, err)
		}
		if st := compareFP16(t, got["y"], want["y"]); st.bad > 0 || st.cosine < fp16MinCosine {
			t.Errorf("opset %d: %s", tc.opset, st)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestBlockRules checks which nodes stay float32 for what they compute or
// for ONNX Runtime's CPU provider (the backend-suite failures they fix).
func TestBlockRules(t *testing.T) {
	str := func(name, v string) *onnxpb.AttributeProto {
		ty := onnxpb.AttributeProto_STRING
		return &onnxpb.AttributeProto{Name: &name, Type: &ty, S: []byte(v)}
	}
	to := func(dt onnx.DataType) *onnxpb.AttributeProto { return testmodels.Int("to", int64(dt)) }
	for _, tc := range []struct {
		name    string
		opset   int64
		n       *onnxpb.NodeProto
		opts    Options
		blocked bool
	}{
		{"IsInf", 13, node("IsInf", []string{"x"}, []string{"y"}), Options{}, true},
		{"IsInf opset 20", 20, node("IsInf", []string{"x"}, []string{"y"}), Options{OpBlockList: []string{}}, true},
		{"IsNaN", 13, node("IsNaN", []string{"x"}, []string{"y"}), Options{}, false},
		{"Cast to string", 13, node("Cast", []string{"x"}, []string{"y"}, to(onnx.String)), Options{}, true},
		{"Cast to int64", 13, node("Cast", []string{"x"}, []string{"y"}, to(onnx.Int64)), Options{}, true},
		{"Cast to float", 13, node("Cast", []string{"x"}, []string{"y"}, to(onnx.Float)), Options{}, false},
		{"ScatterND add", 16, node("ScatterND", []string{"x", "i", "x"}, []string{"y"}, str("reduction", "add")), Options{}, true},
		{"ScatterND add, empty list", 16, node("ScatterND", []string{"x", "i", "x"}, []string{"y"}, str("reduction", "add")), Options{OpBlockList: []string{}}, false},
		{"ScatterND none", 16, node("ScatterND", []string{"x", "i", "x"}, []string{"y"}, str("reduction", "none")), Options{}, false},
		{"ScatterElements mul", 16, node("ScatterElements", []string{"x", "i", "x"}, []string{"y"}, str("reduction", "mul")), Options{}, true},
		{"MeanVarianceNormalization", 13, node("MeanVarianceNormalization", []string{"x"}, []string{"y"}), Options{}, true},
		{"Pow opset 11", 11, node("Pow", []string{"x", "x"}, []string{"y"}), Options{}, true},
		{"Pow opset 13", 13, node("Pow", []string{"x", "x"}, []string{"y"}), Options{}, false},
	} {
		b := testmodels.NewBuilder("rule", 1)
		b.Input("x", onnx.Float, 2)
		b.Input("i", onnx.Int64, 1, 1)
		mp := b.Model(tc.opset, 8)
		mp.Graph.Node = []*onnxpb.NodeProto{tc.n}
		mp.Graph.Output = []*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, onnx.Shape{})}
		_, rep, err := Convert(&onnx.Model{Proto: mp}, tc.opts)
		if err != nil {
			t.Errorf("%s: Convert = %v", tc.name, err)
			continue
		}
		if got := contains(rep.BlockedNodes, tc.n.GetName()); got != tc.blocked {
			t.Errorf("%s: blocked = %v, want %v (BlockedNodes %v)", tc.name, got, tc.blocked, rep.BlockedNodes)
		}
	}
}
