package normalize

import (
	"context"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

func init() { register(30, foldPass) }

// Limits of folding. A folded value is an initializer the model then
// carries, so folding must not make the model much bigger than it was:
//   - ConstantOfShape, Expand and Tile, whose outputs can be far larger than
//     their inputs, are folded only when their output would take at most
//     growLimit bytes or at most growFactor times their inputs' bytes;
//   - no folded value may take more than maxFolded bytes (the nodes that
//     would produce one stay, evaluated at run time as before).
const (
	growLimit  = 1 << 20
	growFactor = 8
	maxFolded  = 64 << 20
)

// unfoldable lists default-domain operators never folded: random or
// non-deterministic ones (folding would freeze one draw), control flow
// (If is resolved by resolveIfs instead) and operators whose values are
// not tensors and so cannot become initializers.
var unfoldable = map[string]bool{
	"RandomNormal": true, "RandomNormalLike": true, "RandomUniform": true, "RandomUniformLike": true,
	"Multinomial": true, "Bernoulli": true, "Dropout": true,
	"If": true, "Loop": true, "Scan": true,
	"SequenceConstruct": true, "SequenceEmpty": true, "SequenceInsert": true, "SequenceErase": true,
	"SequenceAt": true, "SequenceLength": true, "SplitToSequence": true, "ConcatFromSequence": true,
	"SequenceMap": true, "Optional": true, "OptionalGetElement": true, "OptionalHasElement": true,
}

// foldPass evaluates, with ONNX Runtime, every main-graph node whose inputs
// are all constants (initializers that are not graph inputs, and what
// other such nodes compute) and replaces those nodes by initializers of the
// values the rest of the graph reads. Shape and Size of a graph input whose
// shape is fully fixed are constants too. Then If nodes whose condition has
// become a constant are replaced by the branch they take, and it starts
// again, until nothing changes. Last, initializers no node reads any more
// are removed. Nodes of other domains than the default one are not folded
// (ONNX Runtime may not know them, and kiln cannot tell whether they are
// deterministic), nor are nodes that write a graph output.
func foldPass(ctx context.Context, m *onnx.Model, _ Options) (Pass, error) {
	var folded, made, ifs int
	for {
		c, err := constantsToInitializers(m) // from inlined If branches
		if err != nil {
			return Pass{}, err
		}
		f, k, err := foldRound(ctx, m)
		if err != nil {
			return Pass{}, err
		}
		r, err := resolveIfs(m)
		if err != nil {
			return Pass{}, err
		}
		folded, made, ifs = folded+c+f, made+c+k, ifs+r
		if c+f+r == 0 {
			break
		}
	}
	removed := removeUnusedInitializers(m)
	pruneValueInfo(m.Graph())
	s := fmt.Sprintf("folded %s into %s", count(folded, "node"), count(made, "initializer"))
	if ifs > 0 {
		s += fmt.Sprintf("; resolved %s", count(ifs, "If node"))
	}
	if removed > 0 {
		s += fmt.Sprintf("; removed %s", count(removed, "unused initializer"))
	}
	return Pass{Name: "fold", Changed: folded + ifs + removed, Summary: s}, nil
}

// count says "1 node", "2 nodes".
func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// foldPlan is one round of folding: the nodes to evaluate, in topological
// order, and the Shape and Size values computed without evaluating.
type foldPlan struct {
	nodes  []*onnxpb.NodeProto
	direct map[*onnxpb.NodeProto]*onnxpb.TensorProto
}

// foldRound folds what can be folded now and returns how many nodes it
// removed and how many initializers it added.
func foldRound(ctx context.Context, m *onnx.Model) (int, int, error) {
	exclude := map[*onnxpb.NodeProto]bool{}
	for range 4 {
		p, err := planFold(m, exclude)
		if err != nil || len(p.nodes)+len(p.direct) == 0 {
			return 0, 0, err
		}
		values, err := evaluate(ctx, m, p)
		if err != nil {
			return 0, 0, err
		}
		keep := keptValues(m.Graph(), p)
		big := false
		for _, name := range keep {
			if t := values[name]; t != nil && tensorSize(t.Type, t.Len()) > maxFolded {
				exclude[producerIn(p.nodes, name)] = true
				big = true
			}
		}
		if !big {
			return applyFold(m, p, keep, values)
		}
	}
	return 0, 0, nil
}

// planFold picks the nodes whose inputs are all constants.
func planFold(m *onnx.Model, exclude map[*onnxpb.NodeProto]bool) (*foldPlan, error) {
	g := m.Graph()
	consts := constantInitializers(m)
	known := make(map[string]bool, len(consts))
	for name := range consts {
		known[name] = true
	}
	fixed := fixedInputShapes(g, consts)
	outputs := map[string]bool{}
	for _, o := range g.GetOutput() {
		outputs[o.GetName()] = true
	}
	order, err := onnx.TopoSort(g)
	if err != nil {
		return nil, fmt.Errorf("folding: %w", err)
	}
	p := &foldPlan{direct: map[*onnxpb.NodeProto]*onnxpb.TensorProto{}}
	for _, n := range order {
		if exclude[n] || writesAny(n, outputs) {
			continue
		}
		if t := staticShapeValue(n, fixed); t != nil {
			p.direct[n] = t
			known[n.GetOutput()[0]] = true
			continue
		}
		if !isDefaultDomain(n.GetDomain()) || unfoldable[n.GetOpType()] || !allKnown(onnx.NodeInputs(n), known) || grows(n, consts) {
			continue
		}
		p.nodes = append(p.nodes, n)
		for _, o := range n.GetOutput() {
			if o != "" {
				known[o] = true
			}
		}
	}
	return p, nil
}

// keptValues lists, in graph order, the values computed by p's nodes that
// nodes outside p read (in their inputs or subgraphs).
func keptValues(g *onnxpb.GraphProto, p *foldPlan) []string {
	folded := map[*onnxpb.NodeProto]bool{}
	made := map[string]bool{}
	for _, n := range p.nodes {
		folded[n] = true
		for _, o := range n.GetOutput() {
			made[o] = o != ""
		}
	}
	seen := map[string]bool{}
	var keep []string
	for _, n := range g.GetNode() {
		if folded[n] || p.direct[n] != nil {
			continue
		}
		for _, in := range onnx.NodeInputs(n) {
			if made[in] && !seen[in] {
				seen[in] = true
				keep = append(keep, in)
			}
		}
	}
	return keep
}

// applyFold replaces p's nodes by initializers of the kept values.
func applyFold(m *onnx.Model, p *foldPlan, keep []string, values map[string]*onnx.Tensor) (int, int, error) {
	g := m.Graph()
	gone := make(map[*onnxpb.NodeProto]bool, len(p.nodes))
	for _, n := range p.nodes {
		gone[n] = true
	}
	for _, name := range keep {
		t := values[name]
		if t == nil {
			return 0, 0, fmt.Errorf("folding %s: ONNX Runtime returned no value", name)
		}
		t.Name = name
		pt, err := onnx.Encode(t, onnx.Raw)
		if err != nil {
			return 0, 0, fmt.Errorf("folding %s: %w", name, err)
		}
		appendInitializer(m, pt)
	}
	made := len(keep)
	for _, n := range g.GetNode() {
		if t := p.direct[n]; t != nil {
			gone[n] = true
			appendInitializer(m, t)
			made++
		}
	}
	kept := g.Node[:0]
	for _, n := range g.GetNode() {
		if !gone[n] {
			kept = append(kept, n)
		}
	}
	clear(g.Node[len(kept):])
	g.Node = kept
	return len(gone), made, nil
}

// evaluate runs p's nodes (in topological order, reading only constants
// and one another) in ONNX Runtime and returns the values the rest of the
// graph reads. When the nodes do not run together (an operator or a type
// ONNX Runtime lacks), each node runs alone, and the nodes that fail, with
// those that depend on them, are dropped from p.
func evaluate(ctx context.Context, m *onnx.Model, p *foldPlan) (map[string]*onnx.Tensor, error) {
	keep := keptValues(m.Graph(), p)
	if len(keep) == 0 {
		return nil, nil // dead nodes only
	}
	consts := constantInitializers(m)
	values, err := runNodes(ctx, m, p.nodes, consts, keep, nil)
	if err == nil || ctx.Err() != nil {
		return values, ctx.Err()
	}
	values = map[string]*onnx.Tensor{}
	var ok []*onnxpb.NodeProto
	for _, n := range p.nodes {
		if !allKnown(onnx.NodeInputs(n), consts) {
			continue
		}
		var outs []string
		for _, o := range n.GetOutput() {
			if o != "" {
				outs = append(outs, o)
			}
		}
		got, err := runNodes(ctx, m, []*onnxpb.NodeProto{n}, consts, outs, nil)
		if err != nil && ctx.Err() == nil {
			got, err = runNodes(ctx, m, []*onnxpb.NodeProto{n}, consts, outs, likeFirstInput(n, outs, consts))
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			continue
		}
		for name, t := range got {
			pt, err := onnx.Encode(&onnx.Tensor{Name: name, Type: t.Type, Dims: t.Dims, Data: t.Data}, onnx.Raw)
			if err != nil {
				return nil, fmt.Errorf("folding %s: %w", name, err)
			}
			consts[name] = pt
			values[name] = t
		}
		ok = append(ok, n)
	}
	p.nodes = ok
	return values, nil
}

// runNodes builds a model of nodes and the constants they read, with outs
// as its outputs, and runs it (see foldModel).
func runNodes(ctx context.Context, m *onnx.Model, nodes []*onnxpb.NodeProto, consts map[string]*onnxpb.TensorProto, outs []string, types map[string]onnx.DataType) (map[string]*onnx.Tensor, error) {
	what := describeNode(nodes[0])
	if len(nodes) > 1 {
		what = fmt.Sprintf("%d nodes from %s on", len(nodes), what)
	}
	mini, feed, fetch := foldModel(m, nodes, consts, outs, types)
	data, err := mini.Marshal()
	if err != nil {
		return nil, fmt.Errorf("folding %s: %w", what, err)
	}
	s, err := ort.NewSessionFromBytes(data, foldSession)
	if err != nil {
		return nil, fmt.Errorf("folding %s: %w", what, err)
	}
	defer s.Close()
	got, err := s.Run(ctx, feed, nil) // nil: untyped outputs cannot be named
	if err != nil {
		return nil, fmt.Errorf("folding %s: %w", what, err)
	}
	if fetch == nil {
		return got, nil
	}
	values := make(map[string]*onnx.Tensor, len(outs))
	for _, o := range outs {
		t, sh := got[fetch[o][0]], got[fetch[o][1]]
		if t == nil || sh == nil {
			return nil, fmt.Errorf("folding %s: ONNX Runtime returned no value for %s", what, o)
		}
		dims, ok := sh.Data.([]int64)
		if !ok {
			return nil, fmt.Errorf("folding %s: the shape of %s is %s", what, o, sh.Type)
		}
		values[o] = &onnx.Tensor{Name: o, Type: t.Type, Dims: dims, Data: t.Data}
	}
	return values, nil
}

// foldModel builds the model runNodes runs, the feed for its one unused
// input (the binding cannot run a model without inputs) and, for each
// output, the names it is fetched under. Outputs are declared without a
// type (ONNX Runtime infers them, and the binding converts what comes
// back), except those named in types: the binding cannot take float16 or
// bfloat16 values it was not told of, so evaluate retries a failed node
// with its outputs declared of its first input's type, which is right for
// the operators that move or reshape weights. The binding cannot take
// rank-0 values that ONNX Runtime allocates either, so each output is
// fetched flattened, with its shape beside it (from opset 5 on, where
// Reshape takes its shape as an input; fetch is nil before).
func foldModel(m *onnx.Model, nodes []*onnxpb.NodeProto, consts map[string]*onnxpb.TensorProto, outs []string, types map[string]onnx.DataType) (*onnx.Model, map[string]*onnx.Tensor, map[string][2]string) {
	g := &onnxpb.GraphProto{Name: strRef("fold"), Node: slices.Clone(nodes)}
	read := map[string]bool{}
	for _, n := range nodes {
		for _, in := range onnx.NodeInputs(n) {
			if t := consts[in]; t != nil && !read[in] {
				read[in] = true
				g.Initializer = append(g.Initializer, t)
			}
		}
	}
	names := onnx.NewNames(g, 1)
	declare := func(name string, dt onnx.DataType, typed bool) {
		v := &onnxpb.ValueInfoProto{Name: strRef(name)}
		if typed {
			v = onnx.TensorType(name, dt, onnx.Shape{})
		}
		g.Output = append(g.Output, v)
	}
	var fetch map[string][2]string
	if m.Opset() >= 5 {
		fetch = map[string][2]string{}
		minusOne := names.Fresh("kiln_fold_minus_one")
		g.Initializer = append(g.Initializer, &onnxpb.TensorProto{Name: &minusOne, DataType: ptrInt32(int32(onnx.Int64)), Dims: []int64{1}, Int64Data: []int64{-1}})
		for _, o := range outs {
			dt, typed := types[o]
			f, sh := names.Fresh(o+"_kiln_flat"), names.Fresh(o+"_kiln_shape")
			g.Node = append(g.Node,
				&onnxpb.NodeProto{OpType: strRef("Reshape"), Input: []string{o, minusOne}, Output: []string{f}},
				&onnxpb.NodeProto{OpType: strRef("Shape"), Input: []string{o}, Output: []string{sh}})
			declare(f, dt, typed)
			declare(sh, onnx.Int64, true)
			fetch[o] = [2]string{f, sh}
		}
	} else {
		for _, o := range outs {
			dt, typed := types[o]
			declare(o, dt, typed)
		}
	}
	dummy := names.Fresh("kiln_fold_unused")
	g.Input = []*onnxpb.ValueInfoProto{onnx.TensorType(dummy, onnx.Float, fixedShape([]int64{1}))}
	feed := map[string]*onnx.Tensor{dummy: {Name: dummy, Type: onnx.Float, Dims: []int64{1}, Data: []float32{0}}}
	ir := max(m.Proto.GetIrVersion(), 4)
	mini := &onnx.Model{Proto: &onnxpb.ModelProto{IrVersion: &ir, OpsetImport: m.Proto.GetOpsetImport(), Graph: g, Functions: m.Proto.GetFunctions()}}
	return mini, feed, fetch
}

// foldSession runs the small models of folding: one thread (the values are
// small, and thread pools cost more to start than they save) and no graph
// optimization, so that every node runs as written.
var foldSession = ort.SessionOptions{IntraOpThreads: 1, InterOpThreads: 1, OptLevel: ort.OptDisabled}

// likeFirstInput declares outs of the element type of n's first input.
func likeFirstInput(n *onnxpb.NodeProto, outs []string, consts map[string]*onnxpb.TensorProto) map[string]onnx.DataType {
	if len(n.GetInput()) == 0 || consts[n.GetInput()[0]] == nil {
		return nil
	}
	dt := onnx.DataType(consts[n.GetInput()[0]].GetDataType())
	types := make(map[string]onnx.DataType, len(outs))
	for _, o := range outs {
		types[o] = dt
	}
	return types
}

// writesAny reports whether n writes one of names.
func writesAny(n *onnxpb.NodeProto, names map[string]bool) bool {
	for _, o := range n.GetOutput() {
		if names[o] {
			return true
		}
	}
	return false
}

// allKnown reports whether every name is a key of known.
func allKnown[V any](names []string, known map[string]V) bool {
	for _, name := range names {
		if _, ok := known[name]; !ok {
			return false
		}
	}
	return true
}

// producerIn returns the node of nodes that writes name.
func producerIn(nodes []*onnxpb.NodeProto, name string) *onnxpb.NodeProto {
	for _, n := range nodes {
		for _, o := range n.GetOutput() {
			if o == name {
				return n
			}
		}
	}
	return nil
}

// tensorSize is the number of bytes n elements of dt take (strings and
// sub-byte types count one byte an element).
func tensorSize(dt onnx.DataType, n int) int64 {
	return int64(n) * int64(max(dt.Size(), 1))
}

// grows reports whether n is a ConstantOfShape, Expand or Tile whose
// output would break the growth limits (see growLimit), or whose size
// cannot be told yet because its shape input is not an initializer (it is
// then folded in a later round).
func grows(n *onnxpb.NodeProto, consts map[string]*onnxpb.TensorProto) bool {
	in := n.GetInput()
	if len(in) < 1 {
		return false
	}
	var (
		dims []int64
		ok   bool
		dt   = onnx.Float
	)
	switch n.GetOpType() {
	case "ConstantOfShape":
		dims, ok = int64sOf(consts[in[0]])
		if a := attrNamed(n, "value"); a != nil && a.GetT() != nil {
			dt = onnx.DataType(a.GetT().GetDataType())
		}
	case "Expand", "Tile":
		x := consts[in[0]]
		if len(in) < 2 || x == nil {
			return true
		}
		dt = onnx.DataType(x.GetDataType())
		var arg []int64
		if arg, ok = int64sOf(consts[in[1]]); ok {
			dims, ok = resultDims(n.GetOpType(), x.GetDims(), arg)
		}
	default:
		return false
	}
	if !ok {
		return true
	}
	var inBytes int64
	for _, name := range in {
		if t := consts[name]; t != nil {
			inBytes += tensorSize(onnx.DataType(t.GetDataType()), elements(t.GetDims()))
		}
	}
	out := tensorSize(dt, elements(dims))
	return out > growLimit && out > growFactor*inBytes
}

// resultDims is the output shape of Expand (broadcasting x against arg)
// or Tile (x repeated arg times along each axis).
func resultDims(op string, x, arg []int64) ([]int64, bool) {
	if op == "Tile" {
		if len(arg) != len(x) {
			return nil, false
		}
		out := make([]int64, len(x))
		for i := range x {
			out[i] = x[i] * arg[i]
		}
		return out, true
	}
	r := max(len(x), len(arg))
	out := make([]int64, r)
	for i := range r {
		a, b := int64(1), int64(1)
		if j := i - (r - len(x)); j >= 0 {
			a = x[j]
		}
		if j := i - (r - len(arg)); j >= 0 {
			b = arg[j]
		}
		out[i] = max(a, b)
	}
	return out, true
}
