package savedmodel_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// tfGraph builds a tiny TF1-style graph in Go.
type tfGraph struct{ nodes []*smpb.NodeDef }

func (g *tfGraph) node(name, op string, attr map[string]*smpb.AttrValue, in ...string) string {
	g.nodes = append(g.nodes, &smpb.NodeDef{Name: name, Op: op, Input: in, Attr: attr})
	return name
}

func shapeProto(dims []int64) *smpb.TensorShapeProto {
	s := &smpb.TensorShapeProto{}
	for _, d := range dims {
		s.Dim = append(s.Dim, &smpb.TensorShapeProto_Dim{Size: d})
	}
	return s
}

func (g *tfGraph) floats(name string, dims []int64, v ...float32) string {
	return g.node(name, "Const", map[string]*smpb.AttrValue{"dtype": typ(smpb.DataType_DT_FLOAT), "value": {Value: &smpb.AttrValue_Tensor{
		Tensor: &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shapeProto(dims), FloatVal: v}}}})
}

func (g *tfGraph) ints(name string, v ...int32) string {
	return g.node(name, "Const", map[string]*smpb.AttrValue{"dtype": typ(smpb.DataType_DT_INT32), "value": {Value: &smpb.AttrValue_Tensor{
		Tensor: &smpb.TensorProto{Dtype: smpb.DataType_DT_INT32, TensorShape: shapeProto([]int64{int64(len(v))}), IntVal: v}}}})
}

func typ(t smpb.DataType) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_Type{Type: t}}
}
func str(s string) *smpb.AttrValue { return &smpb.AttrValue{Value: &smpb.AttrValue_S{S: []byte(s)}} }
func i64(v int64) *smpb.AttrValue  { return &smpb.AttrValue{Value: &smpb.AttrValue_I{I: v}} }
func flag(v bool) *smpb.AttrValue  { return &smpb.AttrValue{Value: &smpb.AttrValue_B{B: v}} }
func list(v ...int64) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_List{List: &smpb.AttrValue_ListValue{I: v}}}
}

var fT = map[string]*smpb.AttrValue{"T": typ(smpb.DataType_DT_FLOAT)}

// model wraps the graph as a SavedModel with input x and output y.
func (g *tfGraph) model(xDims []int64, out string) *savedmodel.Model {
	info := func(name string, dims []int64) *smpb.TensorInfo {
		return &smpb.TensorInfo{Encoding: &smpb.TensorInfo_Name{Name: name}, Dtype: smpb.DataType_DT_FLOAT, TensorShape: shapeProto(dims)}
	}
	mg := &smpb.MetaGraphDef{
		MetaInfoDef: &smpb.MetaInfoDef{Tags: []string{"serve"}},
		GraphDef:    &smpb.GraphDef{Node: g.nodes},
		SignatureDef: map[string]*smpb.SignatureDef{"serving_default": {
			Inputs: map[string]*smpb.TensorInfo{"x": info("x:0", xDims)},
			Outputs: map[string]*smpb.TensorInfo{"y": {Encoding: &smpb.TensorInfo_Name{Name: out}, Dtype: smpb.DataType_DT_FLOAT,
				TensorShape: &smpb.TensorShapeProto{UnknownRank: true}}},
		}},
	}
	return &savedmodel.Model{Dir: "mem", Proto: &smpb.SavedModel{MetaGraphs: []*smpb.MetaGraphDef{mg}}}
}

func TestOps(t *testing.T) {
	x4 := []float32{1, -2, 3, 4}
	for _, tc := range []struct {
		name  string
		build func(g *tfGraph) string
		x     []float32
		dims  []int64
		want  []float64
	}{
		{"Relu6", func(g *tfGraph) string { return g.node("r", "Relu6", fT, "x") }, []float32{-1, 3, 7, 6}, []int64{4}, []float64{0, 3, 6, 6}},
		{"Rsqrt", func(g *tfGraph) string { return g.node("r", "Rsqrt", fT, "x") }, []float32{1, 4, 16, 0.25}, []int64{4}, []float64{1, 0.5, 0.25, 2}},
		{"SquaredDifference", func(g *tfGraph) string {
			return g.node("r", "SquaredDifference", fT, "x", g.floats("c", []int64{}, 1))
		}, x4, []int64{4}, []float64{0, 9, 4, 9}},
		{"DivNoNan", func(g *tfGraph) string {
			return g.node("r", "DivNoNan", fT, g.floats("c", []int64{}, 6), "x")
		}, []float32{0, 2, 3, -6}, []int64{4}, []float64{0, 3, 2, -1}},
		{"Mean", func(g *tfGraph) string {
			return g.node("r", "Mean", map[string]*smpb.AttrValue{"keep_dims": flag(false)}, "x", g.ints("a", 1))
		}, x4, []int64{2, 2}, []float64{-0.5, 3.5}},
		{"Sum", func(g *tfGraph) string { return g.node("r", "Sum", nil, "x", g.ints("a", 0)) }, x4, []int64{2, 2}, []float64{4, 2}},
		{"MatMul/transpose_b", func(g *tfGraph) string {
			return g.node("r", "MatMul", map[string]*smpb.AttrValue{"transpose_b": flag(true)}, "x", g.floats("w", []int64{1, 2}, 1, 10))
		}, x4, []int64{2, 2}, []float64{-19, 43}},
		{"StridedSlice/shrink", func(g *tfGraph) string {
			return g.node("r", "StridedSlice", map[string]*smpb.AttrValue{"shrink_axis_mask": i64(2), "begin_mask": i64(1), "end_mask": i64(1)},
				"x", g.ints("b", 0, 1), g.ints("e", 0, 2), g.ints("s", 1, 1))
		}, x4, []int64{2, 2}, []float64{-2, 4}},
		{"Pack+ConcatV2", func(g *tfGraph) string {
			p := g.node("p", "Pack", map[string]*smpb.AttrValue{"axis": i64(0)}, "x", "x")
			return g.node("r", "ConcatV2", nil, p, p, g.ints("a", 1))
		}, []float32{1, 2}, []int64{2}, []float64{1, 2, 1, 2, 1, 2, 1, 2}},
		{"Transpose", func(g *tfGraph) string { return g.node("r", "Transpose", nil, "x", g.ints("p", 1, 0)) }, x4, []int64{2, 2}, []float64{1, 3, -2, 4}},
		{"Conv2D+BiasAdd+Relu (NHWC)", func(g *tfGraph) string {
			// a 2x2 all-ones kernel over a 1x3x3x1 image, bias -10
			w := g.floats("w", []int64{2, 2, 1, 1}, 1)
			cv := g.node("cv", "Conv2D", map[string]*smpb.AttrValue{"padding": str("VALID"), "strides": list(1, 1, 1, 1)}, "x", w)
			b := g.node("b", "BiasAdd", nil, cv, g.floats("bias", []int64{1}, -10))
			return g.node("r", "Relu", nil, b)
		}, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}, []int64{1, 3, 3, 1}, []float64{2, 6, 14, 18}},
		{"MaxPool SAME", func(g *tfGraph) string {
			return g.node("r", "MaxPool", map[string]*smpb.AttrValue{"padding": str("SAME"), "ksize": list(1, 2, 2, 1), "strides": list(1, 2, 2, 1)}, "x")
		}, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}, []int64{1, 3, 3, 1}, []float64{5, 6, 8, 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &tfGraph{}
			g.node("x", "Placeholder", map[string]*smpb.AttrValue{"dtype": typ(smpb.DataType_DT_FLOAT)})
			out := tc.build(g)
			c, err := savedmodel.Convert(context.Background(), g.model(tc.dims, out+":0"), savedmodel.ConvertOptions{})
			if err != nil {
				t.Fatalf("Convert = %v", err)
			}
			got := runModel(t, c.Model, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: tc.dims, Data: tc.x}})
			compare(t, "y", floats(t, got["y"]), tc.want, 1e-6)
		})
	}
}

func TestUnsupportedOpsListedAtOnce(t *testing.T) {
	g := &tfGraph{}
	g.node("x", "Placeholder", nil)
	a := g.node("a", "FancyOp", nil, "x")
	b := g.node("b", "OtherOp", nil, a)
	_, err := savedmodel.Convert(context.Background(), g.model([]int64{1}, b+":0"), savedmodel.ConvertOptions{})
	var u *savedmodel.UnsupportedOpsError
	if !errors.As(err, &u) || len(u.Ops) != 2 {
		t.Fatalf("Convert = %v, want an UnsupportedOpsError naming 2 nodes", err)
	}
	for _, s := range []string{"a (op FancyOp)", "b (op OtherOp)", "saved_model.pb"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestConvertTransposesCancel(t *testing.T) {
	g := &tfGraph{}
	g.node("x", "Placeholder", nil)
	w := g.floats("w", []int64{1, 1, 1, 1}, 2)
	cv := g.node("c1", "Conv2D", map[string]*smpb.AttrValue{"padding": str("SAME")}, "x", w)
	r := g.node("r", "Relu", nil, cv)
	c2 := g.node("c2", "Conv2D", map[string]*smpb.AttrValue{"padding": str("SAME")}, r, w)
	c, err := savedmodel.Convert(context.Background(), g.model([]int64{1, 2, 2, 1}, c2+":0"), savedmodel.ConvertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Model.OpCounts()["Transpose"]; n != 2 {
		t.Errorf("Transposes after optimizing = %d, want 2 (one at each edge)", n)
	}
}
