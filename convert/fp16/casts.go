package fp16

import (
	"slices"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// removeRedundantCasts removes, in g (not its subgraphs), Casts that change
// nothing: a Cast to the type its input already has, and the second Cast of
// a float16/float32 round trip (x → Cast → Cast back to x's type), whose
// consumers then read x directly. A first Cast left without consumers goes
// too. Casts writing a graph output, or read from inside a subgraph, stay.
// outer holds the element types of outer-scope values. It returns how many
// nodes it removed.
func removeRedundantCasts(g *onnxpb.GraphProto, outer map[string]onnx.DataType) int {
	removed := 0
	for {
		types := elemTypes(g, outer)
		keep := map[string]bool{}
		for _, o := range g.GetOutput() {
			keep[o.GetName()] = true
		}
		producer := map[string]*onnxpb.NodeProto{}
		uses := map[string]int{}
		for _, n := range g.GetNode() {
			for _, o := range n.GetOutput() {
				producer[o] = n
			}
			for _, in := range n.GetInput() {
				uses[in]++
			}
			for _, in := range onnx.NodeInputs(n) {
				if !slices.Contains(n.GetInput(), in) {
					keep[in] = true // read inside a subgraph
				}
			}
		}
		drop, from, to := -1, "", ""
		for i, n := range g.GetNode() {
			if !isCast(n) || len(n.GetInput()) != 1 || len(n.GetOutput()) != 1 || keep[n.GetOutput()[0]] {
				continue
			}
			in, out, dt := n.GetInput()[0], n.GetOutput()[0], onnx.DataType(attrInt(n, "to", 0))
			switch p := producer[in]; {
			case uses[out] == 0:
				drop, from, to = i, "", "" // dead
			case types[in] == dt && dt != onnx.Undefined:
				drop, from, to = i, out, in
			case p != nil && isCast(p) && len(p.GetInput()) == 1 && roundTrip(types[p.GetInput()[0]], onnx.DataType(attrInt(p, "to", 0)), dt):
				drop, from, to = i, out, p.GetInput()[0]
			default:
				continue
			}
			break
		}
		if drop < 0 {
			return removed
		}
		g.Node = append(g.Node[:drop:drop], g.Node[drop+1:]...)
		removed++
		if from != "" {
			for _, n := range g.GetNode() {
				for i, in := range n.GetInput() {
					if in == from {
						n.Input[i] = to
					}
				}
			}
		}
		var infos []*onnxpb.ValueInfoProto
		for _, vi := range g.GetValueInfo() {
			if vi.GetName() != from || from == "" {
				infos = append(infos, vi)
			}
		}
		g.ValueInfo = infos
	}
}

func isCast(n *onnxpb.NodeProto) bool { return n.GetOpType() == "Cast" && isDefaultDomain(n) }

// roundTrip reports whether casting a value of type a to b and back to c
// gives the value of type a again (or the float32 value the rewrite started
// from, for float32 → float16 → float32, which onnxruntime's float16.py also
// removes).
func roundTrip(a, b, c onnx.DataType) bool {
	half := func(d onnx.DataType) bool { return d == onnx.Float || d == onnx.Float16 }
	return a == c && a != b && half(a) && half(b)
}

// elemTypes infers the element type of every value of g with the rules of
// types.go, falling back on the graph's declared types.
func elemTypes(g *onnxpb.GraphProto, outer map[string]onnx.DataType) map[string]onnx.DataType {
	types := make(map[string]onnx.DataType, len(outer)+len(g.GetNode()))
	for k, v := range outer {
		types[k] = v
	}
	declared := map[string]onnx.DataType{}
	for _, list := range [][]*onnxpb.ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
		for _, vi := range list {
			if tt := vi.GetType().GetTensorType(); tt != nil {
				declared[vi.GetName()] = onnx.DataType(tt.GetElemType())
			}
		}
	}
	for _, in := range g.GetInput() {
		types[in.GetName()] = declared[in.GetName()]
	}
	for _, t := range g.GetInitializer() {
		types[t.GetName()] = onnx.DataType(t.GetDataType())
	}
	for _, n := range g.GetNode() {
		in := make([]onnx.DataType, len(n.GetInput()))
		for i, name := range n.GetInput() {
			in[i] = types[name]
		}
		out, _ := inferOutputs(n, in)
		for i, o := range n.GetOutput() {
			dt := onnx.Undefined
			if i < len(out) {
				dt = out[i]
			}
			if dt == onnx.Undefined {
				dt = declared[o]
			}
			types[o] = dt
		}
	}
	return types
}

// finish adds the Casts, retypes value_info, sorts the nodes and removes
// redundant Casts.
func (s *scope) finish() error {
	var infos []*onnxpb.ValueInfoProto
	seen := map[string]bool{}
	for _, vi := range s.g.GetValueInfo() {
		v := s.vals[vi.GetName()]
		if v == nil || v.dt != onnx.Float {
			infos = append(infos, vi)
			continue
		}
		for _, f := range []form{f32, f16} {
			if name := v.names[f]; name != "" && !seen[name] && !s.isIO(name) {
				seen[name] = true
				infos = append(infos, onnx.TensorType(name, f.dtype(), onnx.ShapeOf(s.shapes[v.name])))
			}
		}
	}
	s.g.ValueInfo = infos
	s.g.Node = append(s.g.Node, s.added...)
	order, err := onnx.TopoSort(s.g)
	if err != nil {
		return err
	}
	s.g.Node = order
	s.c.report.CastsRemoved += removeRedundantCasts(s.g, s.outerTypes())
	return nil
}

func (s *scope) isIO(name string) bool {
	for _, list := range [][]*onnxpb.ValueInfoProto{s.g.GetInput(), s.g.GetOutput()} {
		for _, vi := range list {
			if vi.GetName() == name {
				return true
			}
		}
	}
	return false
}

// outerTypes are the element types of the values visible from outer scopes
// after the rewrite, for the Cast clean-up of subgraphs.
func (s *scope) outerTypes() map[string]onnx.DataType {
	out := map[string]onnx.DataType{}
	for sc := s.parent; sc != nil; sc = sc.parent {
		for _, v := range sc.vals {
			for f, name := range v.names {
				if name != "" {
					if _, ok := out[name]; !ok {
						out[name] = form(f).dtype()
					}
				}
			}
			if v.dt != onnx.Float {
				if _, ok := out[v.name]; !ok {
					out[v.name] = v.dt
				}
			}
		}
	}
	return out
}
