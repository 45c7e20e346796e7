package normalize

import (
	"context"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

func init() { register(10, constantsPass) }

// constantsPass turns the main graph's Constant nodes into initializers of
// the same name, so that the later passes and kiln's stages see every
// weight in one place. Three kinds of Constant stay as they are:
//   - those inside If, Loop and Scan bodies (ONNX Runtime reads them as
//     well there; the fold pass converts those of an If branch it inlines);
//   - those whose output is a graph output (an initializer that is a graph
//     output is not something every runtime accepts, TensorRT among them);
//   - sparse_value Constants (kiln's stages read dense initializers only).
func constantsPass(_ context.Context, m *onnx.Model, _ Options) (Pass, error) {
	n, err := constantsToInitializers(m)
	if err != nil {
		return Pass{}, err
	}
	return Pass{Name: "constants", Changed: n, Summary: fmt.Sprintf("turned %d Constant nodes into initializers", n)}, nil
}

// constantsToInitializers does constantsPass's work and returns how many
// nodes it converted.
func constantsToInitializers(m *onnx.Model) (int, error) {
	g := m.Graph()
	outputs := map[string]bool{}
	for _, o := range g.GetOutput() {
		outputs[o.GetName()] = true
	}
	kept := g.Node[:0]
	converted := 0
	for _, n := range g.GetNode() {
		if !isDefaultOp(n, "Constant") || len(n.GetOutput()) != 1 || outputs[n.GetOutput()[0]] {
			kept = append(kept, n)
			continue
		}
		t, err := constantValue(n)
		if err != nil {
			return converted, err
		}
		if t == nil {
			kept = append(kept, n)
			continue
		}
		appendInitializer(m, t)
		converted++
	}
	clear(g.Node[len(kept):])
	g.Node = kept
	return converted, nil
}

// constantValue returns the tensor a Constant node produces, named as its
// output; nil (and no error) for a sparse_value Constant, which stays.
func constantValue(n *onnxpb.NodeProto) (*onnxpb.TensorProto, error) {
	name := n.GetOutput()[0]
	if len(n.GetAttribute()) != 1 {
		return nil, fmt.Errorf("%s has %d attributes, want exactly one value attribute", describeNode(n), len(n.GetAttribute()))
	}
	a := n.GetAttribute()[0]
	var (
		t   *onnx.Tensor
		err error
	)
	switch a.GetName() {
	case "value":
		if a.GetT() == nil {
			return nil, fmt.Errorf("%s: its value attribute holds no tensor", describeNode(n))
		}
		p := a.GetT()
		p.Name = &name
		return p, nil
	case "sparse_value":
		return nil, nil
	case "value_float":
		t, err = onnx.NewTensor(name, nil, []float32{a.GetF()})
	case "value_floats":
		t, err = onnx.NewTensor(name, []int64{int64(len(a.GetFloats()))}, append([]float32{}, a.GetFloats()...))
	case "value_int":
		t, err = onnx.NewTensor(name, nil, []int64{a.GetI()})
	case "value_ints":
		t, err = onnx.NewTensor(name, []int64{int64(len(a.GetInts()))}, append([]int64{}, a.GetInts()...))
	case "value_string":
		t, err = onnx.NewTensor(name, nil, []string{string(a.GetS())})
	case "value_strings":
		s := make([]string, len(a.GetStrings()))
		for i, b := range a.GetStrings() {
			s[i] = string(b)
		}
		t, err = onnx.NewTensor(name, []int64{int64(len(s))}, s)
	default:
		return nil, fmt.Errorf("%s has unknown attribute %q", describeNode(n), a.GetName())
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", describeNode(n), err)
	}
	return onnx.Encode(t, onnx.Raw)
}

// appendInitializer adds t to the main graph. Models of IR version 3 and
// older must also list every initializer as a graph input.
func appendInitializer(m *onnx.Model, t *onnxpb.TensorProto) {
	g := m.Graph()
	g.Initializer = append(g.Initializer, t)
	if m.Proto.GetIrVersion() < 4 {
		g.Input = append(g.Input, onnx.TensorType(t.GetName(), onnx.DataType(t.GetDataType()), fixedShape(t.GetDims())))
	}
}

// fixedShape is the onnx.Shape of fixed dimensions.
func fixedShape(dims []int64) onnx.Shape {
	s := onnx.Shape{Ranked: true, Dims: make([]onnx.Dim, len(dims))}
	for i, d := range dims {
		s.Dims[i] = onnx.Dim{Value: d, Known: true}
	}
	return s
}

// isDefaultOp reports whether n is op of the default ONNX domain.
func isDefaultOp(n *onnxpb.NodeProto, op string) bool {
	return n.GetOpType() == op && isDefaultDomain(n.GetDomain())
}

// isDefaultDomain reports whether domain names the default operator set.
func isDefaultDomain(domain string) bool { return domain == "" || domain == "ai.onnx" }

// removeUnusedInitializers drops the main graph's initializers that no
// node (nor subgraph) reads and no graph output names, and returns how
// many. An initializer that is also a graph input stays from IR version 4
// on (it is part of the model's interface); up to IR 3, where every
// initializer is listed as an input, the input entry goes with it.
func removeUnusedInitializers(m *onnx.Model) int {
	g := m.Graph()
	used := map[string]bool{}
	for _, n := range g.GetNode() {
		for _, in := range onnx.NodeInputs(n) {
			used[in] = true
		}
	}
	for _, o := range g.GetOutput() {
		used[o.GetName()] = true
	}
	consts := constantInitializers(m)
	gone := map[string]bool{}
	kept := g.Initializer[:0]
	for _, t := range g.GetInitializer() {
		if name := t.GetName(); !used[name] && consts[name] != nil {
			gone[name] = true
			continue
		}
		kept = append(kept, t)
	}
	clear(g.Initializer[len(kept):])
	g.Initializer = kept
	if len(gone) > 0 && m.Proto.GetIrVersion() < 4 {
		g.Input = slices.DeleteFunc(g.Input, func(in *onnxpb.ValueInfoProto) bool { return gone[in.GetName()] })
	}
	return len(gone)
}

// pruneValueInfo drops value_info entries of values the graph no longer
// has.
func pruneValueInfo(g *onnxpb.GraphProto) {
	have := map[string]bool{}
	for _, in := range g.GetInput() {
		have[in.GetName()] = true
	}
	for _, t := range g.GetInitializer() {
		have[t.GetName()] = true
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			have[o] = true
		}
	}
	g.ValueInfo = slices.DeleteFunc(g.ValueInfo, func(vi *onnxpb.ValueInfoProto) bool { return !have[vi.GetName()] })
}

// elements is the number of elements of a shape, saturating at 1<<40 so
// that absurd shapes compare as huge rather than overflow.
func elements(dims []int64) int {
	n := int64(1)
	for _, d := range dims {
		if d < 0 {
			return 1 << 40
		}
		if d != 0 && n > (1<<40)/d {
			return 1 << 40
		}
		n *= d
	}
	return int(n)
}

// int64sOf decodes a small int64 initializer (a shape or repeats input).
func int64sOf(t *onnxpb.TensorProto) ([]int64, bool) {
	if t == nil || onnx.DataType(t.GetDataType()) != onnx.Int64 {
		return nil, false
	}
	v, err := onnx.Decode(t)
	if err != nil {
		return nil, false
	}
	d, ok := v.Data.([]int64)
	return d, ok
}

// attrNamed returns n's attribute called name, or nil.
func attrNamed(n *onnxpb.NodeProto, name string) *onnxpb.AttributeProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a
		}
	}
	return nil
}

// fixedInputShapes maps the graph inputs whose every dimension is fixed
// (ONNX Runtime refuses other shapes for them) to their dimensions.
func fixedInputShapes(g *onnxpb.GraphProto, consts map[string]*onnxpb.TensorProto) map[string][]int64 {
	out := map[string][]int64{}
	for _, in := range g.GetInput() {
		v := onnx.InfoOf(in)
		if consts[v.Name] != nil || v.Kind != "tensor" || !v.Shape.Ranked {
			continue
		}
		dims := v.Shape.Static()
		if !slices.Contains(dims, -1) {
			out[v.Name] = dims
		}
	}
	return out
}

// staticShapeValue returns the value of a Shape or Size node that reads an
// input of fixed shape, or nil.
func staticShapeValue(n *onnxpb.NodeProto, fixed map[string][]int64) *onnxpb.TensorProto {
	if !isDefaultDomain(n.GetDomain()) || len(n.GetInput()) != 1 || len(n.GetOutput()) != 1 || n.GetOutput()[0] == "" {
		return nil
	}
	dims, ok := fixed[n.GetInput()[0]]
	if !ok {
		return nil
	}
	var t *onnx.Tensor
	switch n.GetOpType() {
	case "Shape":
		r := int64(len(dims))
		start, end := int64(0), r
		if a := attrNamed(n, "start"); a != nil {
			start = a.GetI()
		}
		if a := attrNamed(n, "end"); a != nil {
			end = a.GetI()
		}
		clamp := func(v int64) int64 {
			if v < 0 {
				v += r
			}
			return min(max(v, 0), r)
		}
		start, end = clamp(start), clamp(end)
		v := []int64{}
		if start < end {
			v = slices.Clone(dims[start:end])
		}
		t = &onnx.Tensor{Type: onnx.Int64, Dims: []int64{int64(len(v))}, Data: v}
	case "Size":
		t = &onnx.Tensor{Type: onnx.Int64, Dims: []int64{}, Data: []int64{int64(elements(dims))}}
	default:
		return nil
	}
	t.Name = n.GetOutput()[0]
	p, err := onnx.Encode(t, onnx.Raw)
	if err != nil {
		return nil
	}
	return p
}

// ptrInt32 returns a pointer to v, for proto2 int32 fields.
func ptrInt32(v int32) *int32 { return &v }
