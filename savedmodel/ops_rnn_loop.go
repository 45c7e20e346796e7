package savedmodel

import (
	"strconv"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// fnView is a library function inlined for inspection, not emitted: its
// arguments are stop references, its outputs resolved.
type fnView struct {
	fg   *flatGraph
	stop map[string]bool
	args map[string]int
	rets []string
}

func viewFunction(fg *flatGraph, prefix string, f *smpb.FunctionDef) (*fnView, bool) {
	v := &fnView{fg: &flatGraph{file: fg.file, nodes: map[string]*tfNode{}, alias: map[string]string{}, lib: fg.lib},
		stop: map[string]bool{}, args: map[string]int{}}
	var refs []string
	for i := range f.GetSignature().GetInputArg() {
		r := prefix + "/__arg" + strconv.Itoa(i) + ":0"
		refs = append(refs, r)
		v.stop[r], v.args[r] = true, i
	}
	rets, err := v.fg.inline(prefix, f, refs)
	if err != nil {
		return nil, false
	}
	for _, r := range rets {
		v.rets = append(v.rets, v.fg.resolve(r, v.stop))
	}
	return v, true
}

// node is the producer of ref when its op is op and ref is its output idx.
func (v *fnView) node(ref, op string, idx int) *tfNode {
	name, i := refNode(v.fg.resolve(ref, v.stop))
	n := v.fg.nodes[name]
	if n == nil || n.op != op || i != idx {
		return nil
	}
	return n
}

func (v *fnView) in(n *tfNode, i int) string {
	if n == nil || i >= len(n.inputs) {
		return ""
	}
	return v.fg.resolve(n.inputs[i], v.stop)
}

// arg is the argument index ref reads, or -1.
func (v *fnView) arg(ref string) int {
	if i, ok := v.args[v.fg.resolve(ref, v.stop)]; ok {
		return i
	}
	return -1
}

// isConst reports whether ref is a Const holding the single value x.
func (v *fnView) isConst(ref string, x float64) bool {
	n := v.node(ref, "Const", 0)
	if n == nil {
		return false
	}
	t, err := TensorFromProto(n.attr["value"].GetTensor())
	if err != nil {
		return false
	}
	f, err := t.Float64s()
	return err == nil && len(f) == 1 && f[0] == x
}

// either calls match with n's two inputs in both orders.
func (v *fnView) either(n *tfNode, match func(a, b string) bool) bool {
	if n == nil || len(n.inputs) != 2 {
		return false
	}
	a, b := v.in(n, 0), v.in(n, 1)
	return match(a, b) || match(b, a)
}

// split returns the Split node whose output k ref is, with num_split n
// along axis 1 (or -1) of a rank-2 value.
func (v *fnView) split(ref string, k int, n int64) *tfNode {
	name, i := refNode(v.fg.resolve(ref, v.stop))
	s := v.fg.nodes[name]
	if s == nil || s.op != "Split" || i != k || s.attr["num_split"].GetI() != n {
		return nil
	}
	if !v.isConst(v.in(s, 0), 1) && !v.isConst(v.in(s, 0), -1) {
		return nil
	}
	return s
}

// matMul matches MatMul(a, b) without transposes and returns its operands.
func (v *fnView) matMul(ref string) (string, string, bool) {
	m := v.node(ref, "MatMul", 0)
	if m == nil || m.attr["transpose_a"].GetB() || m.attr["transpose_b"].GetB() {
		return "", "", false
	}
	return v.in(m, 0), v.in(m, 1), true
}

// limit is one trip limit of the loop's condition: a loop variable or a
// constant of the cond function.
type limit struct {
	arg   int
	value *onnx.Tensor
}

// limits matches cond as Less(counter, M) && Less(time, N) (while_v2's
// counter check and Keras's time check, either alone) and returns M, N.
func (v *fnView) limits(counter, time int, inv []bool) ([]limit, bool) {
	if len(v.rets) != 1 {
		return nil, false
	}
	var out []limit
	var less func(ref string) bool
	less = func(ref string) bool {
		if a := v.node(ref, "LogicalAnd", 0); a != nil {
			return less(v.in(a, 0)) && less(v.in(a, 1))
		}
		l := v.node(ref, "Less", 0)
		if l == nil || (v.arg(v.in(l, 0)) != time && (counter < 0 || v.arg(v.in(l, 0)) != counter)) {
			return false
		}
		bound := v.in(l, 1)
		if j := v.arg(bound); j >= 0 && inv[j] {
			out = append(out, limit{arg: j})
			return true
		}
		n := v.node(bound, "Const", 0)
		if n == nil {
			return false
		}
		t, err := TensorFromProto(n.attr["value"].GetTensor())
		if err != nil {
			return false
		}
		out = append(out, limit{arg: -1, value: t})
		return true
	}
	return out, less(v.rets[0])
}
