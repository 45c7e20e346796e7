package calibrate

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// ErrNothingToQuantize is returned for a model without an operator the Q/DQ
// model quantizes.
var ErrNothingToQuantize = errors.New("quantizing: the model has no Conv, ConvTranspose, Gemm, MatMul or residual Add with float inputs to quantize")

// QuantizeOptions configure Quantize.
type QuantizeOptions struct {
	// Exclude lists nodes (by name or by first output) and op types that
	// stay in fp32: their inputs get no Q/DQ.
	Exclude []string
}

// QuantizedWeight is one weight the Q/DQ model stores as int8.
type QuantizedWeight struct {
	Tensor string `json:"tensor"`
	Node   string `json:"node"`
	// Axis is the per-channel axis, -1 for one scale for the whole tensor.
	Axis     int `json:"axis"`
	Channels int `json:"channels"`
}

// Note says what Quantize did not do as asked for a tensor, and why.
type Note struct {
	Node   string `json:"node,omitempty"`
	Tensor string `json:"tensor,omitempty"`
	Text   string `json:"text"`
}

// Quantized is an explicitly quantized (Q/DQ) model and what was quantized.
type Quantized struct {
	Model *onnx.Model `json:"-"`
	// Activations are the tensors quantized per tensor, in graph order.
	Activations []string `json:"activations"`
	// Weights are the initializer weights stored as int8.
	Weights []QuantizedWeight `json:"weights"`
	// Layers are the nodes whose inputs are quantized, in graph order.
	Layers []Layer `json:"layers"`
	// Excluded are the weighted or Add nodes kept in fp32 because of
	// QuantizeOptions.Exclude.
	Excluded []Layer `json:"excluded,omitempty"`
	// Opset is the default-domain opset of the result.
	Opset int64 `json:"opset"`
	// Notes record choices made for particular tensors.
	Notes []Note `json:"notes,omitempty"`

	readers map[string]string // activation -> a node reading it quantized
}

// Layer names a node: its name (which may be empty), operator and first
// output, which is unique even when node names are not.
type Layer struct {
	Node   string `json:"node,omitempty"`
	Op     string `json:"op"`
	Output string `json:"output"`
}

func layerOf(n *onnxpb.NodeProto) Layer {
	l := Layer{Node: n.GetName(), Op: n.GetOpType()}
	if len(n.GetOutput()) > 0 {
		l.Output = n.GetOutput()[0]
	}
	return l
}

// nodeName is a node's name, or its operator and first output when unnamed.
func nodeName(n *onnxpb.NodeProto) string {
	if n == nil {
		return ""
	}
	if n.GetName() != "" {
		return n.GetName()
	}
	l := layerOf(n)
	return l.Op + "->" + l.Output
}

// weightAxis returns the per-channel axis of a weight of the given rank for
// input i of n, or -1 when the input is not a weight with a channel axis
// (reference/formats.md §3.3: Conv 0, ConvTranspose 1, Gemm B 1 when transB=0
// else 0, MatMul constant B [..,K,N] its last axis).
func weightAxis(n *onnxpb.NodeProto, i, rank int) int {
	if i != 1 {
		return -1
	}
	switch n.GetOpType() {
	case "Conv":
		if rank >= 3 {
			return 0
		}
	case "ConvTranspose":
		if rank >= 3 {
			return 1
		}
	case "Gemm":
		if rank == 2 {
			if intAttr(n, "transB", 0) == 0 {
				return 1
			}
			return 0
		}
	case "MatMul":
		if rank >= 2 {
			return rank - 1
		}
	}
	return -1
}

func intAttr(n *onnxpb.NodeProto, name string, def int64) int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetI()
		}
	}
	return def
}

// weighted are the operators whose activation and weight inputs are quantized.
var weighted = map[string]bool{"Conv": true, "ConvTranspose": true, "Gemm": true, "MatMul": true}

// Quantize writes the explicitly quantized form of m from the ranges r, as
// TensorRT recommends (reference/formats.md §3): symmetric int8 with an
// int8 zero point of 0 on every Q/DQ; the activation inputs of Conv,
// ConvTranspose, Gemm and MatMul quantized per tensor; their initializer
// weights stored as int8 with per-channel scales max|w|/127 on the output
// channel axis, followed by a DequantizeLinear; biases left in fp32; for a
// residual Add or Sum, only the skip input (the one not computed by a
// Conv) quantized; one Q/DQ pair per tensor shared by all its quantized
// consumers. Weights computed by nodes (not initializers) are quantized per
// tensor from their calibrated range like activations, and a Note says so.
// The opset is raised to 13 (per-channel scales need it) when the model's
// operators allow it, rewriting Dropout to Identity and Softmax, LogSoftmax
// and Hardmax of opsets before 13 to their 2-D form; when they do not,
// weights fall back to one scale per tensor at opset 11 and a Note says so.
// m is not modified.
func Quantize(m *onnx.Model, r Ranges, opts QuantizeOptions) (*Quantized, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("quantizing: %w", err)
	}
	cp := &onnx.Model{Proto: proto.Clone(m.Proto).(*onnxpb.ModelProto)}
	g := cp.Graph()
	if g == nil {
		return nil, fmt.Errorf("quantizing: the model has no graph")
	}
	qz := newQuantizer(cp, r, opts)
	qz.findSites()
	if len(qz.acts) == 0 && len(qz.weights) == 0 {
		return nil, ErrNothingToQuantize
	}
	if err := qz.raiseOpset(); err != nil {
		return nil, fmt.Errorf("quantizing: %w", err)
	}
	names := newNamer(g)
	if err := qz.insertActivations(names); err != nil {
		return nil, fmt.Errorf("quantizing: %w", err)
	}
	if err := qz.insertWeights(names); err != nil {
		return nil, err
	}
	if err := qz.finish(); err != nil {
		return nil, fmt.Errorf("quantizing: %w", err)
	}
	return qz.q, nil
}

// QDQTensors lists the activations the Q/DQ model of m quantizes (see
// Quantize) when every tensor has a calibrated range, in the order first
// read: the placement Quantize follows (quantizer.findSites), decided on
// the graph alone. Calibration observes these tensors by default (see
// ScopeQDQ). m is not modified.
func QDQTensors(m *onnx.Model, opts QuantizeOptions) []string {
	if m.Graph() == nil {
		return nil
	}
	qz := newQuantizer(m, Ranges{}, opts)
	qz.placing = true
	qz.findSites()
	return qz.actOrder
}

// quantizer carries one Quantize call from finding what to quantize to the
// rewritten graph: the sites are all found before the graph changes, so
// that every decision is made on the original graph.
type quantizer struct {
	q      *Quantized
	g      *onnxpb.GraphProto
	ix     *onnx.Index
	scales map[string]float64 // calibrated scale per tensor
	excl   map[string]bool    // QuantizeOptions.Exclude

	// acts are the quantized activations and the inputs that read each,
	// actOrder the activations in the order first read.
	acts     map[string][]actSite
	actOrder []string
	weights  []weightSite
	// used are the nodes with a quantized input (Quantized.Layers).
	used map[*onnxpb.NodeProto]bool
	// placing says that only the placement is asked (QDQTensors): every
	// activation site is taken, with or without a calibrated range.
	placing bool
}

// actSite is an input of a node that reads an activation quantized.
type actSite struct {
	node *onnxpb.NodeProto
	in   int
}

// weightSite is a node whose weight initializer is stored as int8, with
// its per-channel axis (-1: one scale).
type weightSite struct {
	node *onnxpb.NodeProto
	axis int
	init *onnxpb.TensorProto
}

// newQuantizer indexes the copy cp, its scales and exclusions once: every
// step looks nodes and tensors up by name.
func newQuantizer(cp *onnx.Model, r Ranges, opts QuantizeOptions) *quantizer {
	g := cp.Graph()
	qz := &quantizer{
		q: &Quantized{Model: cp, readers: map[string]string{}}, g: g, ix: onnx.NewIndex(g),
		scales: map[string]float64{}, excl: map[string]bool{},
		acts: map[string][]actSite{}, used: map[*onnxpb.NodeProto]bool{},
	}
	for _, t := range r.Tensors {
		qz.scales[t.Tensor] = t.Scale
	}
	for _, e := range opts.Exclude {
		qz.excl[e] = true
	}
	return qz
}

// findSites walks the nodes in graph order and records what each
// quantizes: the inputs of weighted nodes (see weighted) and the skip input
// of residual Adds (see skipInput). Excluded nodes are recorded as such.
func (qz *quantizer) findSites() {
	for _, n := range qz.g.GetNode() {
		op := n.GetOpType()
		if qz.excluded(n) {
			if weighted[op] || op == "Add" || op == "Sum" {
				qz.q.Excluded = append(qz.q.Excluded, layerOf(n))
			}
			continue
		}
		ins := n.GetInput()
		switch {
		case weighted[op] && len(ins) >= 2:
			qz.weightedSites(n)
		case (op == "Add" || op == "Sum") && len(ins) == 2:
			if skip := skipInput(n, qz.ix); skip >= 0 {
				qz.wantAct(n, skip)
			}
		}
	}
}

// excluded tells whether QuantizeOptions.Exclude names n's op type, name or
// first output.
func (qz *quantizer) excluded(n *onnxpb.NodeProto) bool {
	return qz.excl[n.GetOpType()] || n.GetName() != "" && qz.excl[n.GetName()] || len(n.GetOutput()) > 0 && qz.excl[n.GetOutput()[0]]
}

// weightedSites records the inputs of a Conv, ConvTranspose, Gemm or
// MatMul: its computed first input as an activation, and its weight as an
// int8 initializer when it is a float32 constant, or else, when computed,
// as an activation with a Note (it gets no per-channel scales).
func (qz *quantizer) weightedSites(n *onnxpb.NodeProto) {
	ins, op := n.GetInput(), n.GetOpType()
	if _, isInit := qz.ix.Initializers[ins[0]]; !isInit && ins[0] != "" {
		qz.wantAct(n, 0)
	}
	w := ins[1]
	init, isInit := qz.ix.Initializers[w]
	_, isInput := qz.ix.Inputs[w]
	switch {
	case isInit && !isInput && onnx.DataType(init.GetDataType()) == onnx.Float:
		qz.weights = append(qz.weights, weightSite{n, weightAxis(n, 1, len(init.GetDims())), init})
		qz.used[n] = true
	case isInit:
		qz.q.Notes = append(qz.q.Notes, Note{Node: nodeName(n), Tensor: w, Text: "weight is not a float32 constant: left as it is"})
	default:
		if p := qz.ix.Producer[w]; p != nil && (op == "Conv" || op == "ConvTranspose") {
			qz.q.Notes = append(qz.q.Notes, Note{Node: nodeName(n), Tensor: w,
				Text: fmt.Sprintf("weight is computed by %s node %q, not an initializer: quantized per tensor from its calibrated range (fold constants first for per-channel weights)", p.GetOpType(), nodeName(p))})
		}
		qz.wantAct(n, 1)
	}
}

// wantAct records input i of n as a quantized activation, or a Note when
// the tensor has no calibrated range.
func (qz *quantizer) wantAct(n *onnxpb.NodeProto, i int) {
	t := n.GetInput()[i]
	if _, ok := qz.scales[t]; !ok && !qz.placing {
		qz.q.Notes = append(qz.q.Notes, Note{Node: nodeName(n), Tensor: t, Text: "no calibrated range: input left in fp32"})
		return
	}
	if _, seen := qz.acts[t]; !seen {
		qz.actOrder = append(qz.actOrder, t)
		qz.q.readers[t] = nodeName(n)
	}
	qz.acts[t] = append(qz.acts[t], actSite{n, i})
	qz.used[n] = true
}

// raiseOpset raises the copy to opset 13 even without per-channel scales:
// ONNX Runtime's QDQ optimizers insert operators (Round) that opset 10
// lacks. Where the model's operators do not allow 13, weights fall back to
// one scale per tensor at opset 11, and a Note says so.
func (qz *quantizer) raiseOpset() error {
	opset, err := raiseOpset(qz.q.Model, 13)
	if err != nil {
		qz.q.Notes = append(qz.q.Notes, Note{Text: fmt.Sprintf("the Q/DQ model stays below opset 13 (%v): weights use one scale per tensor", err)})
		for i := range qz.weights {
			qz.weights[i].axis = -1
		}
		opset, err = raiseOpset(qz.q.Model, 11)
	}
	if err != nil {
		return err
	}
	qz.q.Opset = opset
	return nil
}

// insertActivations adds one QuantizeLinear/DequantizeLinear pair per
// activation, shared by every input that reads it quantized.
func (qz *quantizer) insertActivations(names namer) error {
	g := qz.g
	for _, t := range qz.actOrder {
		s := float32(qz.scales[t])
		if !(s > 0) || math.IsInf(float64(s), 0) {
			return fmt.Errorf("tensor %q: scale %v is not a positive float32", t, qz.scales[t])
		}
		scale := names.init(g, t+"_scale", nil, []float32{s})
		zp := names.init(g, t+"_zero_point", nil, []int8{0})
		qo := names.value(t + "_quantized")
		dqo := names.value(t + "_dequantized")
		g.Node = append(g.Node,
			qdqNode("QuantizeLinear", names.value(t+"_QuantizeLinear"), []string{t, scale, zp}, qo, -1),
			qdqNode("DequantizeLinear", names.value(t+"_DequantizeLinear"), []string{qo, scale, zp}, dqo, -1))
		for _, s := range qz.acts[t] {
			s.node.Input[s.in] = dqo
		}
		qz.q.Activations = append(qz.q.Activations, t)
	}
	return nil
}

// insertWeights stores each weight as an int8 initializer followed by a
// DequantizeLinear, once per initializer and axis however many nodes read it.
func (qz *quantizer) insertWeights(names namer) error {
	g := qz.g
	done := map[string]string{} // weight initializer and axis -> dequantized value
	for _, w := range qz.weights {
		name := w.init.GetName()
		key := fmt.Sprintf("%s@%d", name, w.axis)
		dqo, ok := done[key]
		if !ok {
			qw, sc, err := quantizeWeight(w.init, w.axis)
			if err != nil {
				return fmt.Errorf("quantizing weight %q of node %q: %w", name, nodeName(w.node), err)
			}
			var dims []int64
			if w.axis >= 0 {
				dims = []int64{int64(len(sc))}
			}
			scale := names.init(g, name+"_scale", dims, sc)
			zp := names.init(g, name+"_zero_point", dims, make([]int8, len(sc)))
			qname := names.init(g, name+"_quantized", w.init.GetDims(), qw)
			dqo = names.value(name + "_dequantized")
			g.Node = append(g.Node, qdqNode("DequantizeLinear", names.value(name+"_DequantizeLinear"), []string{qname, scale, zp}, dqo, w.axis))
			done[key] = dqo
			qz.q.Weights = append(qz.q.Weights, QuantizedWeight{Tensor: name, Node: nodeName(w.node), Axis: w.axis, Channels: len(sc)})
		}
		w.node.Input[1] = dqo
	}
	return nil
}

// finish drops the fp32 weights nothing reads any more, puts the appended
// Q/DQ nodes in graph order, and lists the quantized layers in that order.
func (qz *quantizer) finish() error {
	dropUnused(qz.g)
	nodes, err := onnx.TopoSort(qz.g)
	if err != nil {
		return err
	}
	qz.g.Node = nodes
	for _, n := range qz.g.GetNode() {
		if qz.used[n] {
			qz.q.Layers = append(qz.q.Layers, layerOf(n))
		}
	}
	return nil
}

// skipInput returns the input of a two-input Add or Sum that is the skip
// connection of a residual block: both inputs are computed (not constants)
// and exactly the other one comes from a Conv or ConvTranspose, directly or
// through BatchNormalization, so that TensorRT can fuse Conv+Add. When both
// come from convolutions (a projection shortcut) the second input is the
// skip. It returns -1 for other additions.
func skipInput(n *onnxpb.NodeProto, ix *onnx.Index) int {
	ins := n.GetInput()
	fromConv := [2]bool{}
	for i := range 2 {
		t := ins[i]
		if _, ok := ix.Initializers[t]; ok {
			return -1
		}
		p := ix.Producer[t]
		if p == nil {
			if _, ok := ix.Inputs[t]; !ok {
				return -1
			}
			continue
		}
		switch p.GetOpType() {
		case "Constant", "ConstantOfShape":
			return -1
		}
		for hops := 0; p != nil && hops < 3; hops++ {
			if op := p.GetOpType(); op == "Conv" || op == "ConvTranspose" {
				fromConv[i] = len(ix.Consumers[t]) == 1
				break
			} else if op != "BatchNormalization" {
				break
			}
			t = p.GetInput()[0]
			p = ix.Producer[t]
		}
	}
	switch {
	case fromConv[0]:
		return 1
	case fromConv[1]:
		return 0
	}
	return -1
}

// quantizeWeight quantizes w with symmetric int8 scales max|w|/127 per
// channel of axis (axis -1: one scale), values rounded half to even and
// clipped to [-127, 127]. An all-zero channel gets scale 1, as in ONNX Runtime.
func quantizeWeight(p *onnxpb.TensorProto, axis int) ([]int8, []float32, error) {
	t, err := onnx.Decode(p)
	if err != nil {
		return nil, nil, err
	}
	w, ok := t.Data.([]float32)
	if !ok {
		return nil, nil, fmt.Errorf("element type %s, want float32", t.Type)
	}
	channels, inner := 1, len(w)
	if axis >= 0 {
		channels = int(t.Dims[axis])
		inner = 1
		for _, d := range t.Dims[axis+1:] {
			inner *= int(d)
		}
	}
	ch := func(i int) int { return i / inner % channels }
	amax := make([]float64, channels)
	for i, v := range w {
		if v-v != 0 {
			return nil, nil, fmt.Errorf("value %d is %v", i, v)
		}
		c := ch(i)
		amax[c] = math.Max(amax[c], math.Abs(float64(v)))
	}
	scales := make([]float32, channels)
	for c, a := range amax {
		scales[c] = float32(a / 127)
		if !(scales[c] > 0) {
			scales[c] = 1
		}
	}
	out := make([]int8, len(w))
	for i, v := range w {
		x := math.RoundToEven(float64(v) / float64(scales[ch(i)]))
		out[i] = int8(max(-127, min(127, x)))
	}
	return out, scales, nil
}

func qdqNode(op, name string, inputs []string, output string, axis int) *onnxpb.NodeProto {
	n := &onnxpb.NodeProto{Name: proto.String(name), OpType: proto.String(op), Input: inputs, Output: []string{output}}
	if axis >= 0 {
		t := onnxpb.AttributeProto_INT
		n.Attribute = []*onnxpb.AttributeProto{{Name: proto.String("axis"), Type: &t, I: proto.Int64(int64(axis))}}
	}
	return n
}

// namer hands out value and node names not used in the graph yet, with
// suffixes from _2, and adds initializers under them.
type namer struct{ *onnx.Names }

func newNamer(g *onnxpb.GraphProto) namer { return namer{onnx.NewNames(g, 2)} }

func (n namer) value(base string) string { return n.Fresh(base) }

func (n namer) init(g *onnxpb.GraphProto, base string, dims []int64, data any) string {
	name := n.value(base)
	t, err := onnx.NewTensor(name, dims, data)
	if err == nil {
		var p *onnxpb.TensorProto
		if p, err = onnx.Encode(t, onnx.Raw); err == nil {
			g.Initializer = append(g.Initializer, p)
		}
	}
	if err != nil {
		panic(fmt.Sprintf("calibrate: building initializer %s: %v", name, err)) // shapes are ours
	}
	return name
}

// dropUnused removes initializers nothing reads any more (fp32 weights
// replaced by their int8 form).
func dropUnused(g *onnxpb.GraphProto) {
	read := map[string]bool{}
	for _, n := range g.GetNode() {
		for _, in := range onnx.NodeInputs(n) {
			read[in] = true
		}
	}
	for _, o := range g.GetOutput() {
		read[o.GetName()] = true
	}
	inputs := map[string]bool{}
	for _, v := range g.GetInput() {
		inputs[v.GetName()] = true
	}
	g.Initializer = slices.DeleteFunc(g.Initializer, func(t *onnxpb.TensorProto) bool {
		return !read[t.GetName()] && !inputs[t.GetName()]
	})
}
