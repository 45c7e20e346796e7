package savedmodel_test

import (
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// writeRun writes g with inputs x (float) and b (int32) and output y,
// imports it and runs it.
func writeRun(t *testing.T, g *smtest.Graph, x nd, b []int32, out string) (*savedmodel.Conversion, *onnx.Tensor) {
	t.Helper()
	dir := t.TempDir()
	ins := map[string]smtest.Arg{"x": {Tensor: "x:0", DType: dtF, Dims: dims64(x.d)}}
	feed := map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: dims64(x.d), Data: f32s(x)}}
	if b != nil {
		ins["b"] = smtest.Arg{Tensor: "b:0", DType: dtI32, Dims: []int64{int64(len(b))}}
		feed["b"] = &onnx.Tensor{Type: onnx.Int32, Dims: []int64{int64(len(b))}, Data: b}
	}
	if err := g.Write(dir, smtest.Signature{Inputs: ins, Outputs: map[string]smtest.Arg{"y": {Tensor: out, DType: dtF}}}); err != nil {
		t.Fatal(err)
	}
	c, got := importRun(t, dir, savedmodel.ConvertOptions{}, feed)
	return c, got["y"]
}

// TestStridedSliceComputed feeds begin (and strides) as graph values, not
// constants, so Slice's bounds are computed in the ONNX graph.
func TestStridedSliceComputed(t *testing.T) {
	m := random(1.2, 4, 6)
	s := func(g *smtest.Graph, masks map[string]int64, begin, end, strides string) string {
		a := smtest.Attrs{"T": smtest.Type(dtF), "Index": smtest.Type(dtI32)}
		for k, v := range masks {
			a[k] = smtest.Int64(v)
		}
		return g.Node("r", "StridedSlice", a, "x", begin, end, strides) + ":0"
	}
	for _, tc := range []struct {
		name  string
		b     []int32
		build func(g *smtest.Graph) string
		dims  []int
		want  nd
	}{
		{"x[b0:, b1]", []int32{1, 3}, func(g *smtest.Graph) string {
			return s(g, map[string]int64{"end_mask": 1, "shrink_axis_mask": 2}, "b", g.Ints("e", 0, 0), g.Ints("s", 1, 1))
		}, []int{3}, sub2D(m, []int{1, 2, 3}, []int{3})},
		{"x[b0::-1, b1:6:2] computed strides", []int32{3, 1}, func(g *smtest.Graph) string {
			st := g.Node("st", "Sub", attrI32, g.Ints("st0", 0, 3), g.Ints("st1", 1, 1))
			return s(g, map[string]int64{"end_mask": 1}, "b", g.Ints("e", 0, 6), st)
		}, []int{4, 3}, sub2D(m, []int{3, 2, 1, 0}, []int{1, 3, 5})},
		{"x[b1] shrink of -1", []int32{0, -1}, func(g *smtest.Graph) string {
			b1 := g.Node("b1", "StridedSlice", smtest.Attrs{"shrink_axis_mask": smtest.Int64(0)}, "b", g.Ints("o1", 1), g.Ints("o2", 2), g.Ints("o3", 1))
			return s(g, map[string]int64{"shrink_axis_mask": 1}, b1, g.Ints("e", 0), g.Ints("s", 1))
		}, []int{6}, sub2D(m, []int{3}, span(0, 6, 1))},
		{"x[newaxis, b1:3]", []int32{0, 1}, func(g *smtest.Graph) string {
			return s(g, map[string]int64{"new_axis_mask": 1}, "b", g.Ints("e", 0, 3), g.Ints("s", 1, 1))
		}, []int{1, 2, 6}, nd{d: []int{1, 2, 6}, v: sub2D(m, []int{1, 2}, span(0, 6, 1)).v}},
		{"x[..., b1:]", []int32{0, 2}, func(g *smtest.Graph) string {
			return s(g, map[string]int64{"ellipsis_mask": 1, "end_mask": 2}, "b", g.Ints("e", 0, 0), g.Ints("s", 1, 1))
		}, []int{4, 4}, sub2D(m, span(0, 4, 1), span(2, 6, 1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &smtest.Graph{}
			g.Placeholder("x", dtF, dims64(m.d))
			g.Placeholder("b", dtI32, []int64{2})
			_, y := writeRun(t, g, m, tc.b, tc.build(g))
			if !slices.Equal(y.Dims, dims64(tc.dims)) {
				t.Errorf("y dims = %v, want %v", y.Dims, tc.dims)
			}
			compare(t, "y", floats(t, y), tc.want.v, 1e-6)
		})
	}
}

func TestStridedSliceComputedUnknownLength(t *testing.T) {
	g := &smtest.Graph{}
	g.Placeholder("x", dtF, []int64{4, 6})
	g.Placeholder("b", dtI32, nil)
	g.Node("r", "StridedSlice", nil, "x", "b", "b", "b")
	dir := t.TempDir()
	if err := g.Write(dir, smtest.Signature{Inputs: map[string]smtest.Arg{"x": {Tensor: "x:0", DType: dtF}, "b": {Tensor: "b:0", DType: dtI32}},
		Outputs: map[string]smtest.Arg{"y": {Tensor: "r:0", DType: dtF}}}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, convertDir(dir, savedmodel.ConvertOptions{}), "node r (op StridedSlice", "known length")
}

// dotDimensionNumbers serializes xla.DotDimensionNumbers as jax2tf does
// (packed repeated int64, fields 1-4).
func dotDimensionNumbers(lc, rc, lb, rb []int64) string {
	var out []byte
	for f, v := range [][]int64{lc, rc, lb, rb} {
		if len(v) == 0 {
			continue
		}
		var p []byte
		for _, x := range v {
			p = append(p, byte(x))
		}
		out = append(out, byte((f+1)<<3|2), byte(len(p)))
		out = append(out, p...)
	}
	return string(out)
}

// dotGeneral is XLA's DotGeneral in Go over row-major arrays: the result
// holds batch dims, then lhs free dims, then rhs free dims.
func dotGeneral(a, b nd, lc, rc, lb, rb []int) nd {
	free := func(r int, used ...[]int) []int {
		var f []int
		for i := range r {
			if !slices.Contains(used[0], i) && !slices.Contains(used[1], i) {
				f = append(f, i)
			}
		}
		return f
	}
	af, bf := free(len(a.d), lc, lb), free(len(b.d), rc, rb)
	var od []int
	for _, i := range lb {
		od = append(od, a.d[i])
	}
	for _, i := range af {
		od = append(od, a.d[i])
	}
	for _, i := range bf {
		od = append(od, b.d[i])
	}
	y := newND(od...)
	ai, bi := make([]int, len(a.d)), make([]int, len(b.d))
	oi := make([]int, len(od))
	for o := range y.v {
		r := o
		for i := len(od) - 1; i >= 0; i-- {
			oi[i], r = r%od[i], r/od[i]
		}
		for k := range lb {
			ai[lb[k]], bi[rb[k]] = oi[k], oi[k]
		}
		for k, i := range af {
			ai[i] = oi[len(lb)+k]
		}
		for k, i := range bf {
			bi[i] = oi[len(lb)+len(af)+k]
		}
		n := 1
		for _, i := range lc {
			n *= a.d[i]
		}
		for c := range n {
			r := c
			for k := len(lc) - 1; k >= 0; k-- {
				ai[lc[k]], bi[rc[k]], r = r%a.d[lc[k]], r%a.d[lc[k]], r/a.d[lc[k]]
			}
			y.v[o] += a.v[a.off(ai...)] * b.v[b.off(bi...)]
		}
	}
	return y
}

func ints64(v []int) []int64 { return dims64(v) }

// TestXlaDot imports jax2tf's dot_general (XlaDotV2, XlaDot) with weights
// as constants and checks it against DotGeneral computed in Go.
func TestXlaDot(t *testing.T) {
	x := random(0.8, 2, 3, 4)
	for _, tc := range []struct {
		name           string
		op             string
		w              nd
		lc, rc, lb, rb []int
		relu           bool // lhs through a Relu whose rank only the dot's _output_shapes tells
		wantOp         string
	}{
		{"batched matmul", "XlaDotV2", random(1.7, 2, 4, 5), []int{2}, []int{1}, []int{0}, []int{0}, false, "MatMul"},
		{"dense", "XlaDotV2", random(1.1, 4, 5), []int{2}, []int{0}, nil, nil, false, "MatMul"},
		{"batch on rhs axis 1", "XlaDotV2", random(0.6, 4, 2, 5), []int{2}, []int{0}, []int{0}, []int{1}, false, "Einsum"},
		{"two contracting dims", "XlaDot", random(0.3, 4, 3, 2), []int{1, 2}, []int{1, 0}, nil, nil, true, "Einsum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := x
			if tc.relu {
				in = mapND(x, func(v float64) float64 { return max(v, 0) })
			}
			want := dotGeneral(in, tc.w, tc.lc, tc.rc, tc.lb, tc.rb)
			g := &smtest.Graph{}
			g.Placeholder("x", dtF, dims64(x.d))
			lhs := "x"
			if tc.relu {
				lhs = g.Node("relu", "Relu", attrF, "x")
			}
			attrs := smtest.Attrs{"T": smtest.Type(dtF), "dimension_numbers": smtest.Str(dotDimensionNumbers(ints64(tc.lc), ints64(tc.rc), ints64(tc.lb), ints64(tc.rb))),
				"precision_config": smtest.Str(""), "_output_shapes": smtest.Shapes(dims64(want.d))}
			if tc.op == "XlaDotV2" {
				attrs = smtest.Attrs{"LhsT": smtest.Type(dtF), "RhsT": smtest.Type(dtF), "preferred_element_type": smtest.Type(dtF),
					"dimension_numbers": attrs["dimension_numbers"], "precision_config": attrs["precision_config"], "_output_shapes": attrs["_output_shapes"]}
			}
			g.Node("dot", tc.op, attrs, lhs, g.Floats("w", dims64(tc.w.d), f32s(tc.w)...))
			c, y := writeRun(t, g, x, nil, "dot:0")
			if c.Model.OpCounts()[tc.wantOp] != 1 {
				t.Errorf("ops = %v, want one %s", c.Model.OpCounts(), tc.wantOp)
			}
			if !slices.Equal(y.Dims, dims64(want.d)) {
				t.Errorf("y dims = %v, want %v", y.Dims, want.d)
			}
			compare(t, "y", floats(t, y), want.v, 1e-5)
		})
	}
}

func TestReverseV2(t *testing.T) {
	x := random(0.6, 2, 3, 4)
	for _, tc := range []struct {
		axes []int32
		want nd
	}{
		{[]int32{1}, reverseND(x, 1)},
		{[]int32{0, -1}, reverseND(reverseND(x, 0), 2)},
	} {
		g := &smtest.Graph{}
		g.Placeholder("x", dtF, dims64(x.d))
		g.Node("r", "ReverseV2", smtest.Attrs{"T": smtest.Type(dtF)}, "x", g.Ints("axes", tc.axes...))
		_, y := writeRun(t, g, x, nil, "r:0")
		compare(t, "y", floats(t, y), tc.want.v, 0)
	}
}

// reverseND flips x along axis.
func reverseND(x nd, axis int) nd {
	y := newND(x.d...)
	idx := make([]int, len(x.d))
	for o := range y.v {
		r := o
		for i := len(x.d) - 1; i >= 0; i-- {
			idx[i], r = r%x.d[i], r/x.d[i]
		}
		idx[axis] = x.d[axis] - 1 - idx[axis]
		y.v[o] = x.v[x.off(idx...)]
	}
	return y
}
