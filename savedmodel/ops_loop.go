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
	"While": whileOp, "StatelessWhile": whileOp,
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
	return &emitter{g: &onnxpb.GraphProto{Name: proto.String(name)}, file: e.file, consts: map[string]*onnx.Tensor{}, n: e.n}
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
// layers save becomes one ONNX LSTM or GRU, any other to a Loop. Values the body
// returns unchanged are read from the enclosing graph instead of being
// carried, so constants (weights) stay constants inside the body.
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
	ch := c.e.child(c.n.name + "/body")
	iter, condIn := ch.fresh(c.n.name+"/iter"), ch.fresh(c.n.name+"/cond_in")
	ch.g.Input = append(ch.g.Input, onnx.TensorType(iter, onnx.Int64, onnx.Shape{Ranked: true}),
		onnx.TensorType(condIn, onnx.Bool, onnx.Shape{Ranked: true}))
	args := make([]string, len(c.in))
	var carried []int
	for i, x := range c.in {
		if inv[i] {
			args[i] = x
			if t, ok := c.e.consts[x]; ok {
				ch.consts[x] = t
			}
			if s, ok := c.e.seqs[x]; ok {
				ch.setList(x, s)
			}
			continue
		}
		args[i] = ch.fresh(c.n.name + "/in" + strconv.Itoa(i))
		vi, err := c.loopType(args[i], i, types[i])
		if err != nil {
			return err
		}
		if dt, ok := c.e.seq(x); ok {
			ch.setSeq(args[i], dt)
		}
		ch.g.Input = append(ch.g.Input, vi)
		carried = append(carried, i)
	}
	rets, err := emitFunction(ch, c.fg, c.n.name+"/body", body, args)
	if err != nil {
		return fmt.Errorf("body %s: %w", body.GetSignature().GetName(), err)
	}
	next, err := emitFunction(ch, c.fg, c.n.name+"/cond", cond, rets)
	if err = condResult(cond, next, err); err != nil {
		return err
	}
	condOut := ch.fresh(c.n.name + "/cond_out")
	ch.node("Cast", next, []string{condOut}, attrInt("to", int64(onnx.Bool)))
	ch.g.Output = append(ch.g.Output, onnx.TensorType(condOut, onnx.Bool, onnx.Shape{Ranked: true}))
	loopIns, loopOuts := []string{"", ""}, []string(nil)
	for _, i := range carried {
		o := ch.fresh(c.n.name + "/out" + strconv.Itoa(i))
		ch.node("Identity", []string{rets[i]}, []string{o})
		vi, _ := c.loopType(o, i, types[i])
		ch.g.Output = append(ch.g.Output, vi)
		loopIns = append(loopIns, c.in[i])
		loopOuts = append(loopOuts, c.out(i))
		if dt, ok := c.e.seq(c.in[i]); ok {
			c.e.setSeq(c.out(i), dt)
		}
	}
	c.e.adopt(ch)
	first, err := emitFunction(c.e, c.fg, c.n.name+"/cond_init", cond, c.in)
	if err = condResult(cond, first, err); err != nil {
		return err
	}
	loopIns[1] = c.tmp("Cast", first, attrInt("to", int64(onnx.Bool)))
	for i, x := range c.in {
		if inv[i] {
			c.e.node("Identity", []string{x}, []string{c.out(i)})
		}
	}
	if len(loopOuts) == 0 {
		return fmt.Errorf("the body changes no loop variable")
	}
	c.e.node("Loop", loopIns, loopOuts, attrGraph("body", ch.g))
	return nil
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

func listReserve(c *opCtx) error {
	dt, err := c.dtype("element_dtype")
	if err != nil {
		return err
	}
	c.emit("SequenceEmpty", nil, attrInt("dtype", int64(dt)))
	c.e.setList(c.out(0), seqInfo{elem: dt, reserved: true})
	return nil
}

func listFromTensor(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	dt, err := c.dtype("element_dtype")
	if err != nil {
		return err
	}
	c.emit("SplitToSequence", []string{x}, attrInt("axis", 0), attrInt("keepdims", 0))
	c.e.setList(c.out(0), seqInfo{elem: dt, from: x})
	return nil
}

// list returns input 0, which must be a TensorList, and its element type.
func (c *opCtx) list() (string, onnx.DataType, error) {
	h, err := c.input(0)
	if err != nil {
		return "", 0, err
	}
	dt, ok := c.e.seq(h)
	if !ok {
		return "", 0, fmt.Errorf("input %s is not a TensorList this import made", h)
	}
	return h, dt, nil
}

func listGetItem(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	i, err := c.input(1)
	if err != nil {
		return err
	}
	c.emit("SequenceAt", []string{h, i})
	return nil
}

// listSetItem replaces item i, or appends it when i is the list's length:
// TensorListReserve makes an empty sequence, which the usual writes
// (item 0, 1, 2, … as a loop runs) then fill in order.
func listSetItem(c *opCtx) error {
	h, dt, err := c.list()
	if err != nil {
		return err
	}
	if len(c.in) != 3 {
		return fmt.Errorf("has %d inputs, want 3", len(c.in))
	}
	i := c.tmp("Cast", c.in[1:2], attrInt("to", int64(onnx.Int64)))
	inside := c.tmp("Less", []string{i, c.tmp("SequenceLength", []string{h})})
	branch := func(tag string, replace bool) *onnxpb.GraphProto {
		b := c.e.child(c.n.name + "/" + tag)
		out := b.fresh(c.n.name + "/" + tag)
		if replace {
			b.node("SequenceInsert", []string{b.tmp(c.n.name+"/erase", "SequenceErase", []string{h, i}), c.in[2], i}, []string{out})
		} else {
			b.node("SequenceInsert", []string{h, c.in[2]}, []string{out})
		}
		b.g.Output = append(b.g.Output, seqType(out, dt))
		c.e.adopt(b)
		return b.g
	}
	c.emit("If", []string{inside}, attrGraph("then_branch", branch("replace", true)), attrGraph("else_branch", branch("append", false)))
	c.e.setSeq(c.out(0), dt)
	return nil
}

// listStack stacks the items; a list known to hold a tensor's rows is
// that tensor.
func listStack(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	if from := c.e.seqs[h].from; from != "" {
		c.emit("Identity", []string{from})
		return nil
	}
	c.emit("ConcatFromSequence", []string{h}, attrInt("axis", 0), attrInt("new_axis", 1))
	return nil
}

func listLength(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	c.emit("Cast", []string{c.tmp("SequenceLength", []string{h})}, attrInt("to", int64(onnx.Int32)))
	return nil
}

// listElementShape is the shape of item 0 (a list of no items has none).
func listElementShape(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	dt, err := c.dtype("shape_type")
	if err != nil {
		dt = onnx.Int32
	}
	item := c.tmp("SequenceAt", []string{h, c.e.ints(c.n.name+"/first", 0)})
	c.emit("Cast", []string{c.tmp("Shape", []string{item})}, attrInt("to", int64(dt)))
	return nil
}

func listPushBack(c *opCtx) error {
	h, dt, err := c.list()
	if err != nil {
		return err
	}
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	c.emit("SequenceInsert", []string{h, c.in[1]})
	c.e.setSeq(c.out(0), dt)
	return nil
}
