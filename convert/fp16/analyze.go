package fp16

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// The data-aware pass follows NVIDIA ModelOpt's AutoCast (formats.md
// §4.3): run the float32 model on real samples, look at what every float
// tensor of the main graph holds, and keep in float32 the nodes float16
// would break. AutoCast keeps a node whose outputs exceed data_max (512 by
// default) and one whose initializers exceed init_max (65504); kiln also
// looks at the inputs (a float16 producer feeding a float32 node would
// overflow in the Cast between them) and at underflow.

// Float16 limits the analysis measures against.
const (
	// MaxFloat16 is the largest finite float16.
	MaxFloat16 = 65504
	// MinNormalFloat16 is the smallest normal float16, 2^-14: below it a
	// value keeps fewer than 11 significant bits, and below 2^-25 none.
	MinNormalFloat16 = 6.103515625e-05
)

// Defaults of AnalyzeOptions.
const (
	// DefaultMaxActivation leaves a factor 4 (2 bits of exponent) between
	// the largest activation the samples showed and float16's 65504: other
	// inputs go higher than a handful of calibration samples. It is 32
	// times AutoCast's data_max of 512, which keeps far more of a
	// convolutional network in float32 than its accuracy needs.
	DefaultMaxActivation = 16384
	// DefaultMaxUnderflow is the share of the non-zero values of a tensor
	// that may lie below MinNormalFloat16: beyond 10 %, enough of the
	// signal loses precision (or becomes zero) to show in the output.
	DefaultMaxUnderflow = 0.10
	// DefaultMaxWeightUnderflow is the same share for weights, looser
	// because trained weights hold many near-zero values that do not
	// matter (pruned channels, tiny biases): only a tensor that would be
	// mostly flushed counts.
	DefaultMaxWeightUnderflow = 0.5
)

// AnalyzeOptions sets the thresholds of Analyze; zero values take the
// defaults above.
type AnalyzeOptions struct {
	// MaxActivation is the largest magnitude a float input or output of a
	// float16 node may have in the samples.
	MaxActivation float64
	// MaxUnderflow is the largest share of non-zero activation values
	// below MinNormalFloat16.
	MaxUnderflow float64
	// MaxWeight is the largest magnitude of a weight (initializer or
	// Constant) of a float16 node; 0 means MaxFloat16.
	MaxWeight float64
	// MaxWeightUnderflow is the largest share of non-zero weight values
	// below MinNormalFloat16.
	MaxWeightUnderflow float64
	// Session configures the ONNX Runtime session of the reference runs
	// (default: CPU, all optimizations).
	Session ort.SessionOptions
}

func (o AnalyzeOptions) withDefaults() AnalyzeOptions {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.MaxActivation, DefaultMaxActivation)
	def(&o.MaxUnderflow, DefaultMaxUnderflow)
	def(&o.MaxWeight, MaxFloat16)
	def(&o.MaxWeightUnderflow, DefaultMaxWeightUnderflow)
	return o
}

// Validate checks the thresholds.
func (o AnalyzeOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case o.MaxActivation < 0 || o.MaxActivation > MaxFloat16:
		return fmt.Errorf("invalid analysis options: MaxActivation %g is not in (0, %d]", o.MaxActivation, MaxFloat16)
	case o.MaxWeight < 0 || o.MaxWeight > MaxFloat16:
		return fmt.Errorf("invalid analysis options: MaxWeight %g is not in (0, %d]", o.MaxWeight, MaxFloat16)
	case o.MaxUnderflow < 0 || o.MaxUnderflow > 1 || o.MaxWeightUnderflow < 0 || o.MaxWeightUnderflow > 1:
		return fmt.Errorf("invalid analysis options: underflow shares %g and %g must be in [0, 1]", o.MaxUnderflow, o.MaxWeightUnderflow)
	}
	return o.Session.Validate()
}

// TensorStats is what the analysis saw of one float tensor.
type TensorStats struct {
	// MaxAbs is the largest finite magnitude.
	MaxAbs float64
	// NonZero counts the finite non-zero values, Small those of them below
	// MinNormalFloat16 in magnitude.
	NonZero, Small int64
	// Weight is true for initializers and Constant values, whose stats
	// do not depend on the samples.
	Weight bool
}

// Underflow is the share of the non-zero values below MinNormalFloat16.
func (s TensorStats) Underflow() float64 {
	if s.NonZero == 0 {
		return 0
	}
	return float64(s.Small) / float64(s.NonZero)
}

// KeptNode is a node the analysis keeps in float32.
type KeptNode struct {
	// Node labels the node as Report.BlockedNodes does: its name, or
	// "Op(outputs)" when it has none.
	Node string
	Op   string
	// Reason says which tensor, how large or small, against which limit.
	Reason string
}

// Analysis is the result of Analyze: the statistics of every float tensor
// of the main graph, and the nodes to keep float32 because of them. Pass
// it as Options.Analysis.
type Analysis struct {
	// Samples is how many samples were run.
	Samples int
	// Tensors holds the statistics by tensor name.
	Tensors map[string]TensorStats
	// Kept lists the nodes kept in float32, in graph order.
	Kept []KeptNode
}

// Nodes returns the labels of the kept nodes.
func (a *Analysis) Nodes() []string {
	if a == nil {
		return nil
	}
	out := make([]string, len(a.Kept))
	for i, k := range a.Kept {
		out[i] = k.Node
	}
	return out
}

// ErrNoSamples is returned by Analyze when it is given no samples.
var ErrNoSamples = errors.New("no samples to analyze")

// Analyze runs the float32 model m in ONNX Runtime on each sample (one run
// per sample, so memory stays that of one run) with every float32 tensor
// of the main graph exposed as an output, and decides which nodes to keep
// in float32 (see AnalyzeOptions). Subgraph tensors are not observed. ORT
// must be initialized (ort.Init).
func Analyze(ctx context.Context, m *onnx.Model, samples []map[string]*onnx.Tensor, o AnalyzeOptions) (*Analysis, error) {
	name := modelName(m)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	if len(samples) == 0 {
		return nil, fmt.Errorf("analyzing %s: %w", name, ErrNoSamples)
	}
	a := &Analysis{Samples: len(samples), Tensors: map[string]TensorStats{}}
	if err := weightStats(m.Graph(), a.Tensors); err != nil {
		return nil, fmt.Errorf("analyzing %s: %w", name, err)
	}
	exposed, data, err := exposeFloats(m, a.Tensors)
	if err != nil {
		return nil, fmt.Errorf("analyzing %s: %w", name, err)
	}
	s, err := ort.NewSessionFromBytes(data, o.Session)
	if err != nil {
		return nil, fmt.Errorf("analyzing %s: opening the model with every float tensor as an output: %w", name, err)
	}
	defer s.Close()
	for i, sample := range samples {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for in, t := range sample {
			observe(a.Tensors, in, t)
		}
		out, err := s.Run(ctx, sample, exposed)
		if err != nil {
			return nil, fmt.Errorf("analyzing %s: running sample %d: %w", name, i, err)
		}
		for n, t := range out {
			observe(a.Tensors, n, t)
		}
	}
	a.Kept = decide(m.Graph(), a.Tensors, o)
	return a, nil
}

// weightStats records the statistics of the main graph's float32
// initializers and Constant values.
func weightStats(g *onnxpb.GraphProto, stats map[string]TensorStats) error {
	add := func(name string, t *onnxpb.TensorProto) error {
		if onnx.DataType(t.GetDataType()) != onnx.Float {
			return nil
		}
		if t.RawData != nil && t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			if len(t.RawData)%4 != 0 {
				return fmt.Errorf("weight %q: raw_data has %d bytes, not a whole number of float32s", name, len(t.RawData))
			}
			stats[name] = rawStats(t.RawData)
			return nil
		}
		v, err := onnx.Decode(t)
		if err != nil {
			return fmt.Errorf("weight %q: %w", name, err)
		}
		stats[name] = statsOf(v.Data.([]float32), TensorStats{Weight: true})
		return nil
	}
	for _, t := range g.GetInitializer() {
		if err := add(t.GetName(), t); err != nil {
			return err
		}
	}
	for _, n := range g.GetNode() {
		if n.GetOpType() != "Constant" || !isDefaultDomain(n) || len(n.GetOutput()) != 1 {
			continue
		}
		if a := attr(n, "value"); a != nil && a.T != nil {
			if err := add(n.GetOutput()[0], a.T); err != nil {
				return err
			}
		} else if a := attr(n, "value_float"); a != nil {
			stats[n.GetOutput()[0]] = statsOf([]float32{a.GetF()}, TensorStats{Weight: true})
		} else if a := attr(n, "value_floats"); a != nil {
			stats[n.GetOutput()[0]] = statsOf(a.GetFloats(), TensorStats{Weight: true})
		}
	}
	return nil
}

// rawStats is statsOf on little-endian float32 bytes, comparing bit
// patterns (magnitudes order as their bits do) and splitting large tensors
// between goroutines, so that it runs at memory speed like halfRaw.
func rawStats(src []byte) TensorStats {
	small, inf := math.Float32bits(MinNormalFloat16), uint32(0x7f800000)
	work := func(lo, hi int) (maxBits uint32, nonZero, nSmall int64) {
		for i := lo; i < hi; i++ {
			a := binary.LittleEndian.Uint32(src[4*i:]) & 0x7fffffff
			if a == 0 || a >= inf {
				continue
			}
			nonZero++
			if a < small {
				nSmall++
			}
			maxBits = max(maxBits, a)
		}
		return maxBits, nonZero, nSmall
	}
	n := len(src) / 4
	workers := runtime.GOMAXPROCS(0)
	if n < parallelMin || workers == 1 {
		m, nz, sm := work(0, n)
		return TensorStats{MaxAbs: float64(math.Float32frombits(m)), NonZero: nz, Small: sm, Weight: true}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	st := TensorStats{Weight: true}
	var maxBits uint32
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			m, nz, sm := work(lo, hi)
			mu.Lock()
			maxBits, st.NonZero, st.Small = max(maxBits, m), st.NonZero+nz, st.Small+sm
			mu.Unlock()
		}(lo, min(lo+chunk, n))
	}
	wg.Wait()
	st.MaxAbs = float64(math.Float32frombits(maxBits))
	return st
}

// exposeFloats returns the names of the float32 node outputs of the main
// graph that are not weights, and m serialized with all of them as graph
// outputs. m is not modified: the copy shares its nodes and initializers.
func exposeFloats(m *onnx.Model, weights map[string]TensorStats) ([]string, []byte, error) {
	g := m.Graph()
	types := elemTypes(g, nil)
	seen := map[string]bool{}
	var names []string
	outs := append([]*onnxpb.ValueInfoProto(nil), g.GetOutput()...)
	for _, o := range g.GetOutput() {
		seen[o.GetName()] = true
		if types[o.GetName()] == onnx.Float {
			names = append(names, o.GetName())
		}
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			if o == "" || seen[o] || types[o] != onnx.Float {
				continue
			}
			if _, w := weights[o]; w {
				continue
			}
			seen[o] = true
			names = append(names, o)
			outs = append(outs, onnx.TensorType(o, onnx.Float, onnx.Shape{}))
		}
	}
	mp := cloneExcept(m.Proto, "graph").(*onnxpb.ModelProto)
	ng := cloneExcept(g, "initializer", "node", "output").(*onnxpb.GraphProto)
	ng.Initializer, ng.Node, ng.Output = g.Initializer, g.Node, outs
	mp.Graph = ng
	data, err := proto.MarshalOptions{}.Marshal(mp)
	if err != nil {
		return nil, nil, fmt.Errorf("serializing the model with every float tensor exposed: %w", err)
	}
	return names, data, nil
}

// observe merges the values of t into the statistics of the tensor name;
// tensors that are not float32 are ignored.
func observe(stats map[string]TensorStats, name string, t *onnx.Tensor) {
	if t == nil {
		return
	}
	v, ok := t.Data.([]float32)
	if !ok {
		return
	}
	stats[name] = statsOf(v, stats[name])
}

func statsOf(v []float32, st TensorStats) TensorStats {
	maxAbs := float32(st.MaxAbs)
	var nonZero, small int64
	for _, x := range v {
		a := float32(math.Abs(float64(x)))
		switch {
		case a == 0 || a > math.MaxFloat32: // zero, infinity
			continue
		case a != a: // NaN
			continue
		case a < MinNormalFloat16:
			small++
		}
		nonZero++
		if a > maxAbs {
			maxAbs = a
		}
	}
	st.MaxAbs, st.NonZero, st.Small = float64(maxAbs), st.NonZero+nonZero, st.Small+small
	return st
}

// squaring lists operators that square their input internally, so an
// input above sqrt(MaxActivation) overflows although no input or output
// does.
var squaring = setOf("ReduceSumSquare", "ReduceL2", "LpNormalization", "LpPool", "GlobalLpPool")

// decide lists the nodes of g whose float tensors break the thresholds,
// with the first reason found for each.
func decide(g *onnxpb.GraphProto, stats map[string]TensorStats, o AnalyzeOptions) []KeptNode {
	var kept []KeptNode
	for _, n := range g.GetNode() {
		if op := n.GetOpType(); op == "Constant" || op == "ConstantOfShape" {
			continue // their values follow the consumers
		}
		if why := nodeReason(n, stats, o); why != "" {
			label := nodeLabel(n)
			kept = append(kept, KeptNode{Node: label, Op: n.GetOpType(),
				Reason: fmt.Sprintf("%s %s: %s", n.GetOpType(), label, why)})
		}
	}
	return kept
}

// nodeReason gives every reason to keep n float32, weights first, joined
// by "; ", or "".
func nodeReason(n *onnxpb.NodeProto, stats map[string]TensorStats, o AnalyzeOptions) string {
	var weights, acts []string
	for i, in := range n.GetInput() {
		st, ok := stats[in]
		if !ok {
			continue
		}
		limit := o.MaxActivation
		if squaring[n.GetOpType()] && !st.Weight {
			limit = math.Sqrt(limit)
		}
		if why := tensorReason(inputLabel(n.GetOpType(), i, in), st, limit, o); why != "" {
			if st.Weight {
				weights = append(weights, why)
			} else {
				acts = append(acts, why)
			}
		}
	}
	for _, out := range n.GetOutput() {
		if st, ok := stats[out]; ok {
			if why := tensorReason(fmt.Sprintf("output %s", out), st, o.MaxActivation, o); why != "" {
				acts = append(acts, why)
			}
		}
	}
	return strings.Join(append(weights, acts...), "; ")
}

// inputNames are the specification's names of the inputs of the operators
// whose weights most often leave float16's range.
var inputNames = map[string][]string{
	"BatchNormalization":    {"X", "scale", "B", "mean", "var"},
	"InstanceNormalization": {"input", "scale", "B"},
	"LayerNormalization":    {"X", "scale", "B"},
	"Conv":                  {"X", "W", "B"},
	"ConvTranspose":         {"X", "W", "B"},
	"Gemm":                  {"A", "B", "C"},
}

func inputLabel(op string, i int, name string) string {
	if names := inputNames[op]; i < len(names) {
		return fmt.Sprintf("%s (%s)", names[i], name)
	}
	return fmt.Sprintf("input %d (%s)", i, name)
}

func tensorReason(what string, st TensorStats, limit float64, o AnalyzeOptions) string {
	switch {
	case st.Weight && st.MaxAbs > o.MaxWeight:
		return fmt.Sprintf("%s up to %.3g exceeds float16's %g", what, st.MaxAbs, o.MaxWeight)
	case st.Weight && st.Underflow() > o.MaxWeightUnderflow:
		return fmt.Sprintf("%s has %.0f%% of its non-zero values below float16's smallest normal %.3g (limit %.0f%%)",
			what, 100*st.Underflow(), MinNormalFloat16, 100*o.MaxWeightUnderflow)
	case st.Weight:
		return ""
	case st.MaxAbs > limit:
		return fmt.Sprintf("activations %s up to %.3g exceed %g", what, st.MaxAbs, limit)
	case st.Underflow() > o.MaxUnderflow:
		return fmt.Sprintf("activations %s have %.0f%% of their non-zero values below float16's smallest normal %.3g (limit %.0f%%)",
			what, 100*st.Underflow(), MinNormalFloat16, 100*o.MaxUnderflow)
	}
	return ""
}
