package normalize

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

// MaxOpset is the highest default-domain opset Upgrade raises a model to.
// Opset 18 moved the axes of every Reduce* operator to an input and
// changed Split, Pad and Resize again; kiln's adapters stop before that.
const MaxOpset = 17

func init() { register(60, upgradePass) }

// upgradePass raises the default-domain opset to Options.MinOpset when the
// model's is lower.
func upgradePass(_ context.Context, m *onnx.Model, o Options) (Pass, error) {
	if o.MinOpset == 0 || m.Opset() >= o.MinOpset {
		return Pass{Name: "opset"}, nil
	}
	return upgradeInPlace(m, o.MinOpset)
}

// Upgrade returns a copy of m whose default-domain opset is to, with every
// node whose operator changed signature or meaning on the way rewritten so
// that the model computes exactly what it did (ONNX's Changelog.md; the
// adapters are listed in adapters.go). A node kiln cannot carry across
// (Scan from opset 8, an experimental operator, BatchNormalization with
// spatial=0, a Dropout whose mask is used) is an error naming the node and
// its operator; no silently different model is returned. A model already
// at or above to is returned unchanged (a copy), with Changed 0. m is not
// modified.
func Upgrade(m *onnx.Model, to int64) (*onnx.Model, Pass, error) {
	out := clone(m)
	p, err := upgradeInPlace(out, to)
	if err != nil {
		return nil, Pass{}, err
	}
	return out, p, nil
}

// upgradeInPlace is Upgrade on m itself. Changed is the number of nodes
// rewritten, at least 1 when the opset import was raised.
func upgradeInPlace(m *onnx.Model, to int64) (Pass, error) {
	if to > MaxOpset {
		return Pass{}, fmt.Errorf("upgrading to opset %d: kiln upgrades to at most opset %d", to, MaxOpset)
	}
	from := m.Opset()
	if from >= to {
		return Pass{Name: "opset"}, nil
	}
	u := newUpgrader(m)
	if from == 0 {
		if u.hasDefaultNodes() {
			return Pass{}, fmt.Errorf("upgrading to opset %d: the model uses default-domain operators but does not import the default domain", to)
		}
		return Pass{Name: "opset"}, nil
	}
	for v := from + 1; v <= to; v++ {
		if err := u.step(v); err != nil {
			return Pass{}, fmt.Errorf("upgrading opset %d to %d: %w", from, to, err)
		}
	}
	m.SetOpset("", to)
	if ir := upgIRVersion(to); m.Proto.GetIrVersion() < ir {
		m.Proto.IrVersion = proto.Int64(ir)
	}
	return Pass{
		Name:    "opset",
		Changed: max(len(u.labels), 1),
		Summary: u.summary(from, to),
	}, nil
}

// upgIRVersion is the IR version of the ONNX release that introduced the
// opset (ONNX's Versioning.md table): a model must declare at least it.
func upgIRVersion(opset int64) int64 {
	switch {
	case opset >= 15:
		return 8
	case opset >= 12:
		return 7
	case opset == 11:
		return 6
	case opset == 10:
		return 5
	case opset == 9:
		return 4
	default:
		return 3
	}
}

// upgrader carries what the adapters share while one model is upgraded.
type upgrader struct {
	m     *onnx.Model
	names *onnx.Names
	types *upgTypes
	// labels names the rewrite of each node that was rewritten ("Clip",
	// "Upsample→Resize"); a node that crosses several breaking versions
	// counts once, under its first label unless a later one replaced its
	// operator.
	labels map[*onnxpb.NodeProto]string
	// upscale marks the Resize nodes that were Upsample, whose scales are
	// at least 1.
	upscale map[*onnxpb.NodeProto]bool
	// created marks the nodes the adapters added: later steps adapt them
	// but the summary counts only the model's own nodes.
	created map[*onnxpb.NodeProto]bool
}

func (u *upgrader) label(n *onnxpb.NodeProto, l string) {
	if l == "" || u.created[n] {
		return
	}
	if old, ok := u.labels[n]; ok && (strings.Contains(old, "→") || !strings.Contains(l, "→")) {
		return
	}
	u.labels[n] = l
}

func newUpgrader(m *onnx.Model) *upgrader {
	return &upgrader{
		m:       m,
		names:   onnx.NewNames(m.Graph(), 1),
		types:   upgInferTypes(m.Graph()),
		labels:  map[*onnxpb.NodeProto]string{},
		upscale: map[*onnxpb.NodeProto]bool{},
		created: map[*onnxpb.NodeProto]bool{},
	}
}

func (u *upgrader) hasDefaultNodes() bool {
	found := false
	onnx.WalkGraphs(u.m.Graph(), func(g *onnxpb.GraphProto) {
		for _, n := range g.GetNode() {
			if upgDefaultDomain(n) {
				found = true
			}
		}
	})
	return found
}

func upgDefaultDomain(n *onnxpb.NodeProto) bool {
	d := n.GetDomain()
	return d == "" || d == "ai.onnx"
}

// step applies the adapters of opset v (the version being entered) to
// every default-domain node of every graph. An adapter returns the nodes
// that replace the one it was given, in order; nodes it creates are
// already in opset v's form, so later steps adapt them too.
func (u *upgrader) step(v int64) error {
	var err error
	onnx.WalkGraphs(u.m.Graph(), func(g *onnxpb.GraphProto) {
		if err != nil {
			return
		}
		var out []*onnxpb.NodeProto
		changed := false
		for _, n := range g.GetNode() {
			ad, ok := upgAdapters[upgKey{n.GetOpType(), v}]
			if !ok && v == 6 {
				ad, ok = upgDropAttr("consumed_inputs"), true
			}
			if !ok || !upgDefaultDomain(n) {
				out = append(out, n)
				continue
			}
			op := n.GetOpType()
			repl, label, aerr := ad(u, g, n)
			if aerr != nil {
				err = &upgNodeError{Op: op, Node: upgNodeName(n), Opset: v, Err: aerr}
				return
			}
			if repl == nil {
				out = append(out, n)
				continue
			}
			changed = true
			out = append(out, repl...)
			u.label(n, label)
		}
		if changed {
			g.Node = out
		}
	})
	return err
}

// upgNodeError is a node the upgrade cannot carry across opset Opset.
type upgNodeError struct {
	Op, Node string
	Opset    int64
	Err      error
}

func (e *upgNodeError) Error() string {
	return fmt.Sprintf("%s node %q at opset %d: %v", e.Op, e.Node, e.Opset, e.Err)
}

func (e *upgNodeError) Unwrap() error { return e.Err }

// summary is "upgraded opset 9 to 13 (Clip ×12, Upsample→Resize ×2)".
func (u *upgrader) summary(from, to int64) string {
	s := fmt.Sprintf("upgraded opset %d to %d", from, to)
	counts := map[string]int{}
	for _, l := range u.labels {
		counts[l]++
	}
	if len(counts) == 0 {
		return s
	}
	labels := make([]string, 0, len(counts))
	for l := range counts {
		labels = append(labels, l)
	}
	sort.Slice(labels, func(i, j int) bool {
		if counts[labels[i]] != counts[labels[j]] {
			return counts[labels[i]] > counts[labels[j]]
		}
		return labels[i] < labels[j]
	})
	parts := make([]string, len(labels))
	for i, l := range labels {
		parts[i] = fmt.Sprintf("%s ×%d", l, counts[l])
	}
	return s + " (" + strings.Join(parts, ", ") + ")"
}

func upgNodeName(n *onnxpb.NodeProto) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	if len(n.GetOutput()) > 0 {
		return n.GetOutput()[0]
	}
	return n.GetOpType()
}

// constant adds an initializer holding t to the main graph (subgraphs see
// outer-scope values) under a fresh name built from base, and returns the
// name.
func (u *upgrader) constant(base string, t *onnx.Tensor) (string, error) {
	name := u.names.Fresh(base)
	p, err := onnx.Encode(t, onnx.Raw)
	if err != nil {
		return "", fmt.Errorf("encoding constant %s: %w", name, err)
	}
	p.Name = proto.String(name)
	g := u.m.Graph()
	g.Initializer = append(g.Initializer, p)
	u.types.set(name, t.Type, len(t.Dims))
	return name, nil
}

// ints adds a 1-D int64 initializer.
func (u *upgrader) ints(base string, v []int64) (string, error) {
	return u.constant(base, &onnx.Tensor{Type: onnx.Int64, Dims: []int64{int64(len(v))}, Data: append([]int64(nil), v...)})
}

// scalarOf adds a scalar initializer of element type dt holding f (the
// type of the tensor it will be compared with or padded into).
func (u *upgrader) scalarOf(base string, dt onnx.DataType, f float64) (string, error) {
	t, err := upgScalar(dt, f)
	if err != nil {
		return "", err
	}
	return u.constant(base, t)
}

// node builds a default-domain node with a fresh name.
func (u *upgrader) node(op, base string, in, out []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	n := &onnxpb.NodeProto{
		Name:      proto.String(u.names.Fresh(base)),
		OpType:    proto.String(op),
		Input:     in,
		Output:    out,
		Attribute: attrs,
	}
	u.created[n] = true
	return n
}

// value returns a fresh value name.
func (u *upgrader) value(base string) string { return u.names.Fresh(base) }

func upgAttr(n *onnxpb.NodeProto, name string) *onnxpb.AttributeProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a
		}
	}
	return nil
}

func upgIntAttr(n *onnxpb.NodeProto, name string, def int64) int64 {
	if a := upgAttr(n, name); a != nil {
		return a.GetI()
	}
	return def
}

func upgStringAttr(n *onnxpb.NodeProto, name, def string) string {
	if a := upgAttr(n, name); a != nil {
		return string(a.GetS())
	}
	return def
}

// upgTake removes the named attribute from n and returns it (nil when n
// has none).
func upgTake(n *onnxpb.NodeProto, name string) *onnxpb.AttributeProto {
	for i, a := range n.GetAttribute() {
		if a.GetName() == name {
			n.Attribute = append(n.Attribute[:i:i], n.Attribute[i+1:]...)
			return a
		}
	}
	return nil
}

func upgSetInt(n *onnxpb.NodeProto, name string, v int64) {
	upgTake(n, name)
	n.Attribute = append(n.Attribute, upgIntAttrProto(name, v))
}

func upgSetString(n *onnxpb.NodeProto, name, v string) {
	upgTake(n, name)
	t := onnxpb.AttributeProto_STRING
	n.Attribute = append(n.Attribute, &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, S: []byte(v)})
}

func upgIntAttrProto(name string, v int64) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_INT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, I: proto.Int64(v)}
}

func upgIntsAttrProto(name string, v []int64) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_INTS
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, Ints: v}
}

// upgScalar builds a 0-D tensor of type dt holding f.
func upgScalar(dt onnx.DataType, f float64) (*onnx.Tensor, error) {
	var data any
	switch dt {
	case onnx.Float:
		data = []float32{float32(f)}
	case onnx.Double:
		data = []float64{f}
	case onnx.Float16:
		data = []float16.Float16{float16.Fromfloat32(float32(f))}
	case onnx.BFloat16:
		data = []onnx.BF16{onnx.BF16From(float32(f))}
	case onnx.Int8, onnx.Int16, onnx.Int32, onnx.Int64, onnx.Uint8, onnx.Uint16, onnx.Uint32, onnx.Uint64:
		if f != math.Trunc(f) {
			return nil, fmt.Errorf("value %g does not fit element type %s", f, dt)
		}
		data = upgIntSlice(dt, f)
	default:
		return nil, fmt.Errorf("cannot tell the element type of the data (%s)", dt)
	}
	return &onnx.Tensor{Type: dt, Dims: []int64{}, Data: data}, nil
}

// upgIntSlice clamps f into dt's range (the attribute was a float; the
// input must be of the data's own type).
func upgIntSlice(dt onnx.DataType, f float64) any {
	c := func(lo, hi float64) float64 { return math.Max(lo, math.Min(hi, f)) }
	switch dt {
	case onnx.Int8:
		return []int8{int8(c(math.MinInt8, math.MaxInt8))}
	case onnx.Int16:
		return []int16{int16(c(math.MinInt16, math.MaxInt16))}
	case onnx.Int32:
		return []int32{int32(c(math.MinInt32, math.MaxInt32))}
	case onnx.Int64:
		return []int64{int64(c(math.MinInt64, math.MaxInt64))}
	case onnx.Uint8:
		return []uint8{uint8(c(0, math.MaxUint8))}
	case onnx.Uint16:
		return []uint16{uint16(c(0, math.MaxUint16))}
	case onnx.Uint32:
		return []uint32{uint32(c(0, math.MaxUint32))}
	default:
		return []uint64{uint64(c(0, math.MaxUint64))}
	}
}
