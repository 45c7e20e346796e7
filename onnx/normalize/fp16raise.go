package normalize

import (
	"context"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

// The fp16-raise pass rewrites float16 and bfloat16 storage and compute to
// float32 end to end, so that an fp32 variant of a mixed or fp16 source
// really computes in fp32:
//
//   - every float16/bfloat16 tensor (initializers, sparse initializers,
//     Constant and ConstantOfShape values, any tensor attribute) becomes
//     float32, exactly (both widen without rounding);
//   - Cast(to=FLOAT16|BFLOAT16) becomes Cast(to=FLOAT), and dtype-like
//     attributes (RandomNormal's dtype, the windows' output_datatype...)
//     naming a half type name FLOAT;
//   - a Cast that is then an identity (float32 to float32) is removed: its
//     consumers read its input instead (when its output is a graph output,
//     the producer of its input writes that output instead; where neither
//     is possible the Cast(to=FLOAT) stays, which is harmless);
//   - graph inputs, outputs and value_info entries of a half type are
//     declared float32. No Cast is inserted at the boundary: the raised
//     model takes and gives float32, which is what an fp32 variant must
//     do. Clients that fed float16 feed float32 instead.
//
// Subgraphs (If, Loop, Scan bodies) and model-local functions are raised
// too. The pass checks its result and fails, naming the place, if any half
// type is left.
func init() { register(40, raiseFP16Pass) }

func raiseFP16Pass(_ context.Context, m *onnx.Model, o Options) (Pass, error) {
	p := Pass{Name: "fp16-raise"}
	if !o.RaiseFP16 {
		return p, nil
	}
	st, err := raiseFP16(m)
	if err != nil {
		return p, err
	}
	p.Changed = st.tensors + st.nodes + st.values
	p.Summary = st.summary()
	return p, nil
}

// raiseStats counts what raiseFP16 changed.
type raiseStats struct {
	tensors int // initializers (and sparse initializers) raised
	nodes   int // nodes whose attributes were raised (Cast targets, Constant values, dtypes)
	removed int // identity Casts removed
	values  int // graph inputs, outputs and value_info entries retyped
	// f16 and bf16 say which half types the model's tensors had.
	f16, bf16 bool
}

func (s raiseStats) summary() string {
	half := "float16"
	switch {
	case s.bf16 && s.f16:
		half = "float16/bfloat16"
	case s.bf16:
		half = "bfloat16"
	}
	r := fmt.Sprintf("raised %d %s initializers and %d %s nodes to float32", s.tensors, half, s.nodes, half)
	if s.removed > 0 {
		r += fmt.Sprintf(", removing %d Casts that became identities", s.removed)
	}
	if s.values > 0 {
		r += fmt.Sprintf(" (%d inputs, outputs and value_info entries now float32)", s.values)
	}
	return r
}

// raiseFP16 edits m in place.
func raiseFP16(m *onnx.Model) (raiseStats, error) {
	var st raiseStats
	_ = m.Tensors(func(t *onnxpb.TensorProto) error {
		st.f16 = st.f16 || onnx.DataType(t.GetDataType()) == onnx.Float16
		st.bf16 = st.bf16 || onnx.DataType(t.GetDataType()) == onnx.BFloat16
		return nil
	})
	if err := raiseGraph(m.Graph(), nil, &st); err != nil {
		return st, err
	}
	for _, f := range m.Proto.GetFunctions() {
		for _, n := range f.GetNode() {
			if err := raiseNode(n, &st); err != nil {
				return st, fmt.Errorf("function %s: %w", f.GetName(), err)
			}
		}
		st.values += raiseValueInfos(f.GetValueInfo())
	}
	// Tensors no graph walk reaches (training graphs) are raised as well.
	err := m.Tensors(func(t *onnxpb.TensorProto) error {
		ok, err := raiseTensor(t)
		if ok {
			st.tensors++
		}
		return err
	})
	if err != nil {
		return st, err
	}
	if left := halfLeft(m); len(left) > 0 {
		return st, fmt.Errorf("raising float16 to float32 left half types in %s", strings.Join(precLimit(left, 5), ", "))
	}
	return st, nil
}

// raiseGraph raises g and its subgraphs; outer holds the element types of
// the enclosing scopes as they were before raising.
func raiseGraph(g *onnxpb.GraphProto, outer map[string]onnx.DataType, st *raiseStats) error {
	types := inferElemTypes(g, outer)
	for _, t := range g.GetInitializer() {
		ok, err := raiseTensor(t)
		if err != nil {
			return err
		}
		if ok {
			st.tensors++
		}
	}
	for _, s := range g.GetSparseInitializer() {
		ok, err := raiseTensor(s.GetValues())
		if err != nil {
			return err
		}
		if ok {
			st.tensors++
		}
	}
	for _, n := range g.GetNode() {
		for _, a := range n.GetAttribute() {
			for _, sub := range precSubgraphs(a) {
				if err := raiseGraph(sub, types, st); err != nil {
					return fmt.Errorf("subgraph %s of node %s: %w", a.GetName(), precNodeName(n), err)
				}
			}
		}
		if err := raiseNode(n, st); err != nil {
			return err
		}
	}
	st.values += raiseValueInfos(g.GetInput()) + raiseValueInfos(g.GetOutput()) + raiseValueInfos(g.GetValueInfo())
	st.removed += removeIdentityCasts(g, types)
	return nil
}

// dtypeAttrs name attributes that hold an element type.
var halfDtypeAttrs = precSet("to", "dtype", "output_datatype", "output_dtype")

// raiseNode raises n's own attributes (not its subgraphs).
func raiseNode(n *onnxpb.NodeProto, st *raiseStats) error {
	changed := false
	for _, a := range n.GetAttribute() {
		if halfDtypeAttrs[a.GetName()] && a.GetType() == onnxpb.AttributeProto_INT && precHalf(onnx.DataType(a.GetI())) {
			a.I = proto.Int64(int64(onnx.Float))
			changed = true
		}
		ts := a.GetTensors()
		if a.T != nil {
			ts = append([]*onnxpb.TensorProto{a.T}, ts...)
		}
		if a.GetSparseTensor() != nil {
			ts = append(ts, a.GetSparseTensor().GetValues())
		}
		for _, t := range ts {
			ok, err := raiseTensor(t)
			if err != nil {
				return fmt.Errorf("attribute %s of node %s: %w", a.GetName(), precNodeName(n), err)
			}
			changed = changed || ok
		}
	}
	if changed {
		st.nodes++
	}
	return nil
}

// raiseTensor rewrites a float16 or bfloat16 tensor as float32 in place
// (raw_data), reporting whether it did.
func raiseTensor(p *onnxpb.TensorProto) (bool, error) {
	if p == nil || !precHalf(onnx.DataType(p.GetDataType())) {
		return false, nil
	}
	t, err := onnx.Decode(p)
	if err != nil {
		return false, fmt.Errorf("raising tensor %q to float32: %w", p.GetName(), err)
	}
	f := make([]float32, t.Len())
	switch d := t.Data.(type) {
	case []float16.Float16:
		for i, v := range d {
			f[i] = v.Float32()
		}
	case []onnx.BF16:
		for i, v := range d {
			f[i] = v.Float32()
		}
	default:
		return false, fmt.Errorf("raising tensor %q to float32: decoded as %T", p.GetName(), t.Data)
	}
	raw := onnx.RawBytes(&onnx.Tensor{Type: onnx.Float, Dims: t.Dims, Data: f})
	p.DataType = proto.Int32(int32(onnx.Float))
	p.RawData = raw
	p.Int32Data, p.FloatData = nil, nil
	return true, nil
}

// raiseValueInfos declares half-typed values float32 (inside sequences,
// optionals and maps too), returning how many it changed.
func raiseValueInfos(vs []*onnxpb.ValueInfoProto) int {
	n := 0
	for _, v := range vs {
		if raiseType(v.GetType()) {
			n++
		}
	}
	return n
}

func raiseType(t *onnxpb.TypeProto) bool {
	switch {
	case t == nil:
		return false
	case t.GetTensorType() != nil:
		tt := t.GetTensorType()
		if precHalf(onnx.DataType(tt.GetElemType())) {
			tt.ElemType = proto.Int32(int32(onnx.Float))
			return true
		}
	case t.GetSparseTensorType() != nil:
		tt := t.GetSparseTensorType()
		if precHalf(onnx.DataType(tt.GetElemType())) {
			tt.ElemType = proto.Int32(int32(onnx.Float))
			return true
		}
	case t.GetSequenceType() != nil:
		return raiseType(t.GetSequenceType().GetElemType())
	case t.GetOptionalType() != nil:
		return raiseType(t.GetOptionalType().GetElemType())
	case t.GetMapType() != nil:
		return raiseType(t.GetMapType().GetValueType())
	}
	return false
}

// raised is the type a value has after raising.
func raisedType(dt onnx.DataType) onnx.DataType {
	if precHalf(dt) {
		return onnx.Float
	}
	return dt
}

// removeIdentityCasts drops the Cast(to=FLOAT) nodes of g whose input is
// float32 after raising; types are g's element types before raising.
// It returns how many it removed.
func removeIdentityCasts(g *onnxpb.GraphProto, types map[string]onnx.DataType) int {
	removed := 0
	keep := g.GetNode()[:0]
	for _, n := range g.GetNode() {
		if !identityCast(n, types) || !bypass(g, n) {
			keep = append(keep, n)
			continue
		}
		removed++
	}
	for i := len(keep); i < len(g.Node); i++ {
		g.Node[i] = nil
	}
	g.Node = keep
	return removed
}

func identityCast(n *onnxpb.NodeProto, types map[string]onnx.DataType) bool {
	if n.GetOpType() != "Cast" || (n.GetDomain() != "" && n.GetDomain() != "ai.onnx") ||
		len(n.GetInput()) != 1 || len(n.GetOutput()) != 1 || castTarget(n) != onnx.Float {
		return false
	}
	in, ok := types[n.GetInput()[0]]
	if !ok || raisedType(in) != onnx.Float {
		return false
	}
	// Only Casts that the half types took part in; a Cast the model had
	// from float32 to float32 is left as the model wrote it.
	return precHalf(in) || precHalf(types[n.GetOutput()[0]])
}

// bypass rewires g so that Cast node n can be dropped, reporting whether
// it could.
func bypass(g *onnxpb.GraphProto, n *onnxpb.NodeProto) bool {
	x, y := n.GetInput()[0], n.GetOutput()[0]
	if !precIsOutput(g, y) {
		precRenameUses(g, y, x, false)
		precDropValueInfo(g, y)
		return true
	}
	// y must keep its name: the producer of x writes y instead.
	if precIsOutput(g, x) || precIsInput(g, x) {
		return false
	}
	for _, p := range g.GetNode() {
		for i, o := range p.GetOutput() {
			if o == x && p != n {
				p.Output[i] = y
				precRenameUses(g, x, y, false)
				precDropValueInfo(g, x)
				return true
			}
		}
	}
	return false // x is an initializer or an outer-scope value
}

func precIsOutput(g *onnxpb.GraphProto, name string) bool {
	for _, o := range g.GetOutput() {
		if o.GetName() == name {
			return true
		}
	}
	return false
}

func precIsInput(g *onnxpb.GraphProto, name string) bool {
	for _, o := range g.GetInput() {
		if o.GetName() == name {
			return true
		}
	}
	return false
}

func precDropValueInfo(g *onnxpb.GraphProto, name string) {
	vi := g.GetValueInfo()[:0]
	for _, v := range g.GetValueInfo() {
		if v.GetName() != name {
			vi = append(vi, v)
		}
	}
	g.ValueInfo = vi
}

// renameUses makes every node of g (and of the subgraphs that do not
// define old themselves) read new where it read old; with outputs, the
// graph's own outputs are renamed too (a subgraph output may name an outer
// value directly).
func precRenameUses(g *onnxpb.GraphProto, old, new string, outputs bool) {
	for _, n := range g.GetNode() {
		for i, in := range n.GetInput() {
			if in == old {
				n.Input[i] = new
			}
		}
		for _, a := range n.GetAttribute() {
			for _, sub := range precSubgraphs(a) {
				if !precDefines(sub, old) {
					precRenameUses(sub, old, new, true)
				}
			}
		}
	}
	if outputs {
		for _, o := range g.GetOutput() {
			if o.GetName() == old {
				o.Name = proto.String(new)
			}
		}
	}
}

func precDefines(g *onnxpb.GraphProto, name string) bool {
	if precIsInput(g, name) {
		return true
	}
	for _, t := range g.GetInitializer() {
		if t.GetName() == name {
			return true
		}
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			if o == name {
				return true
			}
		}
	}
	return false
}

// halfLeft lists where m still holds a half type: tensors, declared
// types, and element-type attributes, in every graph and function.
func halfLeft(m *onnx.Model) []string {
	var left []string
	_ = m.Tensors(func(t *onnxpb.TensorProto) error {
		if precHalf(onnx.DataType(t.GetDataType())) {
			left = append(left, fmt.Sprintf("tensor %q", t.GetName()))
		}
		return nil
	})
	checkNodes := func(ns []*onnxpb.NodeProto) {
		for _, n := range ns {
			for _, a := range n.GetAttribute() {
				if halfDtypeAttrs[a.GetName()] && a.GetType() == onnxpb.AttributeProto_INT && precHalf(onnx.DataType(a.GetI())) {
					left = append(left, fmt.Sprintf("attribute %s of node %s", a.GetName(), precNodeName(n)))
				}
			}
		}
	}
	onnx.WalkGraphs(m.Graph(), func(g *onnxpb.GraphProto) {
		for _, vs := range [][]*onnxpb.ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
			for _, v := range vs {
				if raiseType(proto.Clone(v.GetType()).(*onnxpb.TypeProto)) {
					left = append(left, fmt.Sprintf("value %q of graph %s", v.GetName(), g.GetName()))
				}
			}
		}
		checkNodes(g.GetNode())
	})
	for _, f := range m.Proto.GetFunctions() {
		checkNodes(f.GetNode())
	}
	return left
}

// nodeName names a node for messages: its name, or "Op(first output)".
func precNodeName(n *onnxpb.NodeProto) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	out := ""
	if len(n.GetOutput()) > 0 {
		out = n.GetOutput()[0]
	}
	return fmt.Sprintf("%s(%s)", n.GetOpType(), out)
}

func precLimit(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("(%d more)", len(s)-n))
	}
	return s
}
