package savedmodel

import (
	"fmt"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// emitter accumulates the ONNX graph.
type emitter struct {
	g      *onnxpb.GraphProto
	file   string
	consts map[string]constVal // value name → constant value
	seqs   map[string]seqInfo  // sequence value (a TensorList) → what it holds
	n      int
}

// constVal is a constant's value: decoded, or the initializer it is decoded
// from when an op asks (checkpoint variables, kept as the bytes read).
type constVal struct {
	t *onnx.Tensor
	p *onnxpb.TensorProto
}

func (e *emitter) fresh(base string) string {
	e.n++
	return base + "__" + strconv.Itoa(e.n)
}

// node adds an ONNX node; its name is its first output's.
func (e *emitter) node(op string, ins, outs []string, attrs ...*onnxpb.AttributeProto) {
	e.g.Node = append(e.g.Node, &onnxpb.NodeProto{
		Name: proto.String(outs[0]), OpType: proto.String(op), Input: ins, Output: outs, Attribute: attrs,
	})
}

// tmp adds a one-output node writing a fresh name and returns it.
func (e *emitter) tmp(base, op string, ins []string, attrs ...*onnxpb.AttributeProto) string {
	out := e.fresh(base)
	e.node(op, ins, []string{out}, attrs...)
	return out
}

// constant adds an initializer named name.
func (e *emitter) constant(name string, t *onnx.Tensor) (string, error) {
	c := *t
	c.Name = name
	p, err := onnx.Encode(&c, onnx.Raw)
	if err != nil {
		return "", err
	}
	e.g.Initializer = append(e.g.Initializer, p)
	e.consts[name] = constVal{t: &c}
	return name, nil
}

// initializer adds p, renamed to name, as an initializer without decoding
// it.
func (e *emitter) initializer(name string, p *onnxpb.TensorProto) {
	p.Name = proto.String(name)
	e.g.Initializer = append(e.g.Initializer, p)
	e.consts[name] = constVal{p: p}
}

// value returns the constant value named name, decoding an initializer
// added undecoded (a fresh copy each time: a big weight an op does not
// read stays in its stored bytes alone).
func (e *emitter) value(name string) (*onnx.Tensor, bool) {
	v, ok := e.consts[name]
	if !ok || v.t != nil {
		return v.t, ok
	}
	t, err := onnx.Decode(v.p)
	return t, err == nil
}

// ints adds a fresh 1-D int64 initializer.
func (e *emitter) ints(base string, v ...int64) string {
	name, _ := e.constant(e.fresh(base), &onnx.Tensor{Type: onnx.Int64, Dims: []int64{int64(len(v))}, Data: slices.Clone(v)})
	return name
}

// scalar adds a fresh scalar initializer of type dt.
func (e *emitter) scalar(base string, dt onnx.DataType, v float64) (string, error) {
	var data any
	switch dt {
	case onnx.Float:
		data = []float32{float32(v)}
	case onnx.Double:
		data = []float64{v}
	case onnx.Int32:
		data = []int32{int32(v)}
	case onnx.Int64:
		data = []int64{int64(v)}
	default:
		f, err := e.constant(e.fresh(base), &onnx.Tensor{Type: onnx.Float, Data: []float32{float32(v)}})
		if err != nil {
			return "", err
		}
		return e.tmp(base, "Cast", []string{f}, attrInt("to", int64(dt))), nil
	}
	return e.constant(e.fresh(base), &onnx.Tensor{Type: dt, Data: data})
}

// buildGraph emits the ONNX graph of one signature.
func buildGraph(fg *flatGraph, sd *smpb.SignatureDef, vars map[string]*onnxpb.TensorProto, c *Conversion, given map[string][]int64) (*onnxpb.GraphProto, error) {
	e := &emitter{g: &onnxpb.GraphProto{Name: proto.String(Sanitize(c.Signature))}, file: fg.file, consts: map[string]constVal{}}
	stop := map[string]bool{}
	names := map[string]string{} // TF tensor → ONNX value
	known := map[string]tshape{} // TF tensor → shape
	for _, key := range sortedKeys(sd.GetInputs()) {
		ti := sd.GetInputs()[key]
		nm, dt, err := mapping(key, ti)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fg.file, err)
		}
		sh, from, err := inputShape(fg, key, ti, given)
		if err != nil {
			return nil, fmt.Errorf("%s: signature %q: %w", fg.file, c.Signature, err)
		}
		nm.record(sh, from)
		s := sh.onnxShape()
		if dt == onnx.String {
			return nil, fmt.Errorf("%s: signature %q input %s (%s) is DT_STRING: string inputs, such as serialized tf.Example "+
				"batches, are not supported; export a signature taking the numeric feature tensors", fg.file, c.Signature, key, ti.GetName())
		}
		ref := canon(ti.GetName())
		stop[ref] = true
		names[ref] = nm.ONNX
		known[ref] = sh
		e.g.Input = append(e.g.Input, onnx.TensorType(nm.ONNX, dt, s))
		c.Inputs = append(c.Inputs, nm)
	}
	var outs []string
	for _, key := range sortedKeys(sd.GetOutputs()) {
		outs = append(outs, fg.resolve(canon(sd.GetOutputs()[key].GetName()), stop))
	}
	order, err := fg.prune(outs, stop)
	if err != nil {
		return nil, err
	}
	if err := emitNodes(e, fg, order, stop, names, vars); err != nil {
		return nil, err
	}
	si := inferShapes(order, known, vars)
	for i, key := range sortedKeys(sd.GetOutputs()) {
		nm, dt, err := mapping(key, sd.GetOutputs()[key])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fg.file, err)
		}
		sh, from := outputShape(sd.GetOutputs()[key], si.of(outs[i]))
		nm.record(sh, from)
		s := sh.onnxShape()
		e.node("Identity", []string{valueName(names, outs[i])}, []string{nm.ONNX})
		e.g.Output = append(e.g.Output, onnx.TensorType(nm.ONNX, dt, s))
		c.Outputs = append(c.Outputs, nm)
	}
	return e.g, nil
}

func valueName(names map[string]string, ref string) string {
	if n, ok := names[ref]; ok {
		return n
	}
	return ref
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// prune lists the nodes the outputs need, inputs first, stopping at the
// signature inputs.
func (fg *flatGraph) prune(outs []string, stop map[string]bool) ([]*tfNode, error) {
	var order []*tfNode
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(ref string) error
	visit = func(ref string) error {
		if stop[ref] {
			return nil
		}
		name, _ := refNode(ref)
		switch state[name] {
		case 1:
			return fmt.Errorf("%s: node %s is part of a cycle (control flow loops are not supported)", fg.file, name)
		case 2:
			return nil
		}
		n := fg.nodes[name]
		if n == nil {
			return fmt.Errorf("%s: tensor %s names no node", fg.file, ref)
		}
		state[name] = 1
		for i, in := range n.inputs {
			r := fg.resolve(in, stop)
			n.inputs[i] = r
			if err := visit(r); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, n)
		return nil
	}
	for _, o := range outs {
		if err := visit(o); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// emitNodes converts the pruned nodes in order, after checking that every
// op has a mapping.
func emitNodes(e *emitter, fg *flatGraph, order []*tfNode, stop map[string]bool, names map[string]string, vars map[string]*onnxpb.TensorProto) error {
	var bad []UnsupportedOp
	for _, n := range order {
		if _, ok := opTable[n.op]; !ok && !variableOps[n.op] {
			bad = append(bad, UnsupportedOp{Node: n.name, Op: n.op})
		}
	}
	if len(bad) > 0 {
		return &UnsupportedOpsError{File: fg.file, Ops: bad}
	}
	for _, n := range order {
		if variableOps[n.op] {
			p, ok := vars[n.name]
			if !ok {
				return fmt.Errorf("%s: node %s (op %s): variable has no value in the checkpoint", fg.file, n.name, n.op)
			}
			e.initializer(n.name+":0", p)
			continue
		}
		c := &opCtx{e: e, fg: fg, n: n}
		for _, in := range n.inputs {
			c.in = append(c.in, valueName(names, in))
		}
		if err := opTable[n.op](c); err != nil {
			where := n.fn
			if where == "" {
				where = "main graph"
			}
			return fmt.Errorf("%s: node %s (op %s, in %s): %w", fg.file, n.name, n.op, where, err)
		}
	}
	return nil
}
