package fp16

import (
	"fmt"
	"strings"

	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// form is the precision a float32 value of the original graph has in the
// rewritten one.
type form int

const (
	f32 form = iota
	f16
)

func (f form) dtype() onnx.DataType {
	if f == f16 {
		return onnx.Float16
	}
	return onnx.Float
}

func (f form) suffix() string {
	if f == f16 {
		return "_fp16"
	}
	return "_fp32"
}

// value is one value of the original graph. Only float32 values (dt ==
// onnx.Float) are ever changed.
type value struct {
	name   string
	dt     onnx.DataType
	owner  *scope
	native form // the precision its producer writes
	// flexible values (initializers, Constant and ConstantOfShape outputs)
	// take the precision their consumers want.
	flexible bool
	demand   [2]bool
	names    [2]string // the name of each form, once it exists
	init     *onnxpb.TensorProto
	konst    *onnxpb.NodeProto
}

// scope is one graph (the main graph or a subgraph) being rewritten.
type scope struct {
	c       *converter
	parent  *scope
	g       *onnxpb.GraphProto
	main    bool
	blocked bool // inside a blocked control-flow node: everything stays float32
	vals    map[string]*value
	order   []*onnxpb.NodeProto
	block   map[*onnxpb.NodeProto]bool
	sub     map[*onnxpb.NodeProto][]*scope
	added   []*onnxpb.NodeProto
	shapes  map[string]*onnxpb.TensorShapeProto
}

type converter struct {
	m         *onnx.Model
	opts      Options
	lim       limits
	opset     int64
	opBlock   map[string]bool
	nodeBlock map[string]bool
	names     *onnx.Names // fresh value and node names
	// analysisBlock holds the labels of the nodes Options.Analysis keeps,
	// analysisSeen those found in the main graph.
	analysisBlock, analysisSeen map[string]bool
	report                      *Report
	converted                   int // float32 values computed in float16
	scopes                      []*scope
}

func newConverter(m *onnx.Model, opts Options, opset int64) *converter {
	lo, hi := opts.bounds()
	ops := opts.OpBlockList
	if ops == nil {
		ops = DefaultBlockList
	}
	return &converter{m: m, opts: opts, lim: limits{float32(lo), float32(hi)}, opset: opset,
		opBlock: setOf(ops...), nodeBlock: setOf(opts.NodeBlockList...), names: onnx.NewNames(m.Graph(), 1),
		analysisBlock: setOf(opts.Analysis.Nodes()...), analysisSeen: map[string]bool{}, report: &Report{}}
}

func (c *converter) fresh(base string) string { return c.names.Fresh(base) }

func (c *converter) run() error {
	root := &scope{c: c, g: c.m.Graph(), main: true}
	if err := root.build(nil); err != nil {
		return err
	}
	for _, k := range c.opts.Analysis.Nodes() {
		if !c.analysisSeen[k] {
			return fmt.Errorf("the analysis keeps node %s, which the main graph does not have: analyze this model", k)
		}
	}
	for _, s := range c.scopes {
		s.decide()
	}
	for _, s := range c.scopes {
		if err := s.rewrite(); err != nil {
			return err
		}
	}
	for _, s := range c.scopes {
		if err := s.finish(); err != nil {
			return err
		}
	}
	return nil
}

func (s *scope) lookup(name string) *value {
	for sc := s; sc != nil; sc = sc.parent {
		if v, ok := sc.vals[name]; ok {
			return v
		}
	}
	return nil
}

func (s *scope) add(name string, dt onnx.DataType, native form) *value {
	v := &value{name: name, dt: dt, owner: s, native: native}
	s.vals[name] = v
	return v
}

// outputForm is the precision a graph output must have.
func (s *scope) outputForm() form {
	if s.blocked || (s.main && s.c.opts.KeepIOTypes) {
		return f32
	}
	return f16
}

// build registers the graph's values with their original element types,
// decides which nodes are blocked and records which precision every
// consumer wants. declared gives the types of a subgraph's inputs when its
// proto omits them.
func (s *scope) build(declared []onnx.DataType) error {
	c := s.c
	c.scopes = append(c.scopes, s)
	s.vals, s.block, s.sub = map[string]*value{}, map[*onnxpb.NodeProto]bool{}, map[*onnxpb.NodeProto][]*scope{}
	s.shapes = map[string]*onnxpb.TensorShapeProto{}
	declaredTypes := map[string]onnx.DataType{}
	for _, list := range [][]*onnxpb.ValueInfoProto{s.g.GetInput(), s.g.GetOutput(), s.g.GetValueInfo()} {
		for _, vi := range list {
			if tt := vi.GetType().GetTensorType(); tt != nil {
				declaredTypes[vi.GetName()] = onnx.DataType(tt.GetElemType())
				s.shapes[vi.GetName()] = tt.GetShape()
			}
		}
	}
	inputForm := f16
	if s.blocked || (s.main && c.opts.KeepIOTypes) {
		inputForm = f32
	}
	for _, t := range s.g.GetInitializer() {
		v := s.add(t.GetName(), onnx.DataType(t.GetDataType()), f32)
		v.flexible, v.init = true, t
		s.shapes[t.GetName()] = dimsShape(t.GetDims())
	}
	for _, sp := range s.g.GetSparseInitializer() {
		// Sparse initializers are kept as they are; float16 users get a Cast.
		s.add(sp.GetValues().GetName(), onnx.DataType(sp.GetValues().GetDataType()), f32)
	}
	for i, in := range s.g.GetInput() {
		if _, isInit := s.vals[in.GetName()]; isInit {
			continue
		}
		dt := onnx.Undefined
		if tt := in.GetType().GetTensorType(); tt != nil {
			dt = onnx.DataType(tt.GetElemType())
		} else if in.GetType() == nil && i < len(declared) {
			dt = declared[i]
		}
		s.add(in.GetName(), dt, inputForm)
	}
	order, err := onnx.TopoSort(s.g)
	if err != nil {
		return err
	}
	s.order = order
	for _, n := range order {
		if err := s.buildNode(n, declaredTypes); err != nil {
			return err
		}
	}
	for _, o := range s.g.GetOutput() {
		if v := s.lookup(o.GetName()); v != nil && v.dt == onnx.Float {
			v.demand[s.outputForm()] = true
		}
	}
	return nil
}

func dimsShape(dims []int64) *onnxpb.TensorShapeProto {
	sh := onnx.Shape{Ranked: true}
	for _, d := range dims {
		sh.Dims = append(sh.Dims, onnx.Dim{Value: d, Known: true})
	}
	return sh.Proto()
}

func (s *scope) buildNode(n *onnxpb.NodeProto, declared map[string]onnx.DataType) error {
	c := s.c
	op := n.GetOpType()
	def := isDefaultDomain(n)
	in := make([]onnx.DataType, len(n.GetInput()))
	for i, name := range n.GetInput() {
		if v := s.lookup(name); v != nil {
			in[i] = v.dt
		}
	}
	blocked := s.isBlocked(n, in)
	if !def && !blocked {
		return &UnsupportedError{Node: nodeLabel(n), Op: op, Reason: ReasonCustomDomain,
			Detail: fmt.Sprintf("domain %q: add %s to the op block list or the node to the node block list", n.GetDomain(), op)}
	}
	if def && unsupportedOps[op] {
		return &UnsupportedError{Node: nodeLabel(n), Op: op, Reason: ReasonSequence,
			Detail: op + " works on sequences or optionals, which the fp16 rewrite does not track"}
	}
	s.block[n] = blocked
	var out []onnx.DataType
	var ok bool
	var err error
	if def && controlFlow[op] {
		if out, err = s.buildSubgraphs(n, in, blocked); err != nil {
			return fmt.Errorf("subgraph of node %s (%s): %w", nodeLabel(n), op, err)
		}
		ok = true
	} else {
		out, ok = inferOutputs(n, in)
	}
	for i, o := range n.GetOutput() {
		if o == "" {
			continue
		}
		dt := onnx.Undefined
		if ok && i < len(out) {
			dt = out[i]
		}
		if dt == onnx.Undefined {
			if d, found := declared[o]; found {
				dt = d
			} else if !ok {
				return &UnsupportedError{Node: nodeLabel(n), Op: op, Reason: ReasonUntyped,
					Detail: fmt.Sprintf("cannot tell the element type of output %q; add value_info for it or block the node", o)}
			}
		}
		native := f16
		if blocked || fixedFloat(n, i) {
			native = f32
		}
		v := s.add(o, dt, native)
		if !blocked && def && (op == "Constant" || op == "ConstantOfShape") {
			v.flexible, v.konst = true, n
		}
	}
	floats := false
	for i, name := range n.GetInput() {
		v := s.lookup(name)
		if v == nil || v.dt != onnx.Float {
			continue
		}
		floats = true
		v.demand[s.slotForm(n, i)] = true
	}
	for _, o := range n.GetOutput() {
		if v := s.vals[o]; v != nil && v.dt == onnx.Float {
			floats = true
		}
	}
	if blocked && floats && !s.blocked {
		c.report.BlockedNodes = append(c.report.BlockedNodes, nodeLabel(n))
	}
	return nil
}

// isBlocked reports whether node n, with input types in, stays float32:
// for its scope, the block lists, the analysis, or the rules of types.go.
func (s *scope) isBlocked(n *onnxpb.NodeProto, in []onnx.DataType) bool {
	c := s.c
	blocked := s.blocked || c.opBlock[n.GetOpType()] || (n.GetName() != "" && c.nodeBlock[n.GetName()])
	if s.main && c.analysisBlock[nodeLabel(n)] {
		blocked = true
		c.analysisSeen[nodeLabel(n)] = true
	}
	if !isDefaultDomain(n) {
		return blocked
	}
	return blocked || fp32Only(n.GetOpType(), c.opset) != "" || castsAway(n, in) ||
		(c.opts.OpBlockList == nil && defaultNodeRule(n) != "")
}

// slotForm is the precision node n wants for input slot i.
func (s *scope) slotForm(n *onnxpb.NodeProto, i int) form {
	if s.block[n] || alwaysFloat(n.GetOpType(), i, s.c.opset) {
		return f32
	}
	return f16
}

// buildSubgraphs builds the scopes of a control-flow node's bodies and
// returns the node's output types.
func (s *scope) buildSubgraphs(n *onnxpb.NodeProto, in []onnx.DataType, blocked bool) ([]onnx.DataType, error) {
	var out []onnx.DataType
	for _, a := range n.GetAttribute() {
		graphs := a.GetGraphs()
		if a.G != nil {
			graphs = append([]*onnxpb.GraphProto{a.G}, graphs...)
		}
		for _, g := range graphs {
			var declared []onnx.DataType
			switch n.GetOpType() {
			case "Loop":
				declared = append([]onnx.DataType{onnx.Int64, onnx.Bool}, in[min(2, len(in)):]...)
			case "Scan":
				declared = in
			}
			child := &scope{c: s.c, parent: s, g: g, blocked: blocked}
			if err := child.build(declared); err != nil {
				return nil, err
			}
			s.sub[n] = append(s.sub[n], child)
			if out != nil {
				continue // If: the else branch has the same types
			}
			outs := g.GetOutput()
			if n.GetOpType() == "Loop" && len(outs) > 0 {
				outs = outs[1:] // the condition
			}
			for _, o := range outs {
				dt := onnx.Undefined
				if v := child.lookup(o.GetName()); v != nil {
					dt = v.dt
				}
				if dt == onnx.Undefined {
					dt = onnx.DataType(o.GetType().GetTensorType().GetElemType())
				}
				out = append(out, dt)
			}
			if out == nil {
				out = []onnx.DataType{}
			}
		}
	}
	if out == nil {
		return nil, &UnsupportedError{Node: nodeLabel(n), Op: n.GetOpType(), Reason: ReasonNoSubgraph, Detail: "no graph attribute"}
	}
	return out, nil
}

// decide fixes the precision of flexible values and names every form that
// exists from the start.
func (s *scope) decide() {
	for _, v := range s.vals {
		if v.dt != onnx.Float {
			continue
		}
		if v.flexible {
			v.native = f32
			if v.demand[f16] {
				v.native = f16
			}
		}
		v.names[v.native] = v.name
	}
	if !s.main {
		return
	}
	// A main-graph output keeps its name in the form the graph declares: the
	// producer writes a renamed value and a Cast writes the output.
	want := s.outputForm()
	for _, o := range s.g.GetOutput() {
		v := s.vals[o.GetName()]
		if v == nil || v.dt != onnx.Float || v.native == want {
			continue
		}
		v.names[v.native] = s.c.fresh(v.name + v.native.suffix())
		v.names[want] = v.name
		s.addCast(v, want, v.name)
	}
}

// nameFor returns the name of v in form f, adding a Cast in v's own graph
// the first time another graph or node needs it.
func (v *value) nameFor(f form) string {
	if v.names[f] == "" {
		v.names[f] = v.owner.c.fresh(v.name + f.suffix())
		v.owner.addCast(v, f, v.names[f])
	}
	return v.names[f]
}

func (s *scope) addCast(v *value, f form, out string) {
	to := int64(f.dtype())
	s.added = append(s.added, castNode(s.c.fresh(v.name+"_cast"+f.suffix()), v.names[v.native], out, to))
	s.c.report.CastsInserted++
}

func castNode(name, in, out string, to int64) *onnxpb.NodeProto {
	t := onnxpb.AttributeProto_INT
	return &onnxpb.NodeProto{Name: proto.String(name), OpType: proto.String("Cast"), Input: []string{in}, Output: []string{out},
		Attribute: []*onnxpb.AttributeProto{{Name: proto.String("to"), Type: &t, I: proto.Int64(to)}}}
}

// rewrite renames the inputs and outputs of every node to the precision it
// uses, converts tensors and attributes, and retypes the graph's values.
func (s *scope) rewrite() error {
	c := s.c
	for _, n := range s.order {
		var first *value
		if len(n.GetOutput()) > 0 {
			first = s.vals[n.GetOutput()[0]]
		}
		for i, name := range n.GetInput() {
			if v := s.lookup(name); v != nil && v.dt == onnx.Float {
				n.Input[i] = v.nameFor(s.slotForm(n, i))
			}
		}
		for i, o := range n.GetOutput() {
			v := s.vals[o]
			if v == nil || v.dt != onnx.Float {
				continue
			}
			n.Output[i] = v.names[v.native]
			if v.native == f16 {
				c.converted++
			}
		}
		if s.block[n] {
			continue
		}
		if err := s.rewriteAttrs(n, first); err != nil {
			return fmt.Errorf("node %s: %w", nodeLabel(n), err)
		}
	}
	for i, t := range s.g.GetInitializer() {
		v := s.vals[t.GetName()]
		if v == nil || v.dt != onnx.Float {
			continue
		}
		if v.native == f32 {
			c.report.KeptInitializers++
			t.Name = proto.String(v.names[f32])
			continue
		}
		h, info, err := c.lim.halfTensor(t)
		if err != nil {
			return err
		}
		h.Name = proto.String(v.names[f16])
		s.g.Initializer[i] = h
		c.noteConverted(v, info)
	}
	for _, in := range s.g.GetInput() {
		if v := s.vals[in.GetName()]; v != nil && v.dt == onnx.Float {
			// Graph inputs keep their name; IR<4 inputs that list an
			// initializer follow its new name and type.
			in.Name = proto.String(v.names[v.native])
			setElemType(in, v.native.dtype())
		}
	}
	for _, o := range s.g.GetOutput() {
		v := s.lookup(o.GetName())
		if v == nil || v.dt != onnx.Float {
			continue
		}
		f := s.outputForm()
		o.Name = proto.String(v.nameFor(f))
		setElemType(o, f.dtype())
	}
	return nil
}

func (c *converter) noteConverted(v *value, info ClampInfo) {
	c.report.ConvertedInitializers++
	if info.Clamped > 0 || info.Flushed > 0 {
		info.Tensor = v.name
		c.report.Clamped = append(c.report.Clamped, info)
		c.report.Warnings = append(c.report.Warnings, clampWarning(info, c.lim))
	}
	if v.demand[f32] {
		c.report.Warnings = append(c.report.Warnings, fmt.Sprintf(
			"%q is used by float16 and float32 nodes: it is stored as float16 and cast back for the float32 ones", v.name))
	}
}

// clampWarning says what clamping did to one tensor.
func clampWarning(info ClampInfo, l limits) string {
	var parts []string
	if info.Clamped > 0 {
		parts = append(parts, fmt.Sprintf("%d values up to %.3g clamped to ±%g", info.Clamped, info.Largest, l.maxFinite))
	}
	if info.Flushed > 0 {
		parts = append(parts, fmt.Sprintf("%d non-zero values below %.3g raised to ±%.3g", info.Flushed, l.minPos, l.minPos))
	}
	return fmt.Sprintf("tensor %q: %s", info.Tensor, strings.Join(parts, ", "))
}

func setElemType(vi *onnxpb.ValueInfoProto, dt onnx.DataType) {
	if tt := vi.GetType().GetTensorType(); tt != nil {
		tt.ElemType = proto.Int32(int32(dt))
	}
}

// rewriteAttrs makes a kept node produce float16 where it produced float32.
func (s *scope) rewriteAttrs(n *onnxpb.NodeProto, v *value) error {
	op := n.GetOpType()
	if v == nil || v.dt != onnx.Float || v.native != f16 {
		return nil
	}
	if ta, ok := typeAttrs[op]; ok && isDefaultDomain(n) {
		a := attr(n, ta.name)
		if a == nil {
			t := onnxpb.AttributeProto_INT
			a = &onnxpb.AttributeProto{Name: proto.String(ta.name), Type: &t}
			n.Attribute = append(n.Attribute, a)
		}
		a.I = proto.Int64(int64(onnx.Float16))
		return nil
	}
	switch op {
	case "Constant":
		return s.halfConstant(n, v)
	case "ConstantOfShape":
		a := attr(n, "value")
		if a == nil || a.T == nil {
			zero := float16.Fromfloat32(0)
			t := onnxpb.AttributeProto_TENSOR
			n.Attribute = append(n.Attribute, &onnxpb.AttributeProto{Name: proto.String("value"), Type: &t,
				T: &onnxpb.TensorProto{Dims: []int64{1}, DataType: proto.Int32(int32(onnx.Float16)), RawData: []byte{byte(zero), byte(zero >> 8)}}})
			return nil
		}
		h, info, err := s.c.lim.halfTensor(a.T)
		if err != nil {
			return err
		}
		a.T = h
		s.c.noteConverted(v, info)
	}
	return nil
}

func (s *scope) halfConstant(n *onnxpb.NodeProto, v *value) error {
	for _, a := range n.GetAttribute() {
		var t *onnxpb.TensorProto
		switch a.GetName() {
		case "value":
			t = a.T
		case "value_float":
			t = &onnxpb.TensorProto{DataType: proto.Int32(int32(onnx.Float)), FloatData: []float32{a.GetF()}}
		case "value_floats":
			t = &onnxpb.TensorProto{DataType: proto.Int32(int32(onnx.Float)), Dims: []int64{int64(len(a.GetFloats()))}, FloatData: a.GetFloats()}
		default:
			continue
		}
		if t == nil {
			continue
		}
		h, info, err := s.c.lim.halfTensor(t)
		if err != nil {
			return err
		}
		ty := onnxpb.AttributeProto_TENSOR
		a.Name, a.Type, a.T, a.F, a.Floats = proto.String("value"), &ty, h, nil, nil
		s.c.noteConverted(v, info)
	}
	return nil
}
