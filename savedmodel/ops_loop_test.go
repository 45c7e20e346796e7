package savedmodel_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

const (
	dtF   = smpb.DataType_DT_FLOAT
	dtI32 = smpb.DataType_DT_INT32
	dtVar = smpb.DataType_DT_VARIANT
	dtRes = smpb.DataType_DT_RESOURCE
)

var (
	attrF   = smtest.Attrs{"T": smtest.Type(dtF)}
	attrI32 = smtest.Attrs{"T": smtest.Type(dtI32)}
	listF   = smtest.Attrs{"element_dtype": smtest.Type(dtF), "shape_type": smtest.Type(dtI32)}
)

func constInts(f *smtest.Function, name string, v ...int32) string {
	p := &smpb.TensorProto{Dtype: dtI32, TensorShape: smtest.ShapeProto([]int64{int64(len(v))}), IntVal: v}
	if len(v) == 1 {
		p.TensorShape = smtest.ShapeProto(nil)
	}
	return smtest.Out(f.Node(name, "Const", smtest.Attrs{"dtype": smtest.Type(dtI32), "value": {Value: &smpb.AttrValue_Tensor{Tensor: p}}}), "output", 0)
}

func randomRNN(gru bool, in, units int) rnnWeights {
	g := 4
	if gru {
		g = 3
	}
	nb := g * units
	if gru {
		nb *= 2
	}
	return rnnWeights{in: in, units: units, gru: gru,
		kernel: random(0.37, in, g*units).v, rec: random(0.71, units, g*units).v, bias: random(1.13, nb).v}
}

func f32v(v []float64) []float32 { return f32s(nd{v: v}) }

// kerasWhile writes what keras.layers.LSTM/GRU (standard implementation)
// saves: the input unstacked into a TensorList, a reserved output list, and
// a While whose loop variables are while_v2's (loop counter, trip limit),
// Keras's (time, output list, states) and the captures (input list,
// weights as resources), with Keras's cell math in the body function.
// It returns the [batch, time, units] outputs and the last h.
// With generic, the body sums x·K and h·R as x·K − (−h·R): the same
// values in a form no pattern knows, so the import keeps the Loop.
func kerasWhile(g *smtest.Graph, w rnnWeights, steps int, generic bool) (string, string) {
	u, name := int32(w.units), "lstm"
	if w.gru {
		name = "gru"
	}
	xt := g.Node("transpose", "Transpose", attrF, "x", g.Ints("perm", 1, 0, 2))
	inTA := g.Node("in_ta", "TensorListFromTensor", listF, xt, g.Ints("in_shape", -1, int32(w.in)))
	outTA := g.Node("out_ta", "TensorListReserve", listF, g.Ints("out_shape", -1, u), g.Int("steps", int32(steps)))
	shape := g.Node("shape", "Shape", attrF, "x")
	batch := g.Node("batch", "StridedSlice", smtest.Attrs{"shrink_axis_mask": smtest.Int64(1), "Index": smtest.Type(dtI32)},
		shape, g.Ints("b0", 0), g.Ints("b1", 1), g.Ints("b2", 1))
	zeros := g.Node("zeros", "Fill", nil, g.Node("zshape", "Pack", smtest.Attrs{"N": smtest.Int64(2), "axis": smtest.Int64(0)}, batch, g.Int("units", u)),
		g.Floats("zero", nil, 0))
	gates := 4
	if w.gru {
		gates = 3
	}
	g.ResourceVariable(name+"/kernel", []int64{int64(w.in), int64(gates) * int64(u)}, f32v(w.kernel))
	g.ResourceVariable(name+"/recurrent_kernel", []int64{int64(u), int64(gates) * int64(u)}, f32v(w.rec))
	ins := []string{g.Int("counter0", 0), g.Int("maxit", int32(steps)), g.Int("time0", 0), outTA, zeros}
	types := []smpb.DataType{dtI32, dtI32, dtI32, dtVar, dtF}
	params := []string{"loop_counter", "max_iterations", "time", "out_ta", "h"}
	if !w.gru {
		ins, types, params = append(ins, zeros), append(types, dtF), append(params, "c")
	}
	ins = append(ins, inTA, name+"/kernel", name+"/recurrent_kernel")
	types = append(types, dtVar, dtRes, dtRes)
	params = append(params, "in_ta", "kernel", "recurrent_kernel")
	if w.gru {
		b := g.ResourceVariable(name+"/bias", []int64{2, 3 * int64(u)}, f32v(w.bias))
		g.Node("unstack", "Unpack", smtest.Attrs{"num": smtest.Int64(2), "axis": smtest.Int64(0)}, b)
		ins, types, params = append(ins, "unstack", "unstack:1"), append(types, dtF, dtF), append(params, "input_bias", "recurrent_bias")
	} else {
		ins, types, params = append(ins, name+"/bias"), append(types, dtRes), append(params, "bias")
		g.ResourceVariable(name+"/bias", []int64{4 * int64(u)}, f32v(w.bias))
	}
	if !w.gru {
		// Keras's time_steps_t = tf.shape(inputs)[0], captured by the loop.
		ts := g.Node("time_steps", "StridedSlice", smtest.Attrs{"shrink_axis_mask": smtest.Int64(1), "Index": smtest.Type(dtI32)},
			g.Node("shape_t", "Shape", attrF, xt), g.Ints("t0", 0), g.Ints("t1", 1), g.Ints("t2", 1))
		ins, types, params = append(ins, ts), append(types, dtI32), append(params, "time_steps")
	}
	var sig []smtest.Param
	for i, p := range params {
		sig = append(sig, smtest.Param{Name: p, DType: types[i]})
	}
	whileCond(g, sig, steps)
	whileBody(g, sig, w, generic)
	g.Node("while", "While", smtest.Attrs{"T": smtest.Types(types...), "cond": smtest.Func("while_cond"), "body": smtest.Func("while_body"),
		"parallel_iterations": smtest.Int64(32)}, ins...)
	stack := g.Node("stack", "TensorListStack", smtest.Attrs{"element_dtype": smtest.Type(dtF), "num_elements": smtest.Int64(int64(steps))},
		"while:3", g.Ints("stack_shape", -1, u))
	return g.Node("y", "Transpose", attrF, stack, g.Ints("perm_back", 1, 0, 2)), "while:4"
}

// whileCond is while_v2's cond: loop_counter < max_iterations and Keras's
// time < steps (the captured time_steps where the loop has it).
func whileCond(g *smtest.Graph, sig []smtest.Param, steps int) {
	f := g.Function("while_cond", sig, []smtest.Param{{Name: "identity", DType: smpb.DataType_DT_BOOL}})
	a := f.Node("less", "Less", attrI32, "loop_counter", "max_iterations")
	limit := constInts(f, "steps", int32(steps))
	if sig[len(sig)-1].Name == "time_steps" {
		limit = "time_steps"
	}
	b := f.Node("less_1", "Less", attrI32, "time", limit)
	and := f.Node("and", "LogicalAnd", nil, smtest.Out(a, "z", 0), smtest.Out(b, "z", 0))
	f.Return("identity", smtest.Out(f.Node("Identity", "Identity", smtest.Attrs{"T": smtest.Type(smpb.DataType_DT_BOOL)}, smtest.Out(and, "z", 0)), "output", 0))
}

// whileBody is Keras's step: standard_lstm's or standard_gru's (reset_after).
func whileBody(g *smtest.Graph, sig []smtest.Param, w rnnWeights, generic bool) {
	f := g.Function("while_body", sig, sig)
	o := func(n string) string { return smtest.Out(n, "output", 0) }
	node := func(name, op string, in ...string) string { return o(f.Node(name, op, attrF, in...)) }
	sum := func(name, a, b string) string {
		if generic {
			return node(name, "Sub", a, node(name+"/neg", "Neg", b))
		}
		return node(name, "AddV2", a, b)
	}
	x := o(f.Node("x_t", "TensorListGetItem", smtest.Attrs{"element_dtype": smtest.Type(dtF)}, "in_ta", "time", constInts(f, "es", -1, int32(w.in))))
	read := func(v string) string {
		return o(f.Node(v+"/read", "ReadVariableOp", smtest.Attrs{"dtype": smtest.Type(dtF)}, v))
	}
	k, r := read("kernel"), read("recurrent_kernel")
	axis := constInts(f, "axis", 1)
	split := func(name, v string, n int) []string {
		f.Node(name, "Split", smtest.Attrs{"num_split": smtest.Int64(int64(n)), "T": smtest.Type(dtF)}, axis, v)
		var out []string
		for i := range n {
			out = append(out, smtest.Out(name, "output", i))
		}
		return out
	}
	var h, c string
	if w.gru {
		xs := split("split", node("bias_x", "BiasAdd", node("mx", "MatMul", x, k), "input_bias"), 3)
		hs := split("split_1", node("bias_h", "AddV2", node("mh", "MatMul", "h", r), "recurrent_bias"), 3) // Keras 3 adds biases with +
		z := node("z", "Sigmoid", sum("add_z", xs[0], hs[0]))
		rr := node("r", "Sigmoid", node("add_r", "AddV2", xs[1], hs[1]))
		hh := node("hh", "Tanh", node("add_h", "AddV2", xs[2], node("mul_r", "Mul", rr, hs[2])))
		one := o(f.Node("one_f", "Const", smtest.Attrs{"dtype": smtest.Type(dtF), "value": {Value: &smpb.AttrValue_Tensor{
			Tensor: &smpb.TensorProto{Dtype: dtF, TensorShape: smtest.ShapeProto(nil), FloatVal: []float32{1}}}}}))
		h = node("h_new", "AddV2", node("mul_z", "Mul", z, "h"), node("mul_zh", "Mul", node("sub", "Sub", one, z), hh))
	} else {
		b := read("bias")
		zz := node("z", "BiasAdd", sum("add", node("mx", "MatMul", x, k), node("mh", "MatMul", "h", r)), b)
		s := split("split", zz, 4)
		i, fg, cc, og := node("i", "Sigmoid", s[0]), node("f", "Sigmoid", s[1]), node("g", "Tanh", s[2]), node("o", "Sigmoid", s[3])
		c = node("c_new", "AddV2", node("fc", "Mul", fg, "c"), node("ig", "Mul", i, cc))
		h = node("h_new", "Mul", og, node("tanh_c", "Tanh", c))
	}
	ta := o(f.Node("write", "TensorListSetItem", smtest.Attrs{"element_dtype": smtest.Type(dtF)}, "out_ta", "time", h))
	one := constInts(f, "one", 1)
	next := map[string]string{
		"loop_counter": o(f.Node("counter", "AddV2", attrI32, "loop_counter", one)),
		"time":         o(f.Node("time_1", "AddV2", attrI32, "time", one)),
		"out_ta":       ta, "h": h, "c": c,
	}
	for _, p := range sig {
		ref, ok := next[p.Name]
		if !ok {
			ref = p.Name
		}
		// while_v2 returns every variable through an Identity.
		f.Return(p.Name, o(f.Node("Identity_"+p.Name, "Identity", smtest.Attrs{"T": smtest.Type(p.DType)}, ref)))
	}
}

// TestWhileKerasRNN imports the While loops Keras's LSTM and GRU layers
// save, as one ONNX LSTM/GRU when the body is Keras's cell and as an ONNX
// Loop over sequences when it is not, and checks every step's output and
// the last state against the Keras cell equations in Go.
func TestWhileKerasRNN(t *testing.T) {
	const batch, steps, in, units = 2, 5, 4, 3
	for _, tc := range []struct {
		gru, generic bool
		want         string
	}{{false, false, "LSTM"}, {true, false, "GRU"}, {false, true, "Loop"}, {true, true, "Loop"}} {
		gru := tc.gru
		name := map[bool]string{false: "LSTM", true: "GRU"}[gru] + " as " + tc.want
		t.Run(name, func(t *testing.T) {
			w := randomRNN(gru, in, units)
			x := random(0.9, batch, steps, in)
			g := &smtest.Graph{}
			g.Placeholder("x", dtF, dims64(x.d))
			y, h := kerasWhile(g, w, steps, tc.generic)
			dir := t.TempDir()
			err := g.Write(dir, smtest.Signature{
				Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: dtF, Dims: dims64(x.d)}},
				Outputs: map[string]smtest.Arg{"y": {Tensor: y + ":0", DType: dtF}, "h": {Tensor: h, DType: dtF}},
			})
			if err != nil {
				t.Fatal(err)
			}
			c, got := importRun(t, dir, savedmodel.ConvertOptions{}, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: dims64(x.d), Data: f32s(x)}})
			ops := c.Model.OpCounts()
			if ops[tc.want] != 1 || (tc.want != "Loop" && ops["Loop"] != 0) {
				t.Errorf("ops = %v, want one %s", ops, tc.want)
			}
			for op := range ops {
				if strings.Contains(op, "Sequence") {
					t.Errorf("ops = %v: the lists should have become a tensor and a scan output", ops)
				}
			}
			zero := [][]float64{make([]float64, units), make([]float64, units)}
			seq, last, _ := w.run(x, zero, zero)
			if !slices.Equal(got["y"].Dims, dims64(seq.d)) {
				t.Errorf("y dims = %v, want %v", got["y"].Dims, seq.d)
			}
			compare(t, "y", floats(t, got["y"]), seq.v, 1e-5)
			compare(t, "h", floats(t, got["h"]), flat(last), 1e-5)
		})
	}
}

// TestWhileDataDependent runs a loop whose trip count is a graph input and
// which keeps a TensorList the body also reads, so it stays an ONNX
// sequence: acc = x; while i < n: list[i] = acc; acc = acc*2 + len(list);
// i += 1.
func TestWhileDataDependent(t *testing.T) {
	x := random(0.4, 2, 3)
	g := &smtest.Graph{}
	g.Placeholder("x", dtF, dims64(x.d))
	g.Placeholder("b", dtI32, []int64{1})
	n := g.Node("n", "Squeeze", smtest.Attrs{"T": smtest.Type(dtI32)}, "b")
	sig := []smtest.Param{{Name: "i", DType: dtI32}, {Name: "acc", DType: dtF}, {Name: "n", DType: dtI32}, {Name: "list", DType: dtVar}}
	cond := g.Function("cond", sig, []smtest.Param{{Name: "c", DType: smpb.DataType_DT_BOOL}})
	cond.Return("c", smtest.Out(cond.Node("less", "Less", attrI32, "i", "n"), "z", 0))
	body := g.Function("body", sig, sig)
	two := smtest.Out(body.Node("two", "Const", smtest.Attrs{"dtype": smtest.Type(dtF), "value": {Value: &smpb.AttrValue_Tensor{
		Tensor: &smpb.TensorProto{Dtype: dtF, TensorShape: smtest.ShapeProto(nil), FloatVal: []float32{2}}}}}), "output", 0)
	list := smtest.Out(body.Node("write", "TensorListSetItem", smtest.Attrs{"element_dtype": smtest.Type(dtF)}, "list", "i", "acc"), "output_handle", 0)
	length := smtest.Out(body.Node("len", "TensorListLength", nil, list), "length", 0)
	fl := smtest.Out(body.Node("fl", "Cast", smtest.Attrs{"SrcT": smtest.Type(dtI32), "DstT": smtest.Type(dtF)}, length), "y", 0)
	body.Return("acc", smtest.Out(body.Node("next", "AddV2", attrF, smtest.Out(body.Node("mul", "Mul", attrF, "acc", two), "z", 0), fl), "z", 0))
	body.Return("i", smtest.Out(body.Node("inc", "AddV2", attrI32, "i", constInts(body, "one", 1)), "z", 0))
	body.Return("n", "n")
	body.Return("list", list)
	// The loop sits in a function the main graph calls, as TF2 saves it;
	// the function reads the While's outputs as w:output:k.
	outer := g.Function("outer", []smtest.Param{{Name: "x", DType: dtF}, {Name: "n", DType: dtI32}},
		[]smtest.Param{{Name: "y", DType: dtF}, {Name: "s", DType: dtF}})
	reserve := outer.Node("reserve", "TensorListReserve", listF, constInts(outer, "shape", 2, 3), constInts(outer, "num", 3))
	outer.Node("w", "StatelessWhile", smtest.Attrs{"T": smtest.Types(dtI32, dtF, dtI32, dtVar), "cond": smtest.Func("cond"), "body": smtest.Func("body")},
		constInts(outer, "i0", 0), "x", "n", smtest.Out(reserve, "handle", 0))
	outer.Return("y", smtest.Out("w", "output", 1))
	outer.Return("s", smtest.Out(outer.Node("stack", "TensorListStack", smtest.Attrs{"element_dtype": smtest.Type(dtF)},
		smtest.Out("w", "output", 3), constInts(outer, "es", 2, 3)), "tensor", 0))
	g.Node("call", "PartitionedCall", smtest.Attrs{"f": smtest.Func("outer")}, "x", n)
	for _, steps := range []int32{0, 3} {
		want, stack := x, nd{d: []int{int(steps), 2, 3}}
		for i := range steps {
			stack.v = append(stack.v, want.v...)
			want = mapND(want, func(v float64) float64 { return 2*v + float64(i+1) })
		}
		c, y := writeRun(t, g, x, []int32{steps}, "call:0")
		if ops := c.Model.OpCounts(); ops["Loop"] != 1 || ops["SequenceInsert"] == 0 {
			t.Errorf("ops = %v, want one Loop over a sequence", ops)
		}
		compare(t, "acc", floats(t, y), want.v, 1e-6)
		if steps > 0 {
			_, s := writeRun(t, g, x, []int32{steps}, "call:1")
			if !slices.Equal(s.Dims, dims64(stack.d)) {
				t.Errorf("stack dims = %v, want %v", s.Dims, stack.d)
			}
			compare(t, "stack", floats(t, s), stack.v, 1e-6)
		}
	}
}

func TestWhileErrors(t *testing.T) {
	g := &smtest.Graph{}
	g.Placeholder("x", dtF, []int64{2})
	g.Node("w", "While", smtest.Attrs{"T": smtest.Types(dtF), "cond": smtest.Func("missing_cond"), "body": smtest.Func("missing_body")}, "x")
	dir := t.TempDir()
	if err := g.Write(dir, smtest.Signature{Inputs: map[string]smtest.Arg{"x": {Tensor: "x:0", DType: dtF}},
		Outputs: map[string]smtest.Arg{"y": {Tensor: "w:0", DType: dtF}}}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, convertDir(dir, savedmodel.ConvertOptions{}), "node w (op While", `"missing_body" is not in the function library`)
}

// TestIf imports tf.cond (StatelessIf) with branch functions and a
// condition read from a graph input: y = x·w when b > 0, else -x.
func TestIf(t *testing.T) {
	x := random(0.7, 2, 3)
	w := random(1.3, 3, 2)
	g := &smtest.Graph{}
	g.Placeholder("x", dtF, dims64(x.d))
	g.Placeholder("b", dtI32, []int64{1})
	sig := []smtest.Param{{Name: "x", DType: dtF}, {Name: "w", DType: dtF}}
	out := []smtest.Param{{Name: "y", DType: dtF}}
	then := g.Function("then", sig, out)
	then.Return("y", smtest.Out(then.Node("mm", "MatMul", attrF, "x", "w"), "product", 0))
	els := g.Function("else", sig, out)
	els.Return("y", smtest.Out(els.Node("neg", "Neg", attrF, "x"), "y", 0))
	pos := g.Node("pos", "Greater", attrI32, g.Node("b0", "Squeeze", attrI32, "b"), g.Int("zero", 0))
	g.Node("if", "StatelessIf", smtest.Attrs{"then_branch": smtest.Func("then"), "else_branch": smtest.Func("else"),
		"Tout": smtest.Types(dtF), "Tcond": smtest.Type(smpb.DataType_DT_BOOL)}, pos, "x", g.Floats("w", dims64(w.d), f32s(w)...))
	for _, b := range []int32{1, -1} {
		want := matMul(x, w)
		if b < 0 {
			want = mapND(x, func(v float64) float64 { return -v })
		}
		c, y := writeRun(t, g, x, []int32{b}, "if:0")
		if c.Model.OpCounts()["If"] != 1 {
			t.Errorf("ops = %v, want one If", c.Model.OpCounts())
		}
		if !slices.Equal(y.Dims, dims64(want.d)) {
			t.Errorf("b=%d: y dims = %v, want %v", b, y.Dims, want.d)
		}
		compare(t, "y", floats(t, y), want.v, 1e-6)
	}
}

// TestTensorListOps uses a list outside any loop, as an ONNX sequence:
// pushed twice, item 0 replaced, stacked, read back, measured.
func TestTensorListOps(t *testing.T) {
	x := random(0.5, 2, 3)
	neg, twice := mapND(x, func(v float64) float64 { return -v }), mapND(x, func(v float64) float64 { return 2 * v })
	toF := smtest.Attrs{"SrcT": smtest.Type(dtI32), "DstT": smtest.Type(dtF)}
	for _, tc := range []struct {
		name string
		out  func(g *smtest.Graph, l string) string
		want nd
	}{
		{"SetItem replaces, Stack", func(g *smtest.Graph, l string) string {
			set := g.Node("set", "TensorListSetItem", smtest.Attrs{"element_dtype": smtest.Type(dtF)}, l, g.Int("i0", 0),
				g.Node("twice", "Mul", attrF, "x", g.Floats("two", nil, 2)))
			return g.Node("stack", "TensorListStack", smtest.Attrs{"element_dtype": smtest.Type(dtF)}, set, g.Ints("es", 2, 3))
		}, nd{d: []int{2, 2, 3}, v: append(append([]float64{}, twice.v...), neg.v...)}},
		{"GetItem", func(g *smtest.Graph, l string) string {
			return g.Node("get", "TensorListGetItem", smtest.Attrs{"element_dtype": smtest.Type(dtF)}, l, g.Int("i1", 1), g.Ints("es", 2, 3))
		}, neg},
		{"ElementShape", func(g *smtest.Graph, l string) string {
			return g.Node("f", "Cast", toF, g.Node("element_shape", "TensorListElementShape", smtest.Attrs{"shape_type": smtest.Type(dtI32)}, l))
		}, nd{d: []int{2}, v: []float64{2, 3}}},
		{"Length", func(g *smtest.Graph, l string) string {
			n := g.Node("len", "TensorListLength", nil, l)
			return g.Node("f", "Cast", toF, g.Node("len1", "Reshape", nil, n, g.Ints("one", 1)))
		}, nd{d: []int{1}, v: []float64{2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &smtest.Graph{}
			g.Placeholder("x", dtF, dims64(x.d))
			l := g.Node("empty", "EmptyTensorList", listF, g.Ints("shape", 2, 3), g.Int("max", -1))
			push := smtest.Attrs{"element_dtype": smtest.Type(dtF)}
			l = g.Node("push1", "TensorListPushBack", push, g.Node("push0", "TensorListPushBack", push, l, "x"), g.Node("neg", "Neg", attrF, "x"))
			_, y := writeRun(t, g, x, nil, tc.out(g, l)+":0")
			if !slices.Equal(y.Dims, dims64(tc.want.d)) {
				t.Errorf("y dims = %v, want %v", y.Dims, tc.want.d)
			}
			compare(t, "y", floats(t, y), tc.want.v, 1e-6)
		})
	}
}
