package savedmodel_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

type opCase struct {
	name  string
	x     nd // the input; its values are fed as float32
	build func(g *smtest.Graph) string
	outDT smpb.DataType // DT_FLOAT when zero
	want  nd
}

var f32 = smtest.Attrs{"T": smtest.Type(smpb.DataType_DT_FLOAT)}

func f32s(a nd) []float32 {
	out := make([]float32, len(a.v))
	for i, v := range a.v {
		out[i] = float32(v)
	}
	return out
}

func dims64(d []int) []int64 {
	out := make([]int64, len(d))
	for i, v := range d {
		out[i] = int64(v)
	}
	return out
}

func random(seed float64, d ...int) nd {
	n := 1
	for _, v := range d {
		n *= v
	}
	return ndOf(seq(n, seed), d...)
}

func unaryCase(op string, f func(float64) float64, attr smtest.Attrs) opCase {
	x := random(1.3, 2, 5)
	return opCase{op, x, func(g *smtest.Graph) string { return g.Node("r", op, attr, "x") }, 0, mapND(x, f)}
}

func nnCases() []opCase {
	x5, w := random(0.7, 1, 5, 5, 2), random(1.9, 3, 3, 2, 3)
	dw := random(2.3, 3, 3, 2, 2)
	x4 := random(0.9, 1, 4, 4, 2)
	bn := random(0.4, 1, 2, 2, 3)
	scale, offset, mean, vari := []float32{1, 2, 0.5}, []float32{0, 0.1, -1}, []float32{0.1, -0.2, 0.3}, []float32{1, 0.25, 4}
	bnWant := newND(bn.d...)
	for i, v := range bn.v {
		c := i % 3
		bnWant.v[i] = (v-float64(mean[c]))/math.Sqrt(float64(vari[c])+0.001)*float64(scale[c]) + float64(offset[c])
	}
	a, b := random(1.1, 2, 3), random(0.3, 3, 4)
	bm, bb := random(1.7, 2, 2, 3), random(0.5, 3, 2)
	return []opCase{
		{"Conv2D SAME stride 2 (VariableV2 kernel)", x5, func(g *smtest.Graph) string {
			k := g.Variable("conv/kernel", dims64(w.d), f32s(w))
			return g.Node("r", "Conv2D", smtest.Attrs{"padding": smtest.Str("SAME"), "strides": smtest.List(1, 2, 2, 1), "data_format": smtest.Str("NHWC")}, "x", k)
		}, 0, conv2D(x5, w, 2, true, false)},
		{"Conv2D VALID", x5, func(g *smtest.Graph) string {
			k := g.ResourceVariable("conv/kernel", dims64(w.d), f32s(w))
			return g.Node("r", "Conv2D", smtest.Attrs{"padding": smtest.Str("VALID"), "strides": smtest.List(1, 1, 1, 1)}, "x", k)
		}, 0, conv2D(x5, w, 1, false, false)},
		{"DepthwiseConv2dNative", x4, func(g *smtest.Graph) string {
			k := g.ResourceVariable("dw/depthwise_kernel", dims64(dw.d), f32s(dw))
			return g.Node("r", "DepthwiseConv2dNative", smtest.Attrs{"padding": smtest.Str("SAME"), "strides": smtest.List(1, 1, 1, 1)}, "x", k)
		}, 0, conv2D(x4, dw, 1, true, true)},
		{"FusedBatchNormV3", bn, func(g *smtest.Graph) string {
			p := []string{g.Variable("bn/gamma", []int64{3}, scale), g.Variable("bn/beta", []int64{3}, offset),
				g.Variable("bn/moving_mean", []int64{3}, mean), g.ResourceVariable("bn/moving_variance", []int64{3}, vari)}
			return g.Node("r", "FusedBatchNormV3", smtest.Attrs{"epsilon": smtest.Float(0.001), "is_training": smtest.Bool(false),
				"data_format": smtest.Str("NHWC")}, append([]string{"x"}, p...)...)
		}, 0, bnWant},
		{"MaxPool VALID", x4, func(g *smtest.Graph) string {
			return g.Node("r", "MaxPool", smtest.Attrs{"padding": smtest.Str("VALID"), "ksize": smtest.List(1, 2, 2, 1), "strides": smtest.List(1, 2, 2, 1)}, "x")
		}, 0, pool(x4, 2, 2, false, true)},
		{"MaxPool SAME 3/2", x5, func(g *smtest.Graph) string {
			return g.Node("r", "MaxPool", smtest.Attrs{"padding": smtest.Str("SAME"), "ksize": smtest.List(1, 3, 3, 1), "strides": smtest.List(1, 2, 2, 1)}, "x")
		}, 0, pool(x5, 3, 2, true, true)},
		{"AvgPool SAME 3/2", x5, func(g *smtest.Graph) string {
			return g.Node("r", "AvgPool", smtest.Attrs{"padding": smtest.Str("SAME"), "ksize": smtest.List(1, 3, 3, 1), "strides": smtest.List(1, 2, 2, 1)}, "x")
		}, 0, pool(x5, 3, 2, true, false)},
		{"MatMul", a, func(g *smtest.Graph) string {
			return g.Node("r", "MatMul", f32, "x", g.Variable("dense/kernel", dims64(b.d), f32s(b)))
		}, 0, matMul(a, b)},
		{"BatchMatMulV2 broadcast", bm, func(g *smtest.Graph) string {
			return g.Node("r", "BatchMatMulV2", f32, "x", g.Floats("y", dims64(bb.d), f32s(bb)...))
		}, 0, matMul(bm, bb)},
		{"Softmax", a, func(g *smtest.Graph) string { return g.Node("r", "Softmax", f32, "x") }, 0, softmax(a)},
	}
}

func shapeCases() []opCase {
	x := random(0.6, 2, 3, 4)
	m := random(1.2, 4, 6)
	mean := newND(2, 1, 1)
	for i, v := range x.v {
		mean.v[i/12] += v / 12
	}
	c2 := random(2.1, 2, 3)
	concat := newND(2, 4)
	for i := range 2 {
		copy(concat.v[i*4:], c2.v[i*3:i*3+3])
		concat.v[i*4+3] = float64(i) + 10
	}
	reshaped := nd{d: []int{4, 6}, v: x.v}
	pad := newND(3, 5)
	tile := newND(4, 3)
	for i := range 2 {
		for j := range 3 {
			pad.v[pad.off(i+1, j)] = c2.v[i*3+j]
			tile.v[tile.off(i, j)], tile.v[tile.off(i+2, j)] = c2.v[i*3+j], c2.v[i*3+j]
		}
	}
	gathered := sub2D(m, []int{3, 0, 3}, span(0, 6, 1))
	return []opCase{
		{"Mean keep_dims", x, func(g *smtest.Graph) string {
			return g.Node("r", "Mean", smtest.Attrs{"keep_dims": smtest.Bool(true)}, "x", g.Ints("axes", 1, 2))
		}, 0, mean},
		{"ConcatV2", c2, func(g *smtest.Graph) string {
			return g.Node("r", "ConcatV2", smtest.Attrs{"N": smtest.Int64(2)}, "x", g.Floats("c", []int64{2, 1}, 10, 11), g.Int("axis", -1))
		}, 0, concat},
		{"Reshape -1", x, func(g *smtest.Graph) string { return g.Node("r", "Reshape", nil, "x", g.Ints("shape", 4, -1)) }, 0, reshaped},
		{"Transpose", x, func(g *smtest.Graph) string { return g.Node("r", "Transpose", nil, "x", g.Ints("perm", 2, 0, 1)) }, 0, transpose(x, 2, 0, 1)},
		{"StridedSlice strides 2", m, func(g *smtest.Graph) string {
			return g.Node("r", "StridedSlice", smtest.Attrs{"end_mask": smtest.Int64(2)}, "x", g.Ints("b", 1, 0), g.Ints("e", 4, 0), g.Ints("s", 2, 2))
		}, 0, sub2D(m, []int{1, 3}, []int{0, 2, 4})},
		{"StridedSlice negative stride", m, func(g *smtest.Graph) string {
			return g.Node("r", "StridedSlice", smtest.Attrs{"begin_mask": smtest.Int64(1), "end_mask": smtest.Int64(1)},
				"x", g.Ints("b", 0, 5), g.Ints("e", 0, 1), g.Ints("s", -1, -2))
		}, 0, sub2D(m, span(3, -1, -1), []int{5, 3})},
		{"GatherV2 axis 0", m, func(g *smtest.Graph) string {
			return g.Node("r", "GatherV2", nil, "x", g.Ints("idx", 3, 0, 3), g.Int("axis", 0))
		}, 0, gathered},
		{"GatherV2 axis 1", m, func(g *smtest.Graph) string {
			return g.Node("r", "GatherV2", nil, "x", g.Ints("idx", 5, 1), g.Int("axis", 1))
		}, 0, sub2D(m, span(0, 4, 1), []int{5, 1})},
		{"Pad", c2, func(g *smtest.Graph) string {
			p := g.Const("p", &smpb.TensorProto{Dtype: smpb.DataType_DT_INT32, TensorShape: smtest.ShapeProto([]int64{2, 2}), IntVal: []int32{1, 0, 0, 2}})
			return g.Node("r", "Pad", nil, "x", p)
		}, 0, pad},
		{"Tile", c2, func(g *smtest.Graph) string { return g.Node("r", "Tile", nil, "x", g.Ints("m", 2, 1)) }, 0, tile},
		{"Split output 1", m, func(g *smtest.Graph) string {
			g.Node("r", "Split", smtest.Attrs{"num_split": smtest.Int64(3)}, g.Int("axis", 1), "x")
			return "r:1"
		}, 0, sub2D(m, span(0, 4, 1), []int{2, 3})},
		{"ExpandDims", c2, func(g *smtest.Graph) string { return g.Node("r", "ExpandDims", nil, "x", g.Int("axis", -1)) }, 0, nd{d: []int{2, 3, 1}, v: c2.v}},
		{"Squeeze", nd{d: []int{1, 3, 1}, v: c2.v[:3]}, func(g *smtest.Graph) string {
			return g.Node("r", "Squeeze", smtest.Attrs{"squeeze_dims": smtest.List(0)}, "x")
		}, 0, nd{d: []int{3, 1}, v: c2.v[:3]}},
	}
}

func mathCases() []opCase {
	x := random(1.3, 3, 4)
	arg := newND(3)
	for r := range 3 {
		row := x.v[r*4 : r*4+4]
		arg.v[r] = float64(slices.Index(row, slices.Max(row)))
	}
	pos := mapND(x, func(v float64) float64 { return math.Abs(v) + 0.5 })
	x4 := mapND(x, func(v float64) float64 { return v * 4 })
	return []opCase{
		unaryCase("Sigmoid", func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }, f32),
		unaryCase("Tanh", math.Tanh, f32),
		unaryCase("Elu", func(v float64) float64 { return map[bool]float64{true: v, false: math.Expm1(v)}[v > 0] }, f32),
		unaryCase("Erf", math.Erf, f32),
		unaryCase("LeakyRelu", func(v float64) float64 { return max(v, 0.1*v) }, smtest.Attrs{"alpha": smtest.Float(0.1)}),
		{"Pow", pos, func(g *smtest.Graph) string { return g.Node("r", "Pow", f32, "x", g.Floats("e", nil, 1.5)) }, 0,
			mapND(pos, func(v float64) float64 { return math.Pow(v, 1.5) })},
		{"ArgMax", x, func(g *smtest.Graph) string { return g.Node("r", "ArgMax", nil, "x", g.Int("axis", 1)) }, smpb.DataType_DT_INT64, arg},
		{"Select", x, func(g *smtest.Graph) string {
			c := g.Node("c", "Greater", f32, "x", g.Floats("zero", nil, 0))
			return g.Node("r", "Select", f32, c, "x", g.Node("n", "Neg", f32, "x"))
		}, 0, mapND(x, math.Abs)},
		{"Cast float to int32", x4, func(g *smtest.Graph) string {
			return g.Node("r", "Cast", smtest.Attrs{"SrcT": smtest.Type(smpb.DataType_DT_FLOAT), "DstT": smtest.Type(smpb.DataType_DT_INT32)}, "x")
		}, smpb.DataType_DT_INT32, mapND(x4, math.Trunc)},
		{"Range", x, func(g *smtest.Graph) string {
			return g.Node("r", "Range", smtest.Attrs{"Tidx": smtest.Type(smpb.DataType_DT_INT32)}, g.Int("start", 1), g.Int("limit", 11), g.Int("delta", 3))
		}, smpb.DataType_DT_INT32, nd{d: []int{4}, v: []float64{1, 4, 7, 10}}},
		{"Fill", nd{d: []int{}, v: []float64{2.5}}, func(g *smtest.Graph) string { return g.Node("r", "Fill", nil, g.Ints("dims", 2, 3), "x") }, 0,
			mapND(newND(2, 3), func(float64) float64 { return 2.5 })},
	}
}

// noShapeRule are the ops whose output shapes are not inferred (unless an
// _output_shapes attribute gives them).
var noShapeRule = []string{"StridedSlice", "GatherV2", "Pad", "Split", "Range"}

// TestSavedModelOps writes each op as a SavedModel in TensorFlow's format
// (weights in the variables bundle where the op has any), imports it,
// runs the ONNX in ONNX Runtime and checks against the Go reference.
func TestSavedModelOps(t *testing.T) {
	cases := append(append(nnCases(), shapeCases()...), mathCases()...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &smtest.Graph{}
			g.Placeholder("x", smpb.DataType_DT_FLOAT, dims64(tc.x.d))
			out := tc.build(g)
			if !strings.Contains(out, ":") {
				out += ":0"
			}
			dt := tc.outDT
			if dt == 0 {
				dt = smpb.DataType_DT_FLOAT
			}
			dir := t.TempDir()
			err := g.Write(dir, smtest.Signature{
				Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: smpb.DataType_DT_FLOAT, Dims: dims64(tc.x.d)}},
				Outputs: map[string]smtest.Arg{"y": {Tensor: out, DType: dt}},
			})
			if err != nil {
				t.Fatal(err)
			}
			in := map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: dims64(tc.x.d), Data: f32s(tc.x)}}
			c, got := importRun(t, dir, savedmodel.ConvertOptions{}, in)
			y := got["y"]
			if !slices.Equal(y.Dims, dims64(tc.want.d)) {
				t.Errorf("y dims = %v, want %v", y.Dims, tc.want.d)
			}
			// The signature leaves y unranked: its shape is inferred, fully
			// for every op with a shape rule.
			if full := checkDeclared(t, c.Model, "y", y.Dims); !full && !slices.ContainsFunc(noShapeRule, func(op string) bool { return strings.HasPrefix(tc.name, op) }) {
				t.Errorf("y's shape is not fully inferred: %s", c.Model.Outputs()[0].Shape)
			}
			compare(t, "y", floats(t, y), tc.want.v, 1e-5)
		})
	}
}
