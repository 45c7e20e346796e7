package savedmodel

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// tshape is the best-known shape of a TensorFlow tensor: dims with -1 for
// an unknown size, or no rank at all.
type tshape struct {
	dims   []int64
	ranked bool
}

func ranked(dims ...int64) tshape { return tshape{dims: dims, ranked: true} }

// protoShape reads a TensorShapeProto; a nil one is unknown here (a
// missing _output_shapes entry), not a scalar.
func protoShape(p *smpb.TensorShapeProto) tshape {
	if p == nil {
		return tshape{}
	}
	dims, unknown := Shape(p)
	if unknown {
		return tshape{}
	}
	return ranked(dims...)
}

// full reports whether every dimension is known.
func (s tshape) full() bool { return s.ranked && !slices.Contains(s.dims, -1) }

// rank is the rank, -1 when unknown.
func (s tshape) rank() int {
	if !s.ranked {
		return -1
	}
	return len(s.dims)
}

// dim is dimension i (negative counts from the end), -1 when unknown.
func (s tshape) dim(i int) int64 {
	if i < 0 {
		i += len(s.dims)
	}
	if !s.ranked || i < 0 || i >= len(s.dims) {
		return -1
	}
	return s.dims[i]
}

// merge fills what a leaves unknown from b; where they disagree a wins.
func merge(a, b tshape) tshape {
	if !a.ranked {
		return b
	}
	if !b.ranked || len(a.dims) != len(b.dims) {
		return a
	}
	out := slices.Clone(a.dims)
	for i, d := range out {
		if d < 0 {
			out[i] = b.dims[i]
		}
	}
	return ranked(out...)
}

// better reports whether b knows more than a: a rank a lacks, or a
// dimension a leaves unknown.
func better(a, b tshape) bool {
	m := merge(a, b)
	if m.ranked != a.ranked {
		return true
	}
	return !slices.Equal(m.dims, a.dims)
}

// onnxShape is s as an ONNX value's shape.
func (s tshape) onnxShape() onnx.Shape {
	o := onnx.Shape{Ranked: s.ranked}
	for _, d := range s.dims {
		o.Dims = append(o.Dims, onnx.Dim{Value: max(d, 0), Known: d >= 0})
	}
	return o
}

// Ways a signature argument's shape became known, in NameMapping.ShapeFrom.
const (
	ShapeFromSignature = "signature" // the SignatureDef had it all
	ShapeFromGraph     = "inferred"  // filled from the graph: Placeholder and _output_shapes attributes, propagation through the ops
	ShapeFromGiven     = "given"     // from ConvertOptions.Shapes (kiln --shape)
)

// shapeInfer propagates shapes forward through the pruned graph.
type shapeInfer struct {
	vars   map[string]*onnxpb.TensorProto
	shapes map[string]tshape // tensor ref → shape
	values map[string][]int64
}

func (si *shapeInfer) of(ref string) tshape { return si.shapes[ref] }

// inferShapes computes the shape of every output of the nodes in order,
// the signature inputs (in) already known: what each op's rule gives,
// completed by the node's _output_shapes attribute.
func inferShapes(order []*tfNode, in map[string]tshape, vars map[string]*onnxpb.TensorProto) *shapeInfer {
	si := &shapeInfer{vars: vars, shapes: map[string]tshape{}, values: map[string][]int64{}}
	for ref, s := range in {
		si.shapes[ref] = s
	}
	for _, n := range order {
		outs := si.rule(n)
		attr := n.attr["_output_shapes"].GetList().GetShape()
		for i := range max(len(outs), len(attr)) {
			var s, a tshape
			if i < len(outs) {
				s = outs[i]
			}
			if i < len(attr) {
				a = protoShape(attr[i])
			}
			si.shapes[n.name+":"+strconv.Itoa(i)] = merge(s, a)
		}
	}
	return si
}

// sameShapeOps give their first input's shape to their (first) output.
var sameShapeOps = map[string]bool{
	"Relu6": true, "LeakyRelu": true, "Softmax": true, "LogSoftmax": true, "Rsqrt": true, "Square": true,
	"Cast": true, "BiasAdd": true, "BiasAddV1": true, "FusedBatchNorm": true, "FusedBatchNormV2": true,
	"FusedBatchNormV3": true, "ZerosLike": true, "OnesLike": true, "Identity": true, "PreventGradient": true,
	"StopGradient": true, "Snapshot": true, "ReadVariableOp": true, "PlaceholderWithDefault": true,
	"EnsureShape": true, "CheckNumerics": true,
}

// broadcastOps broadcast their inputs numpy-style.
var broadcastOps = map[string]bool{"SquaredDifference": true, "DivNoNan": true, "FloorDiv": true, "SelectV2": true}

// rule is the shapes of n's outputs from its inputs' shapes and values.
func (si *shapeInfer) rule(n *tfNode) []tshape {
	in := func(i int) tshape {
		if i >= len(n.inputs) {
			return tshape{}
		}
		return si.of(n.inputs[i])
	}
	switch {
	case sameShapeOps[n.op] || unaryOps[n.op] != "":
		return []tshape{in(0)}
	case broadcastOps[n.op] || binaryOps[n.op] != "":
		return []tshape{si.broadcast(n.inputs...)}
	case variableOps[n.op]:
		if t, ok := si.vars[n.name]; ok {
			return []tshape{ranked(slices.Clone(t.GetDims())...)}
		}
		return []tshape{protoShape(n.attr["shape"].GetShape())}
	}
	switch n.op {
	case "Placeholder":
		return []tshape{protoShape(n.attr["shape"].GetShape())}
	case "Const":
		return []tshape{si.constShape(n)}
	case "IdentityN":
		var out []tshape
		for i := range n.inputs {
			out = append(out, in(i))
		}
		return out
	case "Select":
		if len(n.inputs) < 2 {
			return nil
		}
		return []tshape{si.broadcast(n.inputs[1:]...)}
	}
	if f, ok := shapeRules[n.op]; ok {
		return []tshape{f(si, n, in)}
	}
	return nil
}

// shapeRule infers the one output of an op.
type shapeRule func(si *shapeInfer, n *tfNode, in func(int) tshape) tshape

var shapeRules map[string]shapeRule

func init() {
	shapeRules = map[string]shapeRule{
		"MatMul": matMulShape, "BatchMatMul": batchMatMulShape, "BatchMatMulV2": batchMatMulShape,
		"BatchMatMulV3": batchMatMulShape, "Reshape": reshapeShape, "Transpose": transposeShape,
		"ExpandDims": expandDimsShape, "Squeeze": squeezeShape, "ConcatV2": concatShape, "Pack": packShape,
		"Shape": shapeOfShape, "Mean": reduceShape, "Sum": reduceShape, "Max": reduceShape, "Min": reduceShape,
		"Prod": reduceShape, "ArgMax": argShape, "ArgMin": argShape, "Fill": fillShape, "Tile": tileShape,
		"Conv2D": windowShape, "DepthwiseConv2dNative": windowShape, "MaxPool": windowShape, "AvgPool": windowShape,
	}
}

func (si *shapeInfer) constShape(n *tfNode) tshape {
	p := n.attr["value"].GetTensor()
	s := protoShape(p.GetTensorShape())
	if p.GetTensorShape() == nil {
		s = ranked()
	}
	switch p.GetDtype() {
	case smpb.DataType_DT_INT32, smpb.DataType_DT_INT64:
		if k, err := onnx.NumElements(s.dims); s.full() && err == nil && k <= 64 {
			if t, err := TensorFromProto(p); err == nil {
				if f, err := t.Float64s(); err == nil {
					v := make([]int64, len(f))
					for i, x := range f {
						v[i] = int64(x)
					}
					si.values[nodeOut(n)] = v
				}
			}
		}
	}
	return s
}

func nodeOut(n *tfNode) string { return n.name + ":0" }

// broadcast is numpy broadcasting of the refs' shapes.
func (si *shapeInfer) broadcast(refs ...string) tshape {
	ss := make([]tshape, len(refs))
	for i, r := range refs {
		ss[i] = si.of(r)
	}
	return broadcastShapes(ss...)
}

func broadcastShapes(ss ...tshape) tshape {
	rank := 0
	for _, s := range ss {
		if !s.ranked {
			return tshape{}
		}
		rank = max(rank, len(s.dims))
	}
	out := make([]int64, rank)
	for i := range out {
		d := int64(1)
		for _, s := range ss {
			j := i - (rank - len(s.dims))
			if j < 0 {
				continue
			}
			switch x := s.dims[j]; {
			case x < 0 && d == 1:
				d = -1
			case x >= 0 && x != 1:
				d = x
			}
		}
		out[i] = d
	}
	return ranked(out...)
}

// sigShape is a signature argument's shape as the SignatureDef states it
// (a missing shape is a scalar's, as Shape reads it).
func sigShape(ti *smpb.TensorInfo) tshape {
	dims, unknown := Shape(ti.GetTensorShape())
	if unknown {
		return tshape{}
	}
	return ranked(dims...)
}

// inputShape is the best-known shape of signature input key: the
// signature's, completed from its Placeholder's shape and _output_shapes
// attributes, then by a shape given for it (by key or ONNX name), which
// must agree with every dimension already known.
func inputShape(fg *flatGraph, key string, ti *smpb.TensorInfo, given map[string][]int64) (tshape, string, error) {
	sig := sigShape(ti)
	s := sig
	name, idx := refNode(canon(ti.GetName()))
	if n := fg.nodes[name]; n != nil {
		if n.op == "Placeholder" && idx == 0 {
			s = merge(s, protoShape(n.attr["shape"].GetShape()))
		}
		if a := n.attr["_output_shapes"].GetList().GetShape(); idx < len(a) {
			s = merge(s, protoShape(a[idx]))
		}
	}
	from := ShapeFromSignature
	if better(sig, s) {
		from = ShapeFromGraph
	}
	g, ok := given[key]
	if !ok {
		g, ok = given[Sanitize(key)]
	}
	if !ok {
		return s, from, nil
	}
	if s.ranked && len(s.dims) != len(g) {
		return tshape{}, "", fmt.Errorf("signature input %s (%s) has rank %d, shape %s, but %s is given for it",
			key, ti.GetName(), len(s.dims), dimsString(s), dimsString(ranked(g...)))
	}
	for i, d := range g {
		if d >= 0 && s.dim(i) >= 0 && d != s.dim(i) {
			return tshape{}, "", fmt.Errorf("signature input %s (%s) has shape %s; the given %s disagrees in dimension %d",
				key, ti.GetName(), dimsString(s), dimsString(ranked(g...)), i)
		}
	}
	m := merge(ranked(slices.Clone(g)...), s)
	if better(s, m) {
		from = ShapeFromGiven
	}
	return m, from, nil
}

// checkGiven refuses a given shape that names no signature input.
func checkGiven(sd *smpb.SignatureDef, given map[string][]int64) error {
	known := map[string]bool{}
	var keys []string
	for k := range sd.GetInputs() {
		known[k], known[Sanitize(k)] = true, true
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for name := range given {
		if !known[name] {
			return fmt.Errorf("a shape is given for %q, which is not an input of the signature (inputs: %s)", name, strings.Join(keys, ", "))
		}
	}
	return nil
}

// outputShape is the best-known shape of a signature output: the
// signature's, completed by what inference found for its tensor.
func outputShape(ti *smpb.TensorInfo, inferred tshape) (tshape, string) {
	sig := sigShape(ti)
	s := merge(sig, inferred)
	if better(sig, s) {
		return s, ShapeFromGraph
	}
	return s, ShapeFromSignature
}

// dimsString writes a shape as [-1,3] or "unknown rank".
func dimsString(s tshape) string {
	if !s.ranked {
		return "unknown rank"
	}
	parts := make([]string, len(s.dims))
	for i, d := range s.dims {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// record sets a name mapping's shape and where it came from.
func (nm *NameMapping) record(s tshape, from string) {
	nm.Shape, nm.UnknownRank, nm.ShapeFrom = slices.Clone(s.dims), !s.ranked, from
	if s.ranked && nm.Shape == nil {
		nm.Shape = []int64{}
	}
}
