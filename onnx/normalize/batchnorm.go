package normalize

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// The batchnorm pass folds an inference-form BatchNormalization into the
// Conv, ConvTranspose or Gemm that feeds it:
//
//	s  = scale / sqrt(var + epsilon)          per channel
//	W' = W * s                                per output channel
//	b' = (b - mean) * s + B
//
// Output channels are W's axis 0 for Conv, axis 1 of each group's block
// for ConvTranspose (W is [C_in, M/group, k...]; output channel
// g*(M/group)+j comes from W[c, j] for the input channels c of group g),
// and the columns of Gemm's B (its rows with transB=1); Gemm's C must be a
// scalar or per column, and beta is folded into it. An Add of a
// per-channel constant between the producer and the BatchNormalization
// (how PaddlePaddle exports ConvTranspose's bias) is folded into the bias
// and removed too. Everything is computed
// in float64 and rounded to float32 once. The producer then writes the
// BatchNormalization's output itself, so names downstream do not change.
//
// A BatchNormalization is kept, with the reason, when it is in training
// mode or has its training outputs, when its input is not the only use of
// a Conv/ConvTranspose/Gemm output (a graph output, or read by other
// nodes), or when a parameter or weight is not a float32 initializer of
// its graph (run the constants pass first for Constant-node weights).
// Removing the BatchNormalization also removes the variances a float16
// rewrite would otherwise have to clamp.
func init() { register(50, batchNormPass) }

func batchNormPass(_ context.Context, m *onnx.Model, o Options) (Pass, error) {
	p := Pass{Name: "batchnorm"}
	if o.NoFoldBatchNorm {
		return p, nil
	}
	r := foldBatchNorms(m)
	p.Changed = r.count()
	p.Summary = r.summary()
	return p, nil
}

// bnSkip is a BatchNormalization that was kept, and why.
type bnSkip struct {
	node, reason string
}

// bnResult is what foldBatchNorms did.
type bnResult struct {
	folded  map[string]int // by producer op type
	skipped []bnSkip
}

func (r *bnResult) count() int {
	n := 0
	for _, c := range r.folded {
		n += c
	}
	return n
}

func (r *bnResult) summary() string {
	var into []string
	for _, op := range precSorted(r.folded) {
		into = append(into, fmt.Sprintf("%s (%d)", op, r.folded[op]))
	}
	var parts []string
	switch len(r.folded) {
	case 0:
	case 1:
		parts = append(parts, fmt.Sprintf("folded %d BatchNormalization nodes into %s", r.count(), precSorted(r.folded)[0]))
	default:
		parts = append(parts, fmt.Sprintf("folded %d BatchNormalization nodes into %s", r.count(), strings.Join(into, " and ")))
	}
	if len(r.skipped) > 0 {
		var why []string
		for _, k := range r.skipped {
			why = append(why, k.node+": "+k.reason)
		}
		parts = append(parts, fmt.Sprintf("kept %d (%s)", len(r.skipped), strings.Join(precLimit(why, 3), "; ")))
	}
	if len(parts) == 0 {
		return "no BatchNormalization nodes"
	}
	return strings.Join(parts, "; ")
}

// foldBatchNorms folds what it can in every graph of m, in place.
func foldBatchNorms(m *onnx.Model) *bnResult {
	r := &bnResult{folded: map[string]int{}}
	listInputs := m.Proto.GetIrVersion() < 4
	// One set of names for the whole model: a new initializer in a
	// subgraph must not shadow an outer value the subgraph reads.
	names := onnx.NewNames(m.Graph(), 1)
	onnx.WalkGraphs(m.Graph(), func(g *onnxpb.GraphProto) {
		f := &bnFolder{g: g, names: names, listInputs: listInputs}
		for i := 0; i < len(g.GetNode()); i++ {
			n := g.GetNode()[i]
			if n.GetOpType() != "BatchNormalization" || !isDefaultDomainNode(n) {
				continue
			}
			op, reason := f.fold(n)
			if reason != "" {
				r.skipped = append(r.skipped, bnSkip{precNodeName(n), reason})
				continue
			}
			r.folded[op]++
			i-- // n was removed
		}
		f.dropUnused()
	})
	return r
}

func isDefaultDomainNode(n *onnxpb.NodeProto) bool {
	return n.GetDomain() == "" || n.GetDomain() == "ai.onnx"
}

// bnFolder folds the BatchNormalization nodes of one graph.
type bnFolder struct {
	g          *onnxpb.GraphProto
	names      *onnx.Names
	listInputs bool            // IR < 4: new initializers are also listed as graph inputs
	orphans    map[string]bool // initializers that may have lost their last reader
}

// bnParams are a BatchNormalization's per-channel constants.
type bnParams struct {
	scale, bias, mean, variance []float64
	eps                         float64
}

// fold folds bn into its producer, returning the producer's op type, or
// the reason it did not.
func (f *bnFolder) fold(bn *onnxpb.NodeProto) (string, string) {
	ix := onnx.NewIndex(f.g)
	if a := precAttr(bn, "training_mode"); a != nil && a.GetI() != 0 {
		return "", "it is in training mode"
	}
	if a := precAttr(bn, "spatial"); a != nil && a.GetI() == 0 {
		return "", "spatial=0 (per-activation statistics)"
	}
	if len(bn.GetInput()) != 5 || len(bn.GetOutput()) == 0 {
		return "", fmt.Sprintf("it has %d inputs and %d outputs, not 5 and 1", len(bn.GetInput()), len(bn.GetOutput()))
	}
	for _, o := range bn.GetOutput()[1:] {
		if o != "" {
			return "", "it has training outputs (running mean and variance)"
		}
	}
	ch, reason := producerChain(bn.GetInput()[0], ix)
	if reason != "" {
		return "", reason
	}
	bp, reason := f.params(bn, ix)
	if reason != "" {
		return "", reason
	}
	if ch.add != nil {
		rank := 2 // Gemm
		if w := ix.Initializers[ch.p.GetInput()[1]]; ch.p.GetOpType() != "Gemm" && w != nil {
			rank = len(w.GetDims())
		}
		if ch.extra, reason = channelConstant(ix, ch.addConst, len(bp.scale), rank); reason != "" {
			return "", fmt.Sprintf("Add %s between %s and it: %s", precNodeName(ch.add), ch.p.GetOpType(), reason)
		}
	}
	switch ch.p.GetOpType() {
	case "Gemm":
		reason = f.foldGemm(ch.p, bp, ch.extra, ix)
	default:
		reason = f.foldConv(ch.p, bp, ch.extra, ix)
	}
	if reason != "" {
		return "", reason
	}
	f.rewire(ch.p, bn, ch.add)
	return ch.p.GetOpType(), ""
}

// bnChain is what a BatchNormalization folds into: a Conv, ConvTranspose
// or Gemm p and, between them, an optional Add of a per-channel constant
// (PaddlePaddle exports ConvTranspose's bias so).
type bnChain struct {
	p, add   *onnxpb.NodeProto
	addConst string    // the Add's constant input
	extra    []float64 // its values per channel
}

var bnProducers = precSet("Conv", "ConvTranspose", "Gemm")

// producerChain finds the node chain computing x, or says why there is
// none to fold into.
func producerChain(x string, ix *onnx.Index) (*bnChain, string) {
	ch := &bnChain{}
	for hop := 0; ; hop++ {
		p := ix.Producer[x]
		switch {
		case p == nil:
			return nil, fmt.Sprintf("its input %q is not computed by a node of its graph", x)
		case !isDefaultDomainNode(p) || !(bnProducers[p.GetOpType()] || hop == 0 && p.GetOpType() == "Add"):
			return nil, fmt.Sprintf("its input comes from %s %s, not Conv, ConvTranspose or Gemm", p.GetOpType(), precNodeName(p))
		case ix.Outputs[x]:
			return nil, fmt.Sprintf("the %s output %q is also a graph output", p.GetOpType(), x)
		case len(ix.Consumers[x]) != 1:
			return nil, fmt.Sprintf("the %s output %q has %d readers", p.GetOpType(), x, len(ix.Consumers[x]))
		case len(p.GetInput()) < 2 || len(p.GetOutput()) != 1:
			return nil, fmt.Sprintf("%s %s has %d inputs and %d outputs", p.GetOpType(), precNodeName(p), len(p.GetInput()), len(p.GetOutput()))
		}
		if p.GetOpType() != "Add" {
			ch.p = p
			return ch, ""
		}
		a, b := p.GetInput()[0], p.GetInput()[1]
		if ix.Initializers[a] != nil {
			a, b = b, a
		}
		if ix.Initializers[b] == nil {
			return nil, fmt.Sprintf("its input comes from Add %s, which adds no constant", precNodeName(p))
		}
		ch.add, ch.addConst, x = p, b, a
	}
}

// channelConstant reads a constant added to a Conv-like output of the
// given rank: one value per channel, lined up with axis 1 by
// broadcasting ([1,C,1,1] or [C,1,1] for a 4-D output, [C] or [1,C] for
// Gemm's 2-D one).
func channelConstant(ix *onnx.Index, name string, c, rank int) ([]float64, string) {
	v, t, reason := floatInit(ix, name, "the constant")
	if reason != "" {
		return nil, reason
	}
	dims := t.GetDims()
	for len(dims) > rank-1 && len(dims) > 0 && dims[0] == 1 {
		dims = dims[1:] // leading ones do not change the broadcast
	}
	ok := len(v) == c && len(dims) == rank-1 && rank >= 2 && dims[0] == int64(c)
	for _, d := range dims[min(1, len(dims)):] {
		ok = ok && d == 1
	}
	if !ok {
		return nil, fmt.Sprintf("%q of shape %v is not one value per channel of a rank-%d output", name, t.GetDims(), rank)
	}
	return v, ""
}

// params reads bn's scale, B, mean and var, and checks them.
func (f *bnFolder) params(bn *onnxpb.NodeProto, ix *onnx.Index) (*bnParams, string) {
	bp := &bnParams{eps: 1e-5}
	if a := precAttr(bn, "epsilon"); a != nil {
		bp.eps = float64(a.GetF())
	}
	dst := []*[]float64{&bp.scale, &bp.bias, &bp.mean, &bp.variance}
	what := []string{"scale", "B", "mean", "var"}
	for i, d := range dst {
		v, _, reason := floatInit(ix, bn.GetInput()[i+1], what[i])
		if reason != "" {
			return nil, reason
		}
		if len(v) != len(bp.scale) && i > 0 {
			return nil, fmt.Sprintf("%s has %d values and scale %d", what[i], len(v), len(bp.scale))
		}
		*d = v
	}
	for c, v := range bp.variance {
		if !(v+bp.eps > 0) || math.IsInf(v, 0) {
			return nil, fmt.Sprintf("var+epsilon of channel %d is %g", c, v+bp.eps)
		}
	}
	return bp, ""
}

// floatInit decodes the float32 initializer name as float64s, or says why
// it cannot.
func floatInit(ix *onnx.Index, name, what string) ([]float64, *onnxpb.TensorProto, string) {
	t := ix.Initializers[name]
	if t == nil {
		return nil, nil, fmt.Sprintf("%s %q is not an initializer of its graph", what, name)
	}
	if dt := onnx.DataType(t.GetDataType()); dt != onnx.Float {
		return nil, nil, fmt.Sprintf("%s %q is %s, not float32", what, name, dt)
	}
	d, err := onnx.Decode(t)
	if err != nil {
		return nil, nil, fmt.Sprintf("%s %q cannot be read: %v", what, name, err)
	}
	v, err := d.Float64s()
	if err != nil {
		return nil, nil, fmt.Sprintf("%s %q cannot be read: %v", what, name, err)
	}
	return v, t, ""
}

// scaleFactors returns s = scale/sqrt(var+eps) per channel.
func (bp *bnParams) scaleFactors() []float64 {
	s := make([]float64, len(bp.scale))
	for c := range s {
		s[c] = bp.scale[c] / math.Sqrt(bp.variance[c]+bp.eps)
	}
	return s
}

// foldedBias is (b - mean) * s + B, b nil meaning zero.
func (bp *bnParams) foldedBias(b, s []float64) []float32 {
	out := make([]float32, len(s))
	for c := range s {
		bc := 0.0
		if b != nil {
			bc = b[c]
		}
		out[c] = float32((bc-bp.mean[c])*s[c] + bp.bias[c])
	}
	return out
}

// foldConv folds into a Conv or ConvTranspose.
func (f *bnFolder) foldConv(p *onnxpb.NodeProto, bp *bnParams, extra []float64, ix *onnx.Index) string {
	w, wt, reason := floatInit(ix, p.GetInput()[1], "weight")
	if reason != "" {
		return reason
	}
	dims := wt.GetDims()
	c := int64(len(bp.scale))
	if len(dims) < 2 || slices.Min(dims) < 1 {
		return fmt.Sprintf("weight %q has shape %v", wt.GetName(), dims)
	}
	group := int64(1)
	if a := precAttr(p, "group"); a != nil {
		group = a.GetI()
	}
	// channel maps an element index of W to its output channel.
	var channel func(i int) int
	per := int64(len(w)) / dims[0] // elements per row of axis 0
	if p.GetOpType() == "Conv" {
		if dims[0] != c {
			return fmt.Sprintf("weight %q has %d output channels and the BatchNormalization %d", wt.GetName(), dims[0], c)
		}
		channel = func(i int) int { return i / int(per) }
	} else {
		if group < 1 || dims[0]%group != 0 || dims[1]*group != c {
			return fmt.Sprintf("weight %q %v with group %d does not give %d output channels", wt.GetName(), dims, group, c)
		}
		inPerGroup, outPerGroup, k := dims[0]/group, dims[1], per/dims[1]
		channel = func(i int) int {
			ci, j := int64(i)/per, (int64(i)%per)/k
			return int((ci/inPerGroup)*outPerGroup + j)
		}
	}
	var b []float64
	if len(p.GetInput()) > 2 && p.GetInput()[2] != "" {
		if b, _, reason = floatInit(ix, p.GetInput()[2], "bias"); reason != "" {
			return reason
		}
		if len(b) != int(c) {
			return fmt.Sprintf("bias %q has %d values, not %d", p.GetInput()[2], len(b), c)
		}
	}
	b = addBias(b, extra)
	s := bp.scaleFactors()
	nw := make([]float32, len(w))
	for i, v := range w {
		nw[i] = float32(v * s[channel(i)])
	}
	f.setInput(p, 1, wt.GetName(), dims, nw, ix)
	f.setInput(p, 2, "", []int64{c}, bp.foldedBias(b, s), ix)
	return ""
}

// foldGemm folds into a Gemm whose output columns are the channels.
func (f *bnFolder) foldGemm(p *onnxpb.NodeProto, bp *bnParams, extra []float64, ix *onnx.Index) string {
	w, wt, reason := floatInit(ix, p.GetInput()[1], "weight")
	if reason != "" {
		return reason
	}
	dims := wt.GetDims()
	transB := false
	if a := precAttr(p, "transB"); a != nil {
		transB = a.GetI() != 0
	}
	c := len(bp.scale)
	if len(dims) != 2 || (transB && dims[0] != int64(c)) || (!transB && dims[1] != int64(c)) {
		return fmt.Sprintf("weight %q %v (transB=%v) does not have %d output columns", wt.GetName(), dims, transB, c)
	}
	b, reason := gemmBias(p, ix, c)
	if reason != "" {
		return reason
	}
	b = addBias(b, extra)
	s := bp.scaleFactors()
	nw := make([]float32, len(w))
	for i, v := range w {
		col := i % c
		if transB {
			col = i / int(dims[1])
		}
		nw[i] = float32(v * s[col])
	}
	f.setInput(p, 1, wt.GetName(), dims, nw, ix)
	f.setInput(p, 2, "", []int64{int64(c)}, bp.foldedBias(b, s), ix)
	if a := precAttr(p, "beta"); a != nil {
		a.F = proto.Float32(1)
	}
	if a := precAttr(p, "broadcast"); a != nil { // opset < 7: C is now [N]
		a.I = proto.Int64(1)
	}
	return ""
}

// addBias returns b + extra (either may be nil, meaning zero).
func addBias(b, extra []float64) []float64 {
	if extra == nil {
		return b
	}
	out := make([]float64, len(extra))
	for i, v := range extra {
		out[i] = v
		if b != nil {
			out[i] += b[i]
		}
	}
	return out
}

// gemmBias is beta*C per output column (nil without C).
func gemmBias(p *onnxpb.NodeProto, ix *onnx.Index, c int) ([]float64, string) {
	if len(p.GetInput()) < 3 || p.GetInput()[2] == "" {
		return nil, ""
	}
	v, t, reason := floatInit(ix, p.GetInput()[2], "C")
	if reason != "" {
		return nil, reason
	}
	beta := 1.0
	if a := precAttr(p, "beta"); a != nil {
		beta = float64(a.GetF())
	}
	dims := t.GetDims()
	scalar := len(v) == 1 && (len(dims) == 0 || dims[len(dims)-1] == 1)
	column := len(v) == c && len(dims) >= 1 && dims[len(dims)-1] == int64(c)
	if !scalar && !column {
		return nil, fmt.Sprintf("C %q of shape %v is not a scalar or one value per column", t.GetName(), dims)
	}
	b := make([]float64, c)
	for i := range b {
		b[i] = beta * v[i%len(v)]
	}
	return b, ""
}

// setInput makes input i of p a float32 initializer holding data: the
// initializer it reads is rewritten in place when p is its only reader,
// otherwise a new one is added (base names it when p has no input i yet).
func (f *bnFolder) setInput(p *onnxpb.NodeProto, i int, base string, dims []int64, data []float32, ix *onnx.Index) {
	if i < len(p.GetInput()) && p.GetInput()[i] != "" {
		name := p.GetInput()[i]
		if t := ix.Initializers[name]; t != nil && len(ix.Consumers[name]) == 1 && ix.Inputs[name] == nil {
			setFloats(t, dims, data)
			return
		}
		f.orphan(name)
		base = name
	}
	if base == "" {
		base = p.GetOutput()[0] + "_bias"
	}
	name := f.names.Fresh(base + "_bn")
	t := &onnxpb.TensorProto{Name: proto.String(name)}
	setFloats(t, dims, data)
	f.g.Initializer = append(f.g.Initializer, t)
	if f.listInputs {
		f.g.Input = append(f.g.Input, onnx.TensorType(name, onnx.Float, onnx.Shape{Ranked: true, Dims: dimsOf(dims)}))
	}
	for len(p.Input) <= i {
		p.Input = append(p.Input, "")
	}
	p.Input[i] = name
}

func dimsOf(d []int64) []onnx.Dim {
	out := make([]onnx.Dim, len(d))
	for i, v := range d {
		out[i] = onnx.Dim{Value: v, Known: true}
	}
	return out
}

// setFloats stores data in t as float32 raw data.
func setFloats(t *onnxpb.TensorProto, dims []int64, data []float32) {
	t.Dims = append([]int64(nil), dims...)
	t.DataType = proto.Int32(int32(onnx.Float))
	t.RawData = onnx.RawBytes(&onnx.Tensor{Type: onnx.Float, Dims: dims, Data: data})
	t.FloatData, t.Int32Data, t.ExternalData, t.DataLocation = nil, nil, nil, nil
}

func (f *bnFolder) orphan(name string) {
	if f.orphans == nil {
		f.orphans = map[string]bool{}
	}
	f.orphans[name] = true
}

// rewire makes p write bn's output and removes bn and the Add between
// them (nil when none).
func (f *bnFolder) rewire(p, bn, add *onnxpb.NodeProto) {
	precDropValueInfo(f.g, p.GetOutput()[0])
	p.Output[0] = bn.GetOutput()[0]
	for _, in := range bn.GetInput()[1:] {
		f.orphan(in)
	}
	if add != nil {
		precDropValueInfo(f.g, add.GetOutput()[0])
		for _, in := range add.GetInput() {
			f.orphan(in)
		}
	}
	keep := f.g.GetNode()[:0]
	for _, n := range f.g.GetNode() {
		if n != bn && n != add {
			keep = append(keep, n)
		}
	}
	clear(f.g.Node[len(keep):])
	f.g.Node = keep
}

// dropUnused removes the orphaned initializers nothing reads any more
// (and their graph-input entries).
func (f *bnFolder) dropUnused() {
	if len(f.orphans) == 0 {
		return
	}
	ix := onnx.NewIndex(f.g)
	gone := map[string]bool{}
	for name := range f.orphans {
		if len(ix.Consumers[name]) == 0 && !ix.Outputs[name] && ix.Initializers[name] != nil {
			gone[name] = true
		}
	}
	inits := f.g.GetInitializer()[:0]
	for _, t := range f.g.GetInitializer() {
		if !gone[t.GetName()] {
			inits = append(inits, t)
		}
	}
	f.g.Initializer = inits
	ins := f.g.GetInput()[:0]
	for _, v := range f.g.GetInput() {
		if !gone[v.GetName()] {
			ins = append(ins, v)
		}
	}
	f.g.Input = ins
}
