package normalize

import (
	"fmt"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Check refuses what ONNX Runtime would refuse when it loads m, with the
// reason, as a *CheckError: a model without a graph or an opset_import;
// a graph input, initializer or node output defined twice; a node input
// that nothing defines (not a graph input, an initializer, a node output or,
// in a subgraph, a value of an enclosing graph); a cycle; a graph output
// nothing produces, or a subgraph output that is an enclosing graph's
// value; and the type clashes that are cheap to see (an
// initializer whose element type differs from the graph input or the
// value_info of the same name). It does no shape inference and does not
// check operators' attributes: ONNX Runtime still refuses some models that
// pass.
func Check(m *onnx.Model) error {
	var path string
	if m != nil {
		path = m.Path
	}
	if reason := checkModel(m); reason != "" {
		return &CheckError{Path: path, Reason: reason}
	}
	return nil
}

func checkModel(m *onnx.Model) string {
	switch {
	case m == nil || m.Proto == nil:
		return "the model is empty"
	case m.Graph() == nil:
		return "the model has no graph"
	case len(m.Proto.GetOpsetImport()) == 0:
		return "the model has no opset_import (ONNX Runtime refuses a model that does not say which operator set it uses)"
	}
	return checkGraph(m.Graph(), nil)
}

// checkScope is the set of value names a graph can see: its own, then those of
// the graphs around it.
type checkScope struct {
	names  map[string]string // name -> what defines it, for messages
	parent *checkScope
}

func (s *checkScope) lookup(name string) (string, bool) {
	for ; s != nil; s = s.parent {
		if what, ok := s.names[name]; ok {
			return what, true
		}
	}
	return "", false
}

// checkGraph returns why g is invalid, or "". outer holds the values of
// the enclosing graphs (nil for the main graph).
func checkGraph(g *onnxpb.GraphProto, outer *checkScope) string {
	own := &checkScope{names: map[string]string{}, parent: outer}
	if r := checkDefinitions(g, own.names); r != "" {
		return r
	}
	for _, n := range g.GetNode() {
		for _, in := range n.GetInput() {
			if _, ok := own.lookup(in); in != "" && !ok {
				return fmt.Sprintf("%s reads %q, which nothing defines (no graph input, initializer or node output of that name%s)", describeNode(n), in, checkWhere(g, outer))
			}
		}
		for _, a := range n.GetAttribute() {
			for _, sg := range graphsOfAttr(a) {
				if r := checkGraph(sg, own); r != "" {
					return r
				}
			}
		}
	}
	if _, err := onnx.TopoSort(g); err != nil {
		return err.Error()
	}
	for _, o := range g.GetOutput() {
		if _, ok := own.lookup(o.GetName()); !ok {
			return fmt.Sprintf("graph output %q is produced by no node, input or initializer%s", o.GetName(), checkWhere(g, outer))
		}
		if _, mine := own.names[o.GetName()]; !mine {
			return fmt.Sprintf("subgraph %q returns %q of an enclosing graph directly (ONNX Runtime wants an Identity node between)", g.GetName(), o.GetName())
		}
	}
	return checkValueInfo(g)
}

// checkDefinitions fills defs with what g defines and returns the first
// name defined twice or a type clash between an initializer and the graph
// input of the same name.
func checkDefinitions(g *onnxpb.GraphProto, defs map[string]string) string {
	inputs := map[string]*onnxpb.ValueInfoProto{}
	for _, in := range g.GetInput() {
		name := in.GetName()
		if _, dup := inputs[name]; dup {
			return fmt.Sprintf("graph input %q is listed twice", name)
		}
		inputs[name] = in
		defs[name] = "a graph input"
	}
	inits := map[string]bool{}
	addInit := func(t *onnxpb.TensorProto, what string) string {
		name := t.GetName()
		if inits[name] {
			return fmt.Sprintf("initializer %q is defined twice", name)
		}
		inits[name] = true
		if in, ok := inputs[name]; ok {
			it := in.GetType().GetTensorType()
			if want := onnx.DataType(it.GetElemType()); it != nil && want != onnx.Undefined && want != onnx.DataType(t.GetDataType()) {
				return fmt.Sprintf("%s %q is %s but the graph input of that name is %s", what, name, onnx.DataType(t.GetDataType()), want)
			}
		}
		defs[name] = "an initializer"
		return ""
	}
	for _, t := range g.GetInitializer() {
		if r := addInit(t, "initializer"); r != "" {
			return r
		}
	}
	for _, s := range g.GetSparseInitializer() {
		if r := addInit(s.GetValues(), "sparse initializer"); r != "" {
			return r
		}
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			if what, dup := defs[o]; dup {
				return fmt.Sprintf("%s writes %q, which %s already defines", describeNode(n), o, what)
			}
			defs[o] = describeNode(n)
		}
	}
	return ""
}

// checkValueInfo refuses a value_info entry whose element type disagrees
// with the initializer of the same name.
func checkValueInfo(g *onnxpb.GraphProto) string {
	if len(g.GetValueInfo()) == 0 {
		return ""
	}
	types := make(map[string]onnx.DataType, len(g.GetInitializer()))
	for _, t := range g.GetInitializer() {
		types[t.GetName()] = onnx.DataType(t.GetDataType())
	}
	for _, vi := range g.GetValueInfo() {
		have, ok := types[vi.GetName()]
		want := onnx.DataType(vi.GetType().GetTensorType().GetElemType())
		if ok && want != onnx.Undefined && want != have {
			return fmt.Sprintf("initializer %q is %s but its value_info says %s", vi.GetName(), have, want)
		}
	}
	return ""
}

// describeNode names a node for messages: `node "Conv_3" (Conv)`, or by its
// first output when it has no name.
func describeNode(n *onnxpb.NodeProto) string {
	if n.GetName() != "" {
		return fmt.Sprintf("node %q (%s)", n.GetName(), n.GetOpType())
	}
	if len(n.GetOutput()) > 0 {
		return fmt.Sprintf("the %s node writing %q", n.GetOpType(), n.GetOutput()[0])
	}
	return fmt.Sprintf("an unnamed %s node", n.GetOpType())
}

// checkWhere says which graph a message is about when it is a subgraph.
func checkWhere(g *onnxpb.GraphProto, outer *checkScope) string {
	if outer == nil {
		return ""
	}
	return fmt.Sprintf(", in subgraph %q or the graphs around it", g.GetName())
}

// graphsOfAttr lists the subgraphs an attribute holds (If branches, Loop and
// Scan bodies).
func graphsOfAttr(a *onnxpb.AttributeProto) []*onnxpb.GraphProto {
	var gs []*onnxpb.GraphProto
	if a.GetG() != nil {
		gs = append(gs, a.GetG())
	}
	return append(gs, a.GetGraphs()...)
}
