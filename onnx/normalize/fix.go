package normalize

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

func init() { register(20, fixPass) }

// fixPass replaces the graph inputs named in Options.Fix by initializers
// holding the given values. The If nodes that the fixed values decide are
// resolved by the fold pass that follows: it folds the condition into a
// constant and then inlines the branch taken (resolveIfs).
func fixPass(_ context.Context, m *onnx.Model, o Options) (Pass, error) {
	if len(o.Fix) == 0 {
		return Pass{Name: "fix"}, nil
	}
	names := make([]string, 0, len(o.Fix))
	for name := range o.Fix {
		names = append(names, name)
	}
	slices.Sort(names)
	said := make([]string, len(names))
	for i, name := range names {
		if err := fixInput(m, name, o.Fix[name]); err != nil {
			return Pass{}, err
		}
		said[i] = fmt.Sprintf("%s to %s", name, describeValue(o.Fix[name]))
	}
	word := "input"
	if len(names) > 1 {
		word = "inputs"
	}
	return Pass{Name: "fix", Changed: len(names), Summary: fmt.Sprintf("fixed %s %s", word, strings.Join(said, ", "))}, nil
}

// fixInput turns graph input name into an initializer holding t, after
// checking t's element type and shape against the input's declaration.
func fixInput(m *onnx.Model, name string, t *onnx.Tensor) error {
	g := m.Graph()
	at := -1
	for i, in := range g.GetInput() {
		if in.GetName() == name && m.Initializer(name) == nil {
			at = i
		}
	}
	if at < 0 {
		var have []string
		for _, in := range m.Inputs() {
			have = append(have, in.Name)
		}
		return fmt.Errorf("fixing input %q: the model has no such input (its inputs: %s)", name, strings.Join(have, ", "))
	}
	if t == nil {
		return fmt.Errorf("fixing input %q: no value given", name)
	}
	in := onnx.InfoOf(g.GetInput()[at])
	if in.Kind != "tensor" {
		return fmt.Errorf("fixing input %q: it is a %s, only tensor inputs can be fixed", name, in.Kind)
	}
	if in.Type != onnx.Undefined && t.Type != in.Type {
		return fmt.Errorf("fixing input %q: the value is %s, the input is %s", name, t.Type, in.Type)
	}
	if !shapeAccepts(in.Shape, t.Dims) {
		return fmt.Errorf("fixing input %q: the value has shape %v, the input is declared %s", name, t.Dims, in.Shape)
	}
	named := *t
	named.Name = name
	p, err := onnx.Encode(&named, onnx.Raw)
	if err != nil {
		return fmt.Errorf("fixing input %q: %w", name, err)
	}
	g.Input = slices.Delete(g.Input, at, at+1)
	appendInitializer(m, p)
	return nil
}

// shapeAccepts reports whether a value of dims fits the declared shape.
func shapeAccepts(s onnx.Shape, dims []int64) bool {
	if !s.Ranked {
		return true
	}
	if len(s.Dims) != len(dims) {
		return false
	}
	for i, d := range s.Dims {
		if d.Known && d.Value != dims[i] {
			return false
		}
	}
	return true
}

// describeValue prints a small tensor's values ("16000", "[1 2 3]") and a
// large one's type and shape.
func describeValue(t *onnx.Tensor) string {
	if t == nil {
		return "nothing"
	}
	if t.Len() > 8 {
		return fmt.Sprintf("a %s%v tensor", t.Type, t.Dims)
	}
	s := fmt.Sprint(t.Data)
	if len(t.Dims) == 0 {
		s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	}
	return s
}

// resolveIfs replaces every If node of the main graph whose condition is a
// constant (an initializer that is not also a graph input) by the nodes of
// the branch it takes, and returns how many it replaced.
func resolveIfs(m *onnx.Model) (int, error) {
	consts := constantInitializers(m)
	resolved := 0
	for i := 0; i < len(m.Graph().GetNode()); i++ {
		n := m.Graph().GetNode()[i]
		if !isDefaultOp(n, "If") || len(n.GetInput()) != 1 || consts[n.GetInput()[0]] == nil {
			continue
		}
		cond, err := onnx.Decode(consts[n.GetInput()[0]])
		if err != nil {
			return resolved, fmt.Errorf("reading the condition of %s: %w", describeNode(n), err)
		}
		b, ok := cond.Data.([]bool)
		if !ok || len(b) != 1 {
			return resolved, fmt.Errorf("the condition %q of %s is a %s%v tensor, want one bool", n.GetInput()[0], describeNode(n), cond.Type, cond.Dims)
		}
		branch := "else_branch"
		if b[0] {
			branch = "then_branch"
		}
		nodes, err := inlineBranch(m, n, branch)
		if err != nil {
			return resolved, err
		}
		g := m.Graph()
		g.Node = slices.Insert(slices.Delete(g.Node, i, i+1), i, nodes...)
		i += len(nodes) - 1
		resolved++
	}
	return resolved, nil
}

// constantInitializers maps the main graph's initializers that are
// constants to their tensors: all of them up to IR version 3, where every
// initializer is also listed as an input, and from IR 4 those that are not
// graph inputs (an initializer that is also an input is a default value a
// caller may override).
func constantInitializers(m *onnx.Model) map[string]*onnxpb.TensorProto {
	g := m.Graph()
	inputs := map[string]bool{}
	if m.Proto.GetIrVersion() >= 4 {
		for _, in := range g.GetInput() {
			inputs[in.GetName()] = true
		}
	}
	out := make(map[string]*onnxpb.TensorProto, len(g.GetInitializer()))
	for _, t := range g.GetInitializer() {
		if !inputs[t.GetName()] {
			out[t.GetName()] = t
		}
	}
	return out
}

// inlineBranch returns the nodes of If node n's branch rewritten for the
// main graph: every value the branch defines gets a name free in the rest
// of the model (its own when free), the branch's outputs are renamed to
// n's outputs (through Identity nodes where a branch output is not a node
// output of its own), and the branch's initializers and value_info move to
// the main graph.
func inlineBranch(m *onnx.Model, n *onnxpb.NodeProto, branch string) ([]*onnxpb.NodeProto, error) {
	var body *onnxpb.GraphProto
	for _, a := range n.GetAttribute() {
		if a.GetName() == branch {
			body = a.GetG()
		}
	}
	if body == nil {
		return nil, fmt.Errorf("%s has no %s", describeNode(n), branch)
	}
	if len(body.GetOutput()) != len(n.GetOutput()) {
		return nil, fmt.Errorf("the %s of %s has %d outputs, the node %d", branch, describeNode(n), len(body.GetOutput()), len(n.GetOutput()))
	}
	names := namesOutside(m.Graph(), n)
	rename := map[string]string{}
	producers := map[string]bool{}
	for _, bn := range body.GetNode() {
		for _, o := range bn.GetOutput() {
			producers[o] = true
		}
	}
	// Branch outputs written by a branch node, each once, take n's output
	// names directly; the others are copied by an Identity node.
	count := map[string]int{}
	for _, o := range body.GetOutput() {
		count[o.GetName()]++
	}
	var copies []*onnxpb.NodeProto
	for i, o := range body.GetOutput() {
		bo, out := o.GetName(), n.GetOutput()[i]
		if out == "" {
			continue
		}
		if producers[bo] && count[bo] == 1 {
			rename[bo] = out
			continue
		}
		copies = append(copies, &onnxpb.NodeProto{OpType: strRef("Identity"), Name: strRef(names.Fresh(out + "_copy")), Input: []string{bo}, Output: []string{out}})
	}
	define := func(name string) {
		if _, done := rename[name]; !done && name != "" {
			rename[name] = names.Fresh(name)
		}
	}
	for _, t := range body.GetInitializer() {
		define(t.GetName())
	}
	for _, s := range body.GetSparseInitializer() {
		define(s.GetValues().GetName())
	}
	for _, bn := range body.GetNode() {
		for _, o := range bn.GetOutput() {
			define(o)
		}
	}
	nodes := append(body.GetNode(), copies...)
	for _, bn := range nodes {
		renameNode(bn, rename)
	}
	moveBranchValues(m, body, rename)
	return nodes, nil
}

// moveBranchValues moves an inlined branch's initializers and value_info
// into the main graph under their new names.
func moveBranchValues(m *onnx.Model, body *onnxpb.GraphProto, rename map[string]string) {
	g := m.Graph()
	for _, t := range body.GetInitializer() {
		t.Name = strRef(rename[t.GetName()])
		appendInitializer(m, t)
	}
	for _, s := range body.GetSparseInitializer() {
		s.GetValues().Name = strRef(rename[s.GetValues().GetName()])
		g.SparseInitializer = append(g.SparseInitializer, s)
	}
	for _, vi := range body.GetValueInfo() {
		if to, ok := rename[vi.GetName()]; ok {
			vi.Name = strRef(to)
			g.ValueInfo = append(g.ValueInfo, vi)
		}
	}
}

// namesOutside collects the names the model uses outside If node n's
// branches, which are about to go away.
func namesOutside(g *onnxpb.GraphProto, n *onnxpb.NodeProto) *onnx.Names {
	attrs := n.Attribute
	n.Attribute = nil
	names := onnx.NewNames(g, 1)
	n.Attribute = attrs
	return names
}

// renameNode applies rename to n's inputs and outputs and to the values
// its subgraphs read from outside (a name a subgraph defines itself hides
// the outer one).
func renameNode(n *onnxpb.NodeProto, rename map[string]string) {
	for i, in := range n.GetInput() {
		if to, ok := rename[in]; ok {
			n.Input[i] = to
		}
	}
	for i, o := range n.GetOutput() {
		if to, ok := rename[o]; ok {
			n.Output[i] = to
		}
	}
	for _, a := range n.GetAttribute() {
		for _, sg := range graphsOfAttr(a) {
			renameFree(sg, rename)
		}
	}
}

// renameFree renames the outer values subgraph g reads.
func renameFree(g *onnxpb.GraphProto, rename map[string]string) {
	inner, copied := rename, false
	hide := func(name string) {
		if _, ok := inner[name]; ok {
			if !copied {
				inner, copied = maps.Clone(rename), true
			}
			delete(inner, name)
		}
	}
	for _, in := range g.GetInput() {
		hide(in.GetName())
	}
	for _, t := range g.GetInitializer() {
		hide(t.GetName())
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			hide(o)
		}
	}
	for _, n := range g.GetNode() {
		renameNode(n, inner)
	}
	for _, o := range g.GetOutput() {
		if to, ok := inner[o.GetName()]; ok {
			o.Name = strRef(to)
		}
	}
}

// strRef returns a pointer to a copy of s, for proto2 string fields.
func strRef(s string) *string { return &s }
