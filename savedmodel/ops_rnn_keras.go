package savedmodel

import (
	"slices"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// kerasRNN is a While recognised as the loop keras.layers.LSTM or GRU
// (reset_after) saves with its standard implementation: loop variable
// indices of the counter, time, output and input lists, states and the
// captured weights, and the trip limits of its condition.
type kerasRNN struct {
	gru                              bool
	counter, time, outTA, inTA, h, c int
	kernel, rec, bias, recBias       int
	limits                           []limit
}

func (v *fnView) add(ref string) *tfNode {
	if n := v.node(ref, "AddV2", 0); n != nil {
		return n
	}
	return v.node(ref, "Add", 0)
}

// matchKerasRNN recognises the body; any difference leaves the While to
// the generic Loop, which is exact for every body.
func matchKerasRNN(fg *flatGraph, name string, body, cond *smpb.FunctionDef, inv []bool) (*kerasRNN, bool) {
	v, ok := viewFunction(fg, name+"/match_body", body)
	if !ok || len(v.rets) != len(inv) {
		return nil, false
	}
	m := &kerasRNN{counter: -1, time: -1, outTA: -1, inTA: -1, h: -1, c: -1, recBias: -1}
	var incr, states []int
	item := ""
	for k, r := range v.rets {
		if inv[k] {
			continue
		}
		if s := v.node(r, "TensorListSetItem", 0); s != nil && v.arg(v.in(s, 0)) == k && m.outTA < 0 {
			m.outTA, m.time, item = k, v.arg(v.in(s, 1)), v.in(s, 2)
			continue
		}
		if v.either(v.add(r), func(x, y string) bool { return v.arg(x) == k && v.isConst(y, 1) }) {
			incr = append(incr, k)
			continue
		}
		states = append(states, k)
	}
	if m.outTA < 0 || m.time < 0 || !slices.Contains(incr, m.time) || len(incr) > 2 {
		return nil, false
	}
	for _, k := range incr {
		if k != m.time {
			m.counter = k
		}
	}
	for _, k := range states {
		if v.rets[k] == item {
			m.h = k
		} else {
			m.c = k
		}
	}
	m.gru = len(states) == 1
	switch {
	case m.h < 0 || len(states) > 2:
		return nil, false
	case m.gru && !v.gruCell(m, item):
		return nil, false
	case !m.gru && (m.c < 0 || !v.lstmCell(m, item)):
		return nil, false
	}
	for _, k := range []int{m.inTA, m.kernel, m.rec, m.bias, m.recBias} {
		if k >= 0 && !inv[k] {
			return nil, false
		}
	}
	cv, ok := viewFunction(fg, name+"/match_cond", cond)
	if !ok {
		return nil, false
	}
	m.limits, ok = cv.limits(m.counter, m.time, inv)
	return m, ok && len(m.limits) > 0
}

// inputs matches x·kernel (+ h·recurrent_kernel) with x the item at time
// of an input list.
func (v *fnView) stepInput(m *kerasRNN, ref string) bool {
	x, k, ok := v.matMul(ref)
	g := v.node(x, "TensorListGetItem", 0)
	if !ok || g == nil || v.arg(v.in(g, 1)) != m.time {
		return false
	}
	m.inTA, m.kernel = v.arg(v.in(g, 0)), v.arg(k)
	return m.inTA >= 0 && m.kernel >= 0
}

func (v *fnView) stepState(m *kerasRNN, ref string) bool {
	h, r, ok := v.matMul(ref)
	m.rec = v.arg(r)
	return ok && v.arg(h) == m.h && m.rec >= 0
}

// lstmCell matches standard_lstm's step: z = x·K + h·R + b split in
// i,f,c,o; c' = f·c + i·tanh(c̃); h' = o·tanh(c').
func (v *fnView) lstmCell(m *kerasRNN, hNew string) bool {
	var o, cNew, f, i, g string
	if !v.either(v.node(hNew, "Mul", 0), func(a, b string) bool {
		t := v.node(b, "Tanh", 0)
		o, cNew = a, v.in(t, 0)
		return t != nil
	}) || v.rets[m.c] != cNew {
		return false
	}
	if !v.either(v.add(cNew), func(a, b string) bool {
		return v.either(v.node(a, "Mul", 0), func(x, y string) bool { f = x; return v.arg(y) == m.c }) &&
			v.either(v.node(b, "Mul", 0), func(x, y string) bool {
				t := v.node(y, "Tanh", 0)
				i, g = x, v.in(t, 0)
				return t != nil
			})
	}) {
		return false
	}
	gate := func(ref string, k int) *tfNode {
		s := v.node(ref, "Sigmoid", 0)
		if s == nil {
			return nil
		}
		return v.split(v.in(s, 0), k, 4)
	}
	s := gate(i, 0)
	if s == nil || gate(f, 1) != s || gate(o, 3) != s || v.split(g, 2, 4) != s {
		return false
	}
	sum, bias, ok := v.biased(v.in(s, 1))
	m.bias = bias
	return ok && v.either(v.add(sum), func(a, b string) bool {
		return v.stepInput(m, a) && v.stepState(m, b)
	})
}

// biased matches v + bias, as BiasAdd (Keras 2) or Add (Keras 3) with the
// bias a loop variable, and returns v and the bias's index.
func (v *fnView) biased(ref string) (string, int, bool) {
	if ba := v.node(ref, "BiasAdd", 0); ba != nil {
		return v.in(ba, 0), v.arg(v.in(ba, 1)), v.arg(v.in(ba, 1)) >= 0
	}
	var sum string
	bias := -1
	ok := v.either(v.add(ref), func(x, y string) bool {
		sum, bias = x, v.arg(y)
		return bias >= 0
	})
	return sum, bias, ok
}

// gruCell matches standard_gru's step (reset_after): x·K + b_in and
// h·R + b_rec each split in z,r,h; z and r sigmoids of their sums;
// h̃ = tanh(x_h + r·h_h); h' = z·h + (1 − z)·h̃.
func (v *fnView) gruCell(m *kerasRNN, hNew string) bool {
	var z, hh string
	if !v.either(v.add(hNew), func(a, b string) bool {
		return v.either(v.node(a, "Mul", 0), func(x, y string) bool { z = x; return v.arg(y) == m.h }) &&
			v.either(v.node(b, "Mul", 0), func(x, y string) bool {
				s := v.node(x, "Sub", 0)
				hh = y
				return s != nil && v.isConst(v.in(s, 0), 1) && v.in(s, 1) == z
			})
	}) {
		return false
	}
	var xs, hs *tfNode
	zs, th := v.node(z, "Sigmoid", 0), v.node(hh, "Tanh", 0)
	if zs == nil || th == nil || !v.either(v.add(v.in(zs, 0)), func(a, b string) bool {
		xs, hs = v.split(a, 0, 3), v.split(b, 0, 3)
		return xs != nil && hs != nil && v.gruProjections(m, xs, hs)
	}) {
		return false
	}
	var r string
	return v.either(v.add(v.in(th, 0)), func(a, b string) bool {
		mul := v.node(b, "Mul", 0)
		return v.split(a, 2, 3) == xs && v.either(mul, func(p, q string) bool { r = p; return v.split(q, 2, 3) == hs })
	}) && v.gruReset(r, xs, hs)
}

func (v *fnView) gruProjections(m *kerasRNN, xs, hs *tfNode) bool {
	x, bx, okX := v.biased(v.in(xs, 1))
	h, bh, okH := v.biased(v.in(hs, 1))
	m.bias, m.recBias = bx, bh
	return okX && okH && v.stepInput(m, x) && v.stepState(m, h)
}

func (v *fnView) gruReset(r string, xs, hs *tfNode) bool {
	s := v.node(r, "Sigmoid", 0)
	return s != nil && v.either(v.add(v.in(s, 0)), func(a, b string) bool {
		return v.split(a, 1, 3) == xs && v.split(b, 1, 3) == hs
	})
}

// kerasOuter checks what the loop starts from: counter and time at 0, an
// empty output list, an input list holding a tensor's rows, and constant
// weights whose shapes give the units. It returns the time-major input.
func (c *opCtx) kerasOuter(m *kerasRNN) (x string, units int64, ok bool) {
	for _, k := range []int{m.counter, m.time} {
		if k < 0 {
			continue
		}
		if t, isConst := c.e.value(c.in[k]); !isConst || !isZero(t) {
			return "", 0, false
		}
	}
	in, out := c.e.seqs[c.in[m.inTA]], c.e.seqs[c.in[m.outTA]]
	k, kOK := c.e.value(c.in[m.kernel])
	r, rOK := c.e.value(c.in[m.rec])
	g := int64(4)
	if m.gru {
		g = 3
	}
	if in.from == "" || !out.reserved || !kOK || !rOK || len(r.Dims) != 2 || len(k.Dims) != 2 || r.Dims[1] != g*r.Dims[0] || k.Dims[1] != r.Dims[1] {
		return "", 0, false
	}
	return in.from, r.Dims[0], true
}

func isZero(t *onnx.Tensor) bool {
	f, err := t.Float64s()
	return err == nil && len(f) == 1 && f[0] == 0
}

// emitKerasRNN writes the recognised loop as one ONNX LSTM or GRU over the
// first min(limits) steps of the input, and every loop variable's final
// value from it.
func (c *opCtx) emitKerasRNN(m *kerasRNN, types []smpb.DataType) bool {
	x, units, ok := c.kerasOuter(m)
	if !ok {
		return false
	}
	name := c.n.name
	var bounds []string
	for _, l := range m.limits {
		b := ""
		if l.arg >= 0 {
			b = c.in[l.arg]
		} else {
			b, _ = c.e.constant(c.e.fresh(name+"/limit"), l.value)
		}
		bounds = append(bounds, c.tmp("Cast", []string{b}, attrInt("to", int64(onnx.Int64))))
	}
	steps := c.tmp("Reshape", []string{c.tmp("Min", bounds), c.e.ints(name+"/one", 1)})
	x = c.tmp("Slice", []string{x, c.e.ints(name+"/zero", 0), steps, c.e.ints(name+"/axis0", 0)})
	order, op := []int64{0, 3, 1, 2}, "LSTM" // Keras i,f,c,o → ONNX i,o,f,c
	if m.gru {
		order, op = []int64{0, 1, 2}, "GRU" // Keras z,r,h is ONNX's order
	}
	w, r := c.gateMatrix(c.in[m.kernel], order), c.gateMatrix(c.in[m.rec], order)
	var b string
	if m.gru {
		b = c.tmp("Concat", []string{c.in[m.bias], c.in[m.recBias]}, attrInt("axis", 0))
	} else {
		zeros, _ := c.e.constant(c.e.fresh(name+"/rbias"), &onnx.Tensor{Type: onnx.Float, Dims: []int64{4 * units}, Data: make([]float32, 4*units)})
		b = c.tmp("Concat", []string{c.reorder(c.in[m.bias], 0, order), zeros}, attrInt("axis", 0))
	}
	ax0 := c.e.ints(name+"/ax0", 0)
	b = c.tmp("Unsqueeze", []string{b, ax0})
	ins := []string{x, w, r, b, "", c.tmp("Unsqueeze", []string{c.in[m.h], ax0})}
	y, yh, yc := c.e.fresh(name+"/Y"), c.e.fresh(name+"/Y_h"), c.e.fresh(name+"/Y_c")
	outs := []string{y, yh}
	attrs := []*onnxpb.AttributeProto{attrInt("hidden_size", units)}
	if m.gru {
		attrs = append(attrs, attrInt("linear_before_reset", 1))
	} else {
		ins, outs = append(ins, c.tmp("Unsqueeze", []string{c.in[m.c], ax0})), append(outs, yc)
	}
	c.e.node(op, ins, outs, attrs...)
	seq := c.tmp("Squeeze", []string{y, c.e.ints(name+"/dir", 1)})
	c.e.node("SplitToSequence", []string{seq}, []string{c.out(m.outTA)}, attrInt("axis", 0), attrInt("keepdims", 0))
	c.e.setList(c.out(m.outTA), seqInfo{elem: c.e.seqs[c.in[m.outTA]].elem, from: seq})
	c.e.node("Squeeze", []string{yh, ax0}, []string{c.out(m.h)})
	if !m.gru {
		c.e.node("Squeeze", []string{yc, ax0}, []string{c.out(m.c)})
	}
	for i, x := range c.in {
		switch {
		case i == m.time || i == m.counter:
			dt, _ := ONNXType(types[i] % 100)
			c.e.node("Cast", []string{c.tmp("Squeeze", []string{steps, ax0})}, []string{c.out(i)}, attrInt("to", int64(dt)))
		case i != m.outTA && i != m.h && i != m.c:
			c.e.node("Identity", []string{x}, []string{c.out(i)})
		}
	}
	return true
}

// gateMatrix turns a Keras kernel [in, g·units] into ONNX's [1, g·units,
// in] with the gates in ONNX order.
func (c *opCtx) gateMatrix(k string, order []int64) string {
	t := c.tmp("Transpose", []string{c.reorder(k, 1, order)}, attrInts("perm", 1, 0))
	return c.tmp("Unsqueeze", []string{t, c.e.ints(c.n.name+"/ax0", 0)})
}

// reorder splits v into len(order) equal blocks along axis and
// concatenates them in order.
func (c *opCtx) reorder(v string, axis int64, order []int64) string {
	parts := make([]string, len(order))
	for i := range parts {
		parts[i] = c.e.fresh(c.n.name + "/gate")
	}
	c.e.node("Split", []string{v}, parts, attrInt("axis", axis))
	var out []string
	for _, k := range order {
		out = append(out, parts[k])
	}
	return c.tmp("Concat", out, attrInt("axis", axis))
}
