package onnx

import (
	"fmt"
	"sort"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Graph returns the main graph (never nil for a model returned by Load or Parse).
func (m *Model) Graph() *onnxpb.GraphProto { return m.Proto.GetGraph() }

// Inputs returns the graph inputs that are not initializers: the values a
// caller must feed. (Before IR 4 every initializer was also listed as an input.)
func (m *Model) Inputs() []ValueInfo { return GraphInputs(m.Graph()) }

// Outputs returns the graph outputs.
func (m *Model) Outputs() []ValueInfo {
	var out []ValueInfo
	for _, o := range m.Graph().GetOutput() {
		out = append(out, InfoOf(o))
	}
	return out
}

// GraphInputs returns g's inputs that are not initializers.
func GraphInputs(g *onnxpb.GraphProto) []ValueInfo {
	inits := make(map[string]bool, len(g.GetInitializer()))
	for _, t := range g.GetInitializer() {
		inits[t.GetName()] = true
	}
	for _, s := range g.GetSparseInitializer() {
		inits[s.GetValues().GetName()] = true
	}
	var out []ValueInfo
	for _, in := range g.GetInput() {
		if !inits[in.GetName()] {
			out = append(out, InfoOf(in))
		}
	}
	return out
}

// Initializer returns the main graph's initializer with the given name, or nil.
func (m *Model) Initializer(name string) *onnxpb.TensorProto {
	for _, t := range m.Graph().GetInitializer() {
		if t.GetName() == name {
			return t
		}
	}
	return nil
}

// Opsets returns the imported operator set version per domain; the default
// domain is keyed "" (it is also spelled "ai.onnx" in some models, which is
// folded into "").
func (m *Model) Opsets() map[string]int64 {
	out := map[string]int64{}
	for _, o := range m.Proto.GetOpsetImport() {
		d := o.GetDomain()
		if d == "ai.onnx" {
			d = ""
		}
		out[d] = o.GetVersion()
	}
	return out
}

// Opset returns the default-domain opset version (0 when it is not imported).
func (m *Model) Opset() int64 { return m.Opsets()[""] }

// SetOpset sets the version imported for a domain, adding the import if missing.
func (m *Model) SetOpset(domain string, version int64) {
	for _, o := range m.Proto.OpsetImport {
		d := o.GetDomain()
		if d == "ai.onnx" {
			d = ""
		}
		if d == domain {
			o.Version = &version
			return
		}
	}
	m.Proto.OpsetImport = append(m.Proto.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: &domain, Version: &version})
}

// Index maps value names to the nodes that produce and consume them in one
// graph. It is a snapshot: rebuild it after editing the graph.
type Index struct {
	Producer     map[string]*onnxpb.NodeProto
	Consumers    map[string][]*onnxpb.NodeProto
	Initializers map[string]*onnxpb.TensorProto
	Inputs       map[string]*onnxpb.ValueInfoProto
	Outputs      map[string]bool
}

// NewIndex indexes g. Subgraph nodes count as consumers of the outer values
// they use, under the node that owns the subgraph.
func NewIndex(g *onnxpb.GraphProto) *Index {
	ix := &Index{
		Producer:     map[string]*onnxpb.NodeProto{},
		Consumers:    map[string][]*onnxpb.NodeProto{},
		Initializers: map[string]*onnxpb.TensorProto{},
		Inputs:       map[string]*onnxpb.ValueInfoProto{},
		Outputs:      map[string]bool{},
	}
	for _, t := range g.GetInitializer() {
		ix.Initializers[t.GetName()] = t
	}
	for _, in := range g.GetInput() {
		ix.Inputs[in.GetName()] = in
	}
	for _, o := range g.GetOutput() {
		ix.Outputs[o.GetName()] = true
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			if o != "" {
				ix.Producer[o] = n
			}
		}
		for _, in := range NodeInputs(n) {
			ix.Consumers[in] = append(ix.Consumers[in], n)
		}
	}
	return ix
}

// NodeInputs returns the distinct non-empty values node n reads, including
// outer-scope values used inside its subgraphs (If, Loop, Scan bodies).
func NodeInputs(n *onnxpb.NodeProto) []string {
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, in := range n.GetInput() {
		add(in)
	}
	for _, a := range n.GetAttribute() {
		for _, g := range subgraphs(a) {
			for _, v := range freeValues(g) {
				add(v)
			}
		}
	}
	return out
}

func subgraphs(a *onnxpb.AttributeProto) []*onnxpb.GraphProto {
	var gs []*onnxpb.GraphProto
	if a.G != nil {
		gs = append(gs, a.G)
	}
	return append(gs, a.GetGraphs()...)
}

// freeValues lists the names a graph reads that it does not define itself.
func freeValues(g *onnxpb.GraphProto) []string {
	defined := map[string]bool{}
	for _, in := range g.GetInput() {
		defined[in.GetName()] = true
	}
	for _, t := range g.GetInitializer() {
		defined[t.GetName()] = true
	}
	for _, s := range g.GetSparseInitializer() {
		defined[s.GetValues().GetName()] = true
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			defined[o] = true
		}
	}
	var free []string
	seen := map[string]bool{}
	for _, n := range g.GetNode() {
		for _, in := range NodeInputs(n) {
			if !defined[in] && !seen[in] {
				seen[in] = true
				free = append(free, in)
			}
		}
	}
	for _, o := range g.GetOutput() {
		if !defined[o.GetName()] && !seen[o.GetName()] {
			seen[o.GetName()] = true
			free = append(free, o.GetName())
		}
	}
	return free
}

// TopoSort returns g's nodes in an order where every node comes after the
// producers of its inputs. Nodes already in order keep their relative order
// (Kahn's algorithm seeded in file order). Values not produced in g (graph
// inputs, initializers, outer-scope values) count as available. A cycle is an error.
func TopoSort(g *onnxpb.GraphProto) ([]*onnxpb.NodeProto, error) {
	nodes := g.GetNode()
	producer := map[string]int{}
	for i, n := range nodes {
		for _, o := range n.GetOutput() {
			if o != "" {
				producer[o] = i
			}
		}
	}
	indeg := make([]int, len(nodes))
	users := make([][]int, len(nodes))
	for i, n := range nodes {
		for _, in := range NodeInputs(n) {
			if p, ok := producer[in]; ok {
				if p == i {
					return nil, fmt.Errorf("node %q (%s) consumes its own output %q", n.GetName(), n.GetOpType(), in)
				}
				indeg[i]++
				users[p] = append(users[p], i)
			}
		}
	}
	// A min-heap on the original index keeps file order when it is already valid.
	ready := &intHeap{}
	for i := range nodes {
		if indeg[i] == 0 {
			ready.push(i)
		}
	}
	out := make([]*onnxpb.NodeProto, 0, len(nodes))
	for ready.len() > 0 {
		i := ready.pop()
		out = append(out, nodes[i])
		for _, u := range users[i] {
			indeg[u]--
			if indeg[u] == 0 {
				ready.push(u)
			}
		}
	}
	if len(out) != len(nodes) {
		var stuck []string
		for i, d := range indeg {
			if d > 0 {
				stuck = append(stuck, fmt.Sprintf("%q (%s)", nodes[i].GetName(), nodes[i].GetOpType()))
				if len(stuck) == 5 {
					break
				}
			}
		}
		return nil, fmt.Errorf("graph %q has a cycle through nodes %v", g.GetName(), stuck)
	}
	return out, nil
}

type intHeap struct{ a []int }

func (h *intHeap) len() int { return len(h.a) }
func (h *intHeap) push(v int) {
	h.a = append(h.a, v)
	for i := len(h.a) - 1; i > 0; {
		p := (i - 1) / 2
		if h.a[p] <= h.a[i] {
			break
		}
		h.a[p], h.a[i] = h.a[i], h.a[p]
		i = p
	}
}
func (h *intHeap) pop() int {
	top := h.a[0]
	last := len(h.a) - 1
	h.a[0] = h.a[last]
	h.a = h.a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h.a) && h.a[l] < h.a[m] {
			m = l
		}
		if r < len(h.a) && h.a[r] < h.a[m] {
			m = r
		}
		if m == i {
			break
		}
		h.a[i], h.a[m] = h.a[m], h.a[i]
		i = m
	}
	return top
}

// OpCounts returns how many nodes of each op type the main graph has
// (subgraph nodes included), keyed "domain::Op" for non-default domains.
func (m *Model) OpCounts() map[string]int {
	out := map[string]int{}
	var walk func(g *onnxpb.GraphProto)
	walk = func(g *onnxpb.GraphProto) {
		for _, n := range g.GetNode() {
			key := n.GetOpType()
			if d := n.GetDomain(); d != "" && d != "ai.onnx" {
				key = d + "::" + key
			}
			out[key]++
			for _, a := range n.GetAttribute() {
				for _, sg := range subgraphs(a) {
					walk(sg)
				}
			}
		}
	}
	walk(m.Graph())
	return out
}

// ParamStats summarizes the weights (initializers) by element type.
type ParamStats struct {
	Type  DataType
	Count int64 // elements
	Bytes int64 // bytes of raw storage
}

// Params returns parameter counts per element type, sorted by type.
func (m *Model) Params() []ParamStats {
	by := map[DataType]*ParamStats{}
	m.Tensors(func(t *onnxpb.TensorProto) error {
		dt := DataType(t.GetDataType())
		n := int64(1)
		for _, d := range t.GetDims() {
			n *= d
		}
		s := by[dt]
		if s == nil {
			s = &ParamStats{Type: dt}
			by[dt] = s
		}
		s.Count += n
		switch {
		case dt == String:
			for _, b := range t.GetStringData() {
				s.Bytes += int64(len(b))
			}
		case is4bit(dt):
			s.Bytes += (n + 1) / 2
		default:
			s.Bytes += n * int64(dt.Size())
		}
		return nil
	})
	out := make([]ParamStats, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out
}

// ConstantType is the element type a Constant node produces, from the one
// value attribute it has (value, sparse_value, value_float(s),
// value_int(s), value_string(s)); Undefined when none says.
func ConstantType(n *onnxpb.NodeProto) DataType {
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "value":
			if a.GetT() != nil {
				return DataType(a.GetT().GetDataType())
			}
		case "sparse_value":
			if a.GetSparseTensor() != nil {
				return DataType(a.GetSparseTensor().GetValues().GetDataType())
			}
		case "value_float", "value_floats":
			return Float
		case "value_int", "value_ints":
			return Int64
		case "value_string", "value_strings":
			return String
		}
	}
	return Undefined
}
