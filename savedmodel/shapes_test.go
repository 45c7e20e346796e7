package savedmodel_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// checkDeclared checks that the shape the ONNX graph declares for output
// name agrees with the one ONNX Runtime produced (same rank, every known
// dimension equal) and reports whether it was fully known.
func checkDeclared(t *testing.T, m *onnx.Model, name string, actual []int64) bool {
	t.Helper()
	i := slices.IndexFunc(m.Outputs(), func(v onnx.ValueInfo) bool { return v.Name == name })
	if i < 0 {
		t.Fatalf("no graph output %s", name)
	}
	s := m.Outputs()[i].Shape
	if !s.Ranked {
		return false
	}
	if len(s.Dims) != len(actual) {
		t.Errorf("output %s declared %s, ONNX Runtime gives %v", name, s, actual)
		return false
	}
	full := true
	for j, d := range s.Dims {
		switch {
		case !d.Known:
			full = false
		case d.Value != actual[j]:
			t.Errorf("output %s declared %s, ONNX Runtime gives %v", name, s, actual)
		}
	}
	return full
}

// writeModel writes g with one input x (signature shape sigX, nil: unknown
// rank) and output y bound to out with no shape.
func writeModel(t *testing.T, g *smtest.Graph, sigX []int64, out string) string {
	t.Helper()
	dir := t.TempDir()
	err := g.Write(dir, smtest.Signature{
		Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: smpb.DataType_DT_FLOAT, Dims: sigX}},
		Outputs: map[string]smtest.Arg{"y": {Tensor: out + ":0", DType: smpb.DataType_DT_FLOAT}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func convertModel(t *testing.T, dir string, o savedmodel.ConvertOptions) (*savedmodel.Conversion, error) {
	t.Helper()
	m, err := savedmodel.Open(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return savedmodel.Convert(context.Background(), m, o)
}

// TestShapeInference: where the signature leaves shapes unknown, the
// Placeholder's shape attribute, _output_shapes attributes and the op
// rules complete them, and ONNX Runtime's result agrees.
func TestShapeInference(t *testing.T) {
	w := random(0.3, 3, 3, 2, 4)
	for _, tc := range []struct {
		name        string
		placeholder []int64 // the Placeholder's own shape attribute
		feed        []int64
		build       func(g *smtest.Graph) string
		wantIn      []int64
		wantOut     []int64
	}{
		{"matmul", []int64{-1, 4}, []int64{5, 4}, func(g *smtest.Graph) string {
			return g.Node("r", "MatMul", f32, "x", g.Floats("w", []int64{4, 3}, f32s(random(1.1, 4, 3))...))
		}, []int64{-1, 4}, []int64{-1, 3}},
		{"conv pool mean", []int64{-1, 9, 9, 2}, []int64{2, 9, 9, 2}, func(g *smtest.Graph) string {
			cv := g.Node("cv", "Conv2D", smtest.Attrs{"padding": smtest.Str("SAME"), "strides": smtest.List(1, 2, 2, 1)}, "x",
				g.Floats("k", []int64{3, 3, 2, 4}, f32s(w)...))
			r := g.Node("relu", "Relu", f32, g.Node("b", "BiasAdd", f32, cv, g.Floats("bias", []int64{4}, 0.1, 0.2, 0.3, 0.4)))
			p := g.Node("p", "MaxPool", smtest.Attrs{"padding": smtest.Str("VALID"), "ksize": smtest.List(1, 2, 2, 1), "strides": smtest.List(1, 2, 2, 1)}, r)
			return g.Node("r", "Mean", smtest.Attrs{"keep_dims": smtest.Bool(false)}, p, g.Ints("axes", 1, 2))
		}, []int64{-1, 9, 9, 2}, []int64{-1, 4}},
		{"reshape transpose concat", []int64{2, 3, 4}, []int64{2, 3, 4}, func(g *smtest.Graph) string {
			r := g.Node("rs", "Reshape", nil, "x", g.Ints("s", -1, 6))
			tr := g.Node("tr", "Transpose", nil, r, g.Ints("perm", 1, 0))
			e := g.Node("e", "ExpandDims", nil, tr, g.Int("ax", 0))
			c := g.Node("c", "ConcatV2", smtest.Attrs{"N": smtest.Int64(2)}, e, e, g.Int("cax", 0))
			return g.Node("r", "Squeeze", smtest.Attrs{"squeeze_dims": smtest.List(2)}, g.Node("p", "Pack", smtest.Attrs{"axis": smtest.Int64(2)}, c))
		}, []int64{2, 3, 4}, []int64{2, 6, 4}},
		{"broadcast", nil, []int64{3, 1}, func(g *smtest.Graph) string {
			return g.Node("r", "AddV2", f32, "x", g.Floats("row", []int64{1, 5}, 1, 2, 3, 4, 5))
		}, []int64{3, 1}, []int64{3, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &smtest.Graph{}
			g.Placeholder("x", smpb.DataType_DT_FLOAT, tc.placeholder)
			out := tc.build(g)
			var sig []int64
			if tc.placeholder == nil {
				sig = tc.feed // the signature knows it, the Placeholder does not
			}
			c, err := convertModel(t, writeModel(t, g, sig, out), savedmodel.ConvertOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if in := c.Inputs[0]; !slices.Equal(in.Shape, tc.wantIn) || in.UnknownRank {
				t.Errorf("input x shape %v (unknown rank %v), want %v", in.Shape, in.UnknownRank, tc.wantIn)
			}
			if o := c.Outputs[0]; !slices.Equal(o.Shape, tc.wantOut) || o.ShapeFrom != savedmodel.ShapeFromGraph {
				t.Errorf("output y shape %v from %q, want %v inferred", o.Shape, o.ShapeFrom, tc.wantOut)
			}
			x := random(0.5, intDims(tc.feed)...)
			got := runModel(t, c.Model, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: tc.feed, Data: f32s(x)}})
			checkDeclared(t, c.Model, "y", got["y"].Dims)
		})
	}
}

func intDims(d []int64) []int {
	out := make([]int, len(d))
	for i, v := range d {
		out[i] = int(v)
	}
	return out
}

// TestShapeFromOutputShapesAttr: an op with no shape rule (Einsum) takes
// its output's shape from the node's _output_shapes attribute.
func TestShapeFromOutputShapesAttr(t *testing.T) {
	g := &smtest.Graph{}
	g.Placeholder("x", smpb.DataType_DT_FLOAT, []int64{-1, 4})
	out := g.Node("r", "Einsum", smtest.Attrs{"equation": smtest.Str("bi,ij->bj"), "N": smtest.Int64(2), "T": smtest.Type(smpb.DataType_DT_FLOAT),
		"_output_shapes": {Value: &smpb.AttrValue_List{List: &smpb.AttrValue_ListValue{Shape: []*smpb.TensorShapeProto{smtest.ShapeProto([]int64{-1, 2})}}}}},
		"x", g.Floats("w", []int64{4, 2}, 1, 2, 3, 4, 5, 6, 7, 8))
	c, err := convertModel(t, writeModel(t, g, nil, out), savedmodel.ConvertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Outputs[0]; !slices.Equal(o.Shape, []int64{-1, 2}) {
		t.Errorf("output shape %v (%s), want [-1 2] from _output_shapes", o.Shape, o.ShapeFrom)
	}
	got := runModel(t, c.Model, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{3, 4}, Data: make([]float32, 12)}})
	checkDeclared(t, c.Model, "y", got["y"].Dims)
}

// TestGivenShapes: a shape given for an input TensorFlow left unranked
// gives the ONNX input its rank (-1 dynamic) and propagates; a given
// shape contradicting what is known, or naming no input, is refused.
func TestGivenShapes(t *testing.T) {
	g := &smtest.Graph{}
	g.Placeholder("x", smpb.DataType_DT_FLOAT, nil)
	out := g.Node("r", "AddV2", f32, g.Node("m", "Mul", f32, "x", g.Floats("a", nil, 0.5)), g.Floats("b", nil, 2))
	dir := writeModel(t, g, nil, out)
	c, err := convertModel(t, dir, savedmodel.ConvertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Inputs[0].UnknownRank || !c.Outputs[0].UnknownRank || c.Model.Inputs()[0].Shape.Ranked {
		t.Fatalf("nothing given: input %+v output %+v, want both unranked", c.Inputs[0], c.Outputs[0])
	}
	c, err = convertModel(t, dir, savedmodel.ConvertOptions{Shapes: map[string][]int64{"x": {-1, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	in, o := c.Inputs[0], c.Outputs[0]
	if !slices.Equal(in.Shape, []int64{-1, 3}) || in.ShapeFrom != savedmodel.ShapeFromGiven || !slices.Equal(o.Shape, []int64{-1, 3}) || o.ShapeFrom != savedmodel.ShapeFromGraph {
		t.Errorf("given x=-1x3: input %+v output %+v", in, o)
	}
	if s := c.Model.Inputs()[0].Shape; s.String() != "[?,3]" {
		t.Errorf("ONNX input shape %s, want [?,3]", s)
	}
	got := runModel(t, c.Model, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{2, 3}, Data: []float32{0, 1, 2, 3, 4, 5}}})
	checkDeclared(t, c.Model, "y", got["y"].Dims)
	if y := floats(t, got["y"]); y[5] != 4.5 {
		t.Errorf("y = %v, want 0.5x+2", y)
	}

	g2 := &smtest.Graph{}
	g2.Placeholder("x", smpb.DataType_DT_FLOAT, []int64{-1, 4})
	known := writeModel(t, g2, nil, g2.Node("r", "Relu", f32, "x"))
	for _, tc := range []struct {
		shapes map[string][]int64
		want   []string
	}{
		{map[string][]int64{"x": {-1, 4, 1}}, []string{"signature input x", "rank 2", "[-1,4,1]"}},
		{map[string][]int64{"x": {8, 5}}, []string{"signature input x", "[-1,4]", "dimension 1"}},
		{map[string][]int64{"X": {8, 4}}, []string{`"X"`, "not an input", "inputs: x"}},
	} {
		_, err := convertModel(t, known, savedmodel.ConvertOptions{Shapes: tc.shapes})
		wantErr(t, err, tc.want...)
	}
	c, err = convertModel(t, known, savedmodel.ConvertOptions{Shapes: map[string][]int64{"x": {8, -1}}})
	if err != nil || !slices.Equal(c.Inputs[0].Shape, []int64{8, 4}) {
		t.Errorf("x=8x-1 on [-1,4]: %v, shape %v, want [8 4]", err, c.Inputs[0].Shape)
	}
}
