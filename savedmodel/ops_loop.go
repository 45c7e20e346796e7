package savedmodel

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// loopOps are TF2 control flow (While over library functions) and the
// TensorList ops its bodies read and write. A TensorList becomes an ONNX
// sequence of tensors; a While becomes a Loop whose body is the body
// function followed by the cond function, and whose initial condition is
// the cond function run on the initial values.
var loopOps = map[string]opFunc{
	"While": whileOp, "StatelessWhile": whileOp, "If": ifOp, "StatelessIf": ifOp,
	"TensorListReserve": listReserve, "EmptyTensorList": listReserve, "TensorListFromTensor": listFromTensor,
	"TensorListGetItem": listGetItem, "TensorListSetItem": listSetItem, "TensorListStack": listStack,
	"TensorListLength": listLength, "TensorListElementShape": listElementShape, "TensorListPushBack": listPushBack,
}

const (
	tfResource = smpb.DataType(20)
	tfVariant  = smpb.DataType(21)
)

// seqType is the ValueInfo of a sequence of dt tensors.
func seqType(name string, dt onnx.DataType) *onnxpb.ValueInfoProto {
	elem := onnx.TensorType("", dt, onnx.Shape{}).GetType()
	return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{
		Value: &onnxpb.TypeProto_SequenceType{SequenceType: &onnxpb.TypeProto_Sequence{ElemType: elem}}}}
}

func attrGraph(name string, g *onnxpb.GraphProto) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_GRAPH
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, G: g}
}

// subgraphInputs lists every value the nodes of n's subgraphs read, at any
// depth: the values of the enclosing scopes they capture among them.
func subgraphInputs(n *onnxpb.NodeProto) []string {
	var out []string
	for _, a := range n.GetAttribute() {
		gs := a.GetGraphs()
		if a.GetG() != nil {
			gs = append(gs, a.GetG())
		}
		for _, g := range gs {
			for _, m := range g.GetNode() {
				out = append(out, m.GetInput()...)
				out = append(out, subgraphInputs(m)...)
			}
			for _, o := range g.GetOutput() {
				out = append(out, o.GetName())
			}
		}
	}
	return out
}

// replaceSubgraphUses renames a captured value inside n's subgraphs.
func replaceSubgraphUses(n *onnxpb.NodeProto, from, to string) {
	for _, a := range n.GetAttribute() {
		gs := a.GetGraphs()
		if a.GetG() != nil {
			gs = append(gs, a.GetG())
		}
		for _, g := range gs {
			replaceUses(g, from, to)
		}
	}
}

// child starts an emitter for a subgraph of e; names stay unique across
// both because they share e's counter (handed back by adopt).
func (e *emitter) child(name string) *emitter {
	return &emitter{g: &onnxpb.GraphProto{Name: proto.String(name)}, file: e.file, consts: map[string]constVal{}, n: e.n}
}

func (e *emitter) adopt(ch *emitter) { e.n = ch.n }

// seqInfo is what the import knows of a sequence value (a TensorList).
type seqInfo struct {
	elem onnx.DataType
	// from is the tensor whose rows it holds (TensorListFromTensor, a
	// recognised recurrent layer's outputs), when known.
	from string
	// reserved: made by TensorListReserve, so empty.
	reserved bool
	// scan: a list a Loop body writes one item into per iteration; inside
	// the body it stands for that item, which becomes a scan output.
	scan bool
}

func (e *emitter) seq(v string) (onnx.DataType, bool) {
	s, ok := e.seqs[v]
	return s.elem, ok
}

func (e *emitter) setSeq(v string, dt onnx.DataType) { e.setList(v, seqInfo{elem: dt}) }

func (e *emitter) setList(v string, s seqInfo) {
	if e.seqs == nil {
		e.seqs = map[string]seqInfo{}
	}
	e.seqs[v] = s
}

// emitFunction emits library function f into e with its arguments bound
// to the ONNX values args and returns the ONNX values of its outputs.
func emitFunction(e *emitter, fg *flatGraph, prefix string, f *smpb.FunctionDef, args []string) ([]string, error) {
	sub := &flatGraph{file: fg.file, nodes: map[string]*tfNode{}, alias: map[string]string{}, lib: fg.lib}
	stop, names := map[string]bool{}, map[string]string{}
	refs := make([]string, len(args))
	for i, a := range args {
		refs[i] = prefix + "/__arg" + strconv.Itoa(i) + ":0"
		stop[refs[i]], names[refs[i]] = true, a
	}
	rets, err := sub.inline(prefix, f, refs)
	if err != nil {
		return nil, err
	}
	for i, r := range rets {
		rets[i] = sub.resolve(r, stop)
	}
	order, err := sub.prune(rets, stop)
	if err != nil {
		return nil, err
	}
	if err := emitNodes(e, sub, order, stop, names, nil); err != nil {
		return nil, err
	}
	out := make([]string, len(rets))
	for i, r := range rets {
		out[i] = valueName(names, r)
	}
	return out, nil
}

// invariantArgs reports which of f's arguments it returns unchanged at
// the same position (through Identity-like nodes), as TF2's while_v2
// passes captured tensors and the trip limit through its body.
func invariantArgs(f *smpb.FunctionDef) []bool {
	nodes := map[string]*smpb.NodeDef{}
	for _, nd := range f.GetNodeDef() {
		nodes[nd.GetName()] = nd
	}
	out := make([]bool, len(f.GetSignature().GetInputArg()))
	for k, oa := range f.GetSignature().GetOutputArg() {
		ref := f.GetRet()[oa.GetName()]
		for range 1000 {
			nd := nodes[strings.Split(ref, ":")[0]]
			if nd == nil || !passThrough[nd.GetOp()] || len(nd.GetInput()) == 0 {
				break
			}
			ref = nd.GetInput()[0]
		}
		if k < len(out) && ref == f.GetSignature().GetInputArg()[k].GetName() {
			out[k] = true
		}
	}
	return out
}

func (c *opCtx) function(attr string) (*smpb.FunctionDef, error) {
	name := c.attr(attr).GetFunc().GetName()
	f, ok := c.fg.lib[name]
	if !ok {
		return nil, fmt.Errorf("%s function %q is not in the function library", attr, name)
	}
	return f, nil
}

// loopType is the ONNX type of loop variable i of TF type t.
func (c *opCtx) loopType(name string, i int, t smpb.DataType) (*onnxpb.ValueInfoProto, error) {
	switch t {
	case tfVariant:
		dt, ok := c.e.seq(c.in[i])
		if !ok {
			return nil, fmt.Errorf("loop variable %d (%s) is a variant that is not a TensorList", i, c.in[i])
		}
		return seqType(name, dt), nil
	case tfResource:
		return nil, fmt.Errorf("loop variable %d (%s) is a resource the body changes", i, c.in[i])
	}
	dt, err := ONNXType(t % 100)
	if err != nil {
		return nil, fmt.Errorf("loop variable %d: %w", i, err)
	}
	return onnx.TensorType(name, dt, onnx.Shape{}), nil
}

// whileOp maps While/StatelessWhile to ONNX: the loop Keras's LSTM and GRU
// layers save becomes one ONNX LSTM or GRU, any other a Loop. Values the
// body returns unchanged are read from the enclosing graph instead of being
// carried, so constants (weights) stay constants inside the body; a list
// written one item per iteration becomes a scan output, so the usual
// TensorArray loops need no sequences.
func whileOp(c *opCtx) error {
	body, err := c.function("body")
	if err != nil {
		return err
	}
	cond, err := c.function("cond")
	if err != nil {
		return err
	}
	types := c.attr("T").GetList().GetType()
	if len(types) != len(c.in) || len(body.GetSignature().GetInputArg()) != len(c.in) {
		return fmt.Errorf("has %d inputs, %d types in T and a body taking %d", len(c.in), len(types), len(body.GetSignature().GetInputArg()))
	}
	inv := invariantArgs(body)
	if m, ok := matchKerasRNN(c.fg, c.n.name, body, cond, inv); ok && c.emitKerasRNN(m, types) {
		return nil
	}
	l := &loop{c: c, types: types, inv: inv, scan: c.scanLists(body, cond, inv)}
	if err := l.body(body, cond); err != nil {
		return err
	}
	return l.emit(cond)
}

// loop is a While being written as an ONNX Loop.
type loop struct {
	c     *opCtx
	types []smpb.DataType
	inv   []bool
	scan  map[int]bool // loop variables that become scan outputs
	ch    *emitter     // the body graph
	// carried are the loop variables the Loop carries, scanned the
	// ones it scans; rets are the body's results.
	carried, scanned []int
	rets             []string
}

// body emits the body graph: the body function on the carried values,
// then the cond function on its results.
func (l *loop) body(body, cond *smpb.FunctionDef) error {
	c := l.c
	l.ch = c.e.child(c.n.name + "/body")
	ch := l.ch
	iter, condIn := ch.fresh(c.n.name+"/iter"), ch.fresh(c.n.name+"/cond_in")
	ch.g.Input = append(ch.g.Input, onnx.TensorType(iter, onnx.Int64, onnx.Shape{Ranked: true}),
		onnx.TensorType(condIn, onnx.Bool, onnx.Shape{Ranked: true}))
	args := make([]string, len(c.in))
	for i, x := range c.in {
		switch {
		case l.inv[i]:
			args[i] = x
			if t, ok := c.e.consts[x]; ok {
				ch.consts[x] = t
			}
			if s, ok := c.e.seqs[x]; ok {
				ch.setList(x, s)
			}
		case l.scan[i]:
			args[i] = ch.fresh(c.n.name + "/scan" + strconv.Itoa(i))
			ch.setList(args[i], seqInfo{elem: c.e.seqs[x].elem, scan: true})
			l.scanned = append(l.scanned, i)
		default:
			args[i] = ch.fresh(c.n.name + "/in" + strconv.Itoa(i))
			vi, err := c.loopType(args[i], i, l.types[i])
			if err != nil {
				return err
			}
			if dt, ok := c.e.seq(x); ok {
				ch.setSeq(args[i], dt)
			}
			ch.g.Input = append(ch.g.Input, vi)
			l.carried = append(l.carried, i)
		}
	}
	rets, err := emitFunction(ch, c.fg, c.n.name+"/body", body, args)
	if err != nil {
		return fmt.Errorf("body %s: %w", body.GetSignature().GetName(), err)
	}
	l.rets = rets
	next, err := emitFunction(ch, c.fg, c.n.name+"/cond", cond, rets)
	if err = condResult(cond, next, err); err != nil {
		return err
	}
	condOut := ch.fresh(c.n.name + "/cond_out")
	ch.node("Cast", next, []string{condOut}, attrInt("to", int64(onnx.Bool)))
	ch.g.Output = append(ch.g.Output, onnx.TensorType(condOut, onnx.Bool, onnx.Shape{Ranked: true}))
	return nil
}

// emit writes the Loop, its initial condition and every While output.
func (l *loop) emit(cond *smpb.FunctionDef) error {
	c, ch := l.c, l.ch
	loopIns, loopOuts := []string{"", ""}, []string(nil)
	for _, i := range l.carried {
		o := ch.fresh(c.n.name + "/out" + strconv.Itoa(i))
		ch.node("Identity", []string{l.rets[i]}, []string{o})
		vi, _ := c.loopType(o, i, l.types[i])
		ch.g.Output = append(ch.g.Output, vi)
		loopIns = append(loopIns, c.in[i])
		loopOuts = append(loopOuts, c.out(i))
		if dt, ok := c.e.seq(c.in[i]); ok {
			c.e.setSeq(c.out(i), dt)
		}
	}
	var stacked []string
	for _, i := range l.scanned {
		o := ch.fresh(c.n.name + "/item" + strconv.Itoa(i))
		ch.node("Identity", []string{l.rets[i]}, []string{o})
		ch.g.Output = append(ch.g.Output, onnx.TensorType(o, c.e.seqs[c.in[i]].elem, onnx.Shape{}))
		stacked = append(stacked, c.e.fresh(c.n.name+"/stacked"+strconv.Itoa(i)))
	}
	c.e.adopt(ch)
	first, err := emitFunction(c.e, c.fg, c.n.name+"/cond_init", cond, c.in)
	if err = condResult(cond, first, err); err != nil {
		return err
	}
	loopIns[1] = c.tmp("Cast", first, attrInt("to", int64(onnx.Bool)))
	if len(loopOuts)+len(stacked) == 0 {
		return fmt.Errorf("the body changes no loop variable")
	}
	c.e.node("Loop", loopIns, append(loopOuts, stacked...), attrGraph("body", ch.g))
	for k, i := range l.scanned {
		c.e.node("SplitToSequence", []string{stacked[k]}, []string{c.out(i)}, attrInt("axis", 0), attrInt("keepdims", 0))
		c.e.setList(c.out(i), seqInfo{elem: c.e.seqs[c.in[i]].elem, from: stacked[k]})
	}
	for i, x := range c.in {
		if l.inv[i] {
			c.e.node("Identity", []string{x}, []string{c.out(i)})
		}
	}
	return nil
}

// scanLists finds the loop variables that are TensorLists the loop fills
// one item per iteration: empty (TensorListReserve) at the start, set at
// index time by the body and read nowhere else, with time starting at 0
// and growing by 1 each iteration. Item i is then the Loop's i-th scan
// output.
func (c *opCtx) scanLists(body, cond *smpb.FunctionDef, inv []bool) map[int]bool {
	out := map[int]bool{}
	v, ok := viewFunction(c.fg, c.n.name+"/scan_body", body)
	cv, okC := viewFunction(c.fg, c.n.name+"/scan_cond", cond)
	if !ok || !okC || len(v.rets) != len(c.in) {
		return out
	}
	for k, r := range v.rets {
		s := v.node(r, "TensorListSetItem", 0)
		if inv[k] || !c.e.seqs[c.in[k]].reserved || s == nil || v.arg(v.in(s, 0)) != k {
			continue
		}
		t := v.arg(v.in(s, 1))
		if t < 0 || inv[t] || !v.either(v.add(v.rets[t]), func(x, y string) bool { return v.arg(x) == t && v.isConst(y, 1) }) {
			continue
		}
		if z, isConst := c.e.value(c.in[t]); !isConst || !isZero(z) || v.reads(k, s) || v.uses(r, k) || cv.reads(k, nil) {
			continue
		}
		out[k] = true
	}
	return out
}

// uses reports whether a node, or a result other than k, reads ref
// (Identity-like nodes pass it on and do not count; their readers do).
func (v *fnView) uses(ref string, k int) bool {
	for _, n := range v.fg.nodes {
		if passThrough[n.op] || n.op == "IdentityN" {
			continue
		}
		for _, in := range n.inputs {
			if v.fg.resolve(in, v.stop) == ref {
				return true
			}
		}
	}
	for j, r := range v.rets {
		if j != k && r == ref {
			return true
		}
	}
	return false
}

// reads reports whether a node other than except (and Identity-like
// ones) reads argument k.
func (v *fnView) reads(k int, except *tfNode) bool {
	for _, n := range v.fg.nodes {
		if n == except || passThrough[n.op] || n.op == "IdentityN" {
			continue
		}
		for _, in := range n.inputs {
			if v.arg(in) == k {
				return true
			}
		}
	}
	for _, r := range v.rets {
		if except == nil && v.arg(r) == k {
			return true
		}
	}
	return false
}

func condResult(cond *smpb.FunctionDef, out []string, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("cond %s: %w", cond.GetSignature().GetName(), err)
	case len(out) != 1:
		return fmt.Errorf("cond %s returns %d values, want 1", cond.GetSignature().GetName(), len(out))
	}
	return nil
}

// ifOp maps If/StatelessIf (tf.cond) to an ONNX If whose branches are the
// branch functions, reading their inputs from the enclosing graph.
func ifOp(c *opCtx) error {
	then, err := c.function("then_branch")
	if err != nil {
		return err
	}
	els, err := c.function("else_branch")
	if err != nil {
		return err
	}
	if len(c.in) < 1 {
		return fmt.Errorf("has no condition input")
	}
	tout := c.attr("Tout").GetList().GetType()
	var graphs []*onnxpb.GraphProto
	for _, b := range []struct {
		tag string
		f   *smpb.FunctionDef
	}{{"then", then}, {"else", els}} {
		ch := c.e.child(c.n.name + "/" + b.tag)
		for _, x := range c.in[1:] {
			if t, ok := c.e.consts[x]; ok {
				ch.consts[x] = t
			}
		}
		rets, err := emitFunction(ch, c.fg, c.n.name+"/"+b.tag, b.f, c.in[1:])
		if err != nil {
			return fmt.Errorf("%s branch %s: %w", b.tag, b.f.GetSignature().GetName(), err)
		}
		if len(rets) != len(tout) {
			return fmt.Errorf("%s branch %s returns %d values, Tout has %d", b.tag, b.f.GetSignature().GetName(), len(rets), len(tout))
		}
		for i, r := range rets {
			dt, err := ONNXType(tout[i] % 100)
			if err != nil {
				return fmt.Errorf("output %d: %w", i, err)
			}
			o := ch.fresh(c.n.name + "/" + b.tag + "_out")
			ch.node("Identity", []string{r}, []string{o})
			ch.g.Output = append(ch.g.Output, onnx.TensorType(o, dt, onnx.Shape{}))
		}
		c.e.adopt(ch)
		graphs = append(graphs, ch.g)
	}
	outs := make([]string, len(tout))
	for i := range outs {
		outs[i] = c.out(i)
	}
	if len(outs) == 0 {
		return fmt.Errorf("has no outputs")
	}
	cond := c.tmp("Cast", c.in[:1], attrInt("to", int64(onnx.Bool)))
	c.e.node("If", []string{cond}, outs, attrGraph("then_branch", graphs[0]), attrGraph("else_branch", graphs[1]))
	return nil
}
