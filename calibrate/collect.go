package calibrate

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// ErrNoFloatTensors is returned for a model that has no float32 tensor to
// calibrate (no float32 graph input and no float32 node output).
var ErrNoFloatTensors = errors.New("the model has no float32 tensors to calibrate")

// ErrNothingToQuantize is returned for a model without an operator the Q/DQ
// model quantizes.
var ErrNothingToQuantize = errors.New("quantizing: the model has no Conv, ConvTranspose, Gemm, MatMul or residual Add with float inputs to quantize")

// ActivationError is a value calibration cannot use: a NaN or infinite
// activation of one tensor for one sample.
type ActivationError struct {
	Tensor string
	Sample string // the sample's ID
	Err    error  // a *NonFiniteError
}

func (e *ActivationError) Error() string {
	return fmt.Sprintf("sample %s: tensor %q: %v", e.Sample, e.Tensor, e.Err)
}

// Unwrap returns the underlying error.
func (e *ActivationError) Unwrap() error { return e.Err }

// Observed lists the tensors calibration observes, in graph order: every
// float32 graph input and every node output that is or may be float32. These
// are the tensors of the full calibration cache (TensorRT wants a range for
// every network input and layer output) and a superset of the tensors the
// Q/DQ model quantizes (inputs of Conv, ConvTranspose, Gemm and MatMul and
// skip inputs of residual Adds are always graph inputs or node outputs).
// Outputs whose type cannot be told from the graph are included; Collect
// drops those that turn out not to be float32.
func Observed(m *onnx.Model) ([]string, error) {
	g := m.Graph()
	if g == nil {
		return nil, errors.New("the model has no graph")
	}
	types := inferTypes(m)
	var names []string
	seen := map[string]bool{}
	add := func(name string) {
		if name == "" || seen[name] {
			return
		}
		seen[name] = true
		if dt, ok := types[name]; ok && dt != onnx.Float {
			return
		}
		names = append(names, name)
	}
	for _, in := range m.Inputs() {
		add(in.Name)
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		for _, o := range n.GetOutput() {
			add(o)
		}
	}
	if len(names) == 0 {
		return nil, ErrNoFloatTensors
	}
	return names, nil
}

// Augment returns a copy of m whose graph outputs also include tensors.
// Added outputs carry their element type where the graph tells it and no
// type otherwise (ONNX Runtime infers it); run the result with all outputs
// fetched (a nil output list).
func Augment(m *onnx.Model, tensors []string) (*onnx.Model, error) {
	cp := &onnx.Model{Proto: proto.Clone(m.Proto).(*onnxpb.ModelProto)}
	g := cp.Graph()
	types := inferTypes(cp)
	scalar := scalars(cp)
	have := map[string]bool{}
	for _, o := range g.GetOutput() {
		have[o.GetName()] = true
	}
	for _, t := range tensors {
		if !have[t] {
			have[t] = true
			if dt, ok := types[t]; ok && dt != onnx.Undefined {
				g.Output = append(g.Output, onnx.TensorType(t, dt, onnx.Shape{Ranked: scalar[t]}))
			} else {
				g.Output = append(g.Output, &onnxpb.ValueInfoProto{Name: proto.String(t)})
			}
		}
	}
	return cp, nil
}

// Stats are the activation statistics of a calibration run.
type Stats struct {
	// Tensors are the float32 tensors observed, in graph order.
	Tensors []string
	// Hist holds each tensor's running min/max and histogram of |x|.
	Hist map[string]*Histogram
	// Samples is the number of samples run; Seen counts per tensor the
	// samples in which it was produced.
	Samples int
	Seen    map[string]int
	// IDs are the samples' IDs in the order they ran.
	IDs []string

	// d says which tensors are derived from others, not fetched.
	d derivation
	// free holds the fetched tensors that do not depend on the inputs,
	// fetched with the first run only.
	free map[string]bool
	// scans and begun carry the first batch from its scan to its counted
	// runs (see Stats.scan); scanned counts the samples scanned.
	scans   map[string]*batchScan
	begun   map[string]begun
	scanned int
}

// CollectOptions configure Collect.
type CollectOptions struct {
	// Session configures ONNX Runtime.
	Session ort.SessionOptions
	// Progress is called with the number of samples after each batch's
	// statistics are in (it must not block); nil ignores progress.
	Progress func(samples int)
	// RunSamples caps the samples of one ONNX Runtime run for models with
	// a free batch dimension: 0 picks it by the memory one sample's
	// activations take (see runBudget), -1 runs whole batches.
	RunSamples int
	// Workers adding to histograms; 0 means GOMAXPROCS. They share the
	// CPUs with ONNX Runtime's threads, which run the next batch meanwhile:
	// measured on 2 CPUs, one worker per CPU calibrates 15% faster than
	// leaving ONNX Runtime a CPU of its own.
	Workers int
}

// Collect runs batches through the model with every observed tensor (see
// Observed) as an extra output and keeps, per tensor, the running min/max and
// a histogram of |x|; the first batch fixes the bin widths. Tensors whose
// statistics follow exactly from another tensor's values (a ReLU output, a
// reshaped copy; see derive) are not fetched but derived, and tensors that
// do not depend on the inputs (see inputFree) are fetched with the first
// run only. Where the model's batch dimension is free, a batch runs a few
// samples at a time (see CollectOptions.RunSamples; the statistics are the
// same; a split first batch runs twice, first for its range). Work is
// pipelined: reading a batch, running ONNX Runtime and adding to the
// histograms overlap, and the activations of at most two runs are alive at a
// time, in memory that is reused from run to run, so memory does not grow
// with the number of samples. A NaN or infinite activation stops the run
// with an *ActivationError.
func Collect(ctx context.Context, m *onnx.Model, batches iter.Seq2[*dataset.Batch, error], opts CollectOptions) (*Stats, error) {
	names, err := Observed(m)
	if err != nil {
		return nil, err
	}
	d := derive(m, names)
	fetch := d.fetched(names)
	// Tensors that do not depend on the inputs are fetched with the first
	// run only (see inputFree); later runs use a second session without
	// them.
	free := map[string]bool{}
	if fetchFreeOnce {
		free = inputFree(m, fetch)
	}
	var rest []string
	for _, n := range fetch {
		if !free[n] {
			rest = append(rest, n)
		}
	}
	open := func(tensors []string) (*ort.Session, error) {
		aug, err := Augment(m, tensors)
		if err != nil {
			return nil, err
		}
		data, err := aug.Marshal()
		if err != nil {
			return nil, fmt.Errorf("augmenting the model: %w", err)
		}
		return ort.NewSessionFromBytes(data, opts.Session)
	}
	sess, err := open(fetch)
	if err != nil {
		return nil, err
	}
	defer func() { sess.Close() }()

	st := &Stats{Hist: map[string]*Histogram{}, Seen: map[string]int{}, d: d, free: free}
	for _, n := range names {
		st.Hist[n] = NewHistogram()
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// A result is one run's samples and activations. When the first
	// batch is split into several runs, they run twice: a scan (min and
	// max only, see Stats.scan), after whose last run the histograms
	// begin the batch as one, and then the runs that are counted. The
	// first batch thus fixes the bin widths as a whole batch does, with
	// no more than two runs' activations in memory.
	type result struct {
		ids        []string
		outs       map[string]*onnx.Tensor
		scan, last bool
	}
	read := make(chan *dataset.Batch, 1)
	// ran is unbuffered: ONNX Runtime runs one run ahead of the
	// histograms, so two sets of activations are alive at a time.
	ran := make(chan result)
	// spent takes back the activations the histograms are done with, for
	// ONNX Runtime to write the next batch into (ort.Session.RunReuse): no
	// new memory per batch, and no third set since a set is only made when
	// none is spare.
	spent := make(chan map[string]*onnx.Tensor, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // read batches: decoding images overlaps with inference
		defer wg.Done()
		defer close(read)
		for b, err := range batches {
			if err != nil {
				cancel(err)
				return
			}
			select {
			case read <- b:
			case <-ctx.Done():
				return
			}
		}
	}()
	// Runs take at most chunk samples of a batch where the model's batch
	// dimension is free (see splittable): the first run one sample, later
	// ones as many as fit runBudget by that run's activations. Every
	// activation fetched is fresh memory until the sets are reused, and a
	// smaller set is touched sooner and still in cache when the histograms
	// read it.
	split := splittable(m) && opts.RunSamples >= 0
	chunk := 1
	if opts.RunSamples > 0 {
		chunk = opts.RunSamples
	}
	go func() { // run ONNX Runtime
		defer wg.Done()
		defer close(ran)
		first, switched, firstBatch := true, false, true
		for b := range read {
			passes := []bool{false}
			if firstBatch && split && len(b.IDs) > 1 {
				passes = []bool{true, false}
			}
			firstBatch = false
			// The counted runs repeat the scan's runs exactly: a tensor
			// that is not one slice per sample (a mean over the batch)
			// must show the same values in both.
			var sizes []int
			for _, scan := range passes {
				for run, off := 0, 0; off < len(b.IDs); run++ {
					n := len(b.IDs) - off
					switch {
					case !scan && len(sizes) > 0:
						n = sizes[run]
					case split:
						n = min(n, chunk)
					}
					if !first && !switched && len(rest) < len(fetch) {
						sess.Close()
						var err error
						if sess, err = open(rest); err != nil {
							cancel(err)
							return
						}
						switched = true
					}
					var old map[string]*onnx.Tensor
					select {
					case old = <-spent:
					default:
					}
					sub := b.Slice(off, off+n)
					if sub == nil { // not stacked by sample: run it whole
						sub, n = b, len(b.IDs)
					}
					outs, err := sess.RunReuse(ctx, sub.Tensors, nil, old)
					if err != nil {
						cancel(fmt.Errorf("batch of samples %s: %w", idRange(sub.IDs), err))
						return
					}
					if first && split && opts.RunSamples == 0 {
						chunk = max(1, runBudget/max(1, outputBytes(outs)/n))
					}
					first = false
					off += n
					if scan {
						sizes = append(sizes, n)
					}
					select {
					case ran <- result{sub.IDs, outs, scan, off == len(b.IDs)}:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	first := true
	for r := range ran {
		if first {
			st.Tensors = keepFloat(names, r.outs, d)
			if len(st.Tensors) == 0 {
				cancel(ErrNoFloatTensors)
				break
			}
			first = false
		}
		var err error
		switch {
		case r.scan:
			err = st.scan(r.ids, r.outs, r.last)
		default:
			err = st.add(r.ids, r.outs, workers)
		}
		if err != nil {
			cancel(err)
			break
		}
		select {
		case spent <- r.outs:
		default:
		}
		if !r.scan && opts.Progress != nil {
			opts.Progress(len(r.ids))
		}
	}
	cancel(nil) // stop the pipeline if the loop broke early
	for range ran {
	}
	wg.Wait()
	if err := parent.Err(); err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return nil, err // the first error of any stage
	}
	if st.Samples == 0 {
		return nil, dataset.ErrNoSamples
	}
	st.finish()
	for n := range st.Hist {
		if st.Seen[n] == 0 {
			delete(st.Hist, n)
		}
	}
	return st, nil
}

// runBudget is the memory the activations of one run may take when Collect
// picks the samples per run: on the order of a last-level cache.
const runBudget = 32 << 20

// splittable tells whether every input of m has a free first dimension, so
// that a batch can run a few samples at a time.
func splittable(m *onnx.Model) bool {
	ins := m.Inputs()
	for _, in := range ins {
		if !in.Shape.Ranked || len(in.Shape.Dims) == 0 || in.Shape.Dims[0].Known {
			return false
		}
	}
	return len(ins) > 0
}

// outputBytes is the memory of a run's outputs.
func outputBytes(outs map[string]*onnx.Tensor) int {
	total := 0
	for _, t := range outs {
		if n, err := onnx.NumElements(t.Dims); err == nil {
			total += n * t.Type.Size()
		}
	}
	return total
}

// keepFloat drops the observed tensors that ONNX Runtime returned with
// another element type than float32. A tensor d derives goes with the
// tensor it is derived from.
func keepFloat(names []string, outs map[string]*onnx.Tensor, d derivation) []string {
	var keep []string
	for _, n := range names {
		if t, ok := outs[d.source(n)]; ok && t.Type == onnx.Float {
			keep = append(keep, n)
		}
	}
	return keep
}

// add adds one run's outputs to the histograms, tensors spread over
// workers (each histogram is touched by one worker only). A run of the first
// batch after its scan is counted into the bins Stats.scan began.
func (st *Stats) add(ids []string, outs map[string]*onnx.Tensor, workers int) error {
	if err := st.addTensors(ids, outs, workers); err != nil {
		return err
	}
	st.Samples += len(ids)
	st.IDs = append(st.IDs, ids...)
	if st.Samples == st.scanned {
		st.begun = nil // the first batch is in
	}
	return nil
}

// addTensors adds a run's outputs to the histograms and counts the run's
// samples as seen by each tensor it produced.
func (st *Stats) addTensors(ids []string, outs map[string]*onnx.Tensor, workers int) error {
	var next atomic.Int64
	errs := make([]error, len(st.Tensors))
	var wg sync.WaitGroup
	for range min(workers, len(st.Tensors)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(st.Tensors) {
					return
				}
				name := st.Tensors[i]
				t := outs[name]
				if t == nil {
					continue // derived (see finish) or not produced
				}
				v, _ := t.Data.([]float32)
				out, relu := st.d.relu[name]
				if b, ok := st.begun[name]; ok {
					if relu {
						countBoth(st.Hist[name], st.Hist[out], v, b.h, b.r)
					} else if b.h {
						count(st.Hist[name].counts, v, 1/st.Hist[name].width)
					}
					continue
				}
				var err error
				if relu {
					err = addRelu(st.Hist[name], st.Hist[out], v)
				} else {
					err = st.Hist[name].Add(v)
				}
				if err != nil {
					errs[i] = &ActivationError{Tensor: name, Sample: sampleOf(err, v, ids), Err: err}
				}
			}
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return e // the first in graph order
		}
	}
	for _, name := range st.Tensors {
		if outs[name] != nil {
			st.Seen[name] += len(ids)
			if out, ok := st.d.relu[name]; ok {
				st.Seen[out] += len(ids)
			}
		}
	}
	return nil
}

// scan takes one run of the first batch's scan: it keeps each tensor's
// batchScan and, after the last run, begins the batch in every histogram as
// Add would the whole batch (Histogram.begin), so that the batch's runs are
// then counted into bins that already cover it. Tensors that do not depend
// on the inputs come with the first run only, so they are added whole.
func (st *Stats) scan(ids []string, outs map[string]*onnx.Tensor, last bool) error {
	if st.scans == nil {
		st.scans = map[string]*batchScan{}
	}
	free := map[string]*onnx.Tensor{}
	for _, name := range st.Tensors {
		t := outs[name]
		if t == nil {
			continue
		}
		if st.free[name] {
			free[name] = t
			continue
		}
		v, _ := t.Data.([]float32)
		s := st.scans[name]
		if s == nil {
			s = &batchScan{}
			st.scans[name] = s
		}
		if err := s.add(v); err != nil {
			// The index counts from the batch's start; name the sample
			// within this run.
			var nf *NonFiniteError
			if errors.As(err, &nf) {
				nf.Index -= s.n
			}
			return &ActivationError{Tensor: name, Sample: sampleOf(err, v, ids), Err: err}
		}
	}
	if len(free) > 0 {
		// The samples themselves count with the batch's counted runs.
		if err := st.addTensors(ids, free, 1); err != nil {
			return err
		}
	}
	st.scanned += len(ids)
	if !last {
		return nil
	}
	st.begun = map[string]begun{}
	for name, s := range st.scans {
		if out, ok := st.d.relu[name]; ok {
			h, r := beginRelu(st.Hist[name], st.Hist[out], *s)
			st.begun[name] = begun{h, r}
		} else {
			st.begun[name] = begun{h: st.Hist[name].begin(s.lo, s.hi, s.n)}
		}
	}
	st.scans = nil
	return nil
}

// begun says, for a tensor whose first batch was scanned, whether its runs
// are to be counted (h) and its derived ReLU's (r).
type begun struct{ h, r bool }

// sampleOf names the sample of ids that a NonFiniteError's index into v,
// one run's values, falls in; the samples' range when it cannot tell.
func sampleOf(err error, v []float32, ids []string) string {
	var nf *NonFiniteError
	if errors.As(err, &nf) && len(ids) > 0 && len(v) >= len(ids) {
		if k := nf.Index / (len(v) / len(ids)); k < len(ids) {
			return ids[k]
		}
	}
	return idRange(ids)
}

// finish counts every sample as seen by the tensors fetched with the first
// batch only (see inputFree), and gives each tensor that hands on another's
// values in the same order (see derivation.alias) a copy of that tensor's
// statistics: the same values in the same order make the same histogram,
// min and max.
func (st *Stats) finish() {
	for _, name := range st.Tensors {
		if st.free[st.d.source(name)] && st.Seen[name] > 0 {
			st.Seen[name] = st.Samples // the same values in every run
		}
	}
	for _, name := range st.Tensors {
		root, ok := st.d.alias[name]
		if !ok {
			continue
		}
		h := *st.Hist[root]
		h.counts = slices.Clone(h.counts)
		st.Hist[name] = &h
		st.Seen[name] = st.Seen[root]
	}
}

// idRange names the samples of a batch for errors.
func idRange(ids []string) string {
	switch len(ids) {
	case 0:
		return "(none)"
	case 1:
		return ids[0]
	}
	return ids[0] + " .. " + ids[len(ids)-1]
}

// Ranges computes every observed tensor's range with method.
func (st *Stats) Ranges(method Method, opts MethodOptions) (Ranges, error) {
	r := Ranges{Version: RangesVersion, Method: method, Samples: st.Samples}
	// Entropy and MSE scan every candidate cut of every histogram
	// (milliseconds each); the tensors are independent, so every CPU
	// takes some.
	rgs := make([]Range, len(st.Tensors))
	errs := make([]error, len(st.Tensors))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(st.Tensors)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(st.Tensors); i = int(next.Add(1) - 1) {
				if h, ok := st.Hist[st.Tensors[i]]; ok {
					rgs[i], errs[i] = Compute(method, h, opts)
				} else {
					errs[i] = ErrNoValues
				}
			}
		})
	}
	wg.Wait()
	for i, name := range st.Tensors {
		if errors.Is(errs[i], ErrNoValues) {
			continue // not collected, or empty tensors, e.g. a [0,4] box list
		}
		if errs[i] != nil {
			return Ranges{}, fmt.Errorf("tensor %q: %w", name, errs[i])
		}
		r.Tensors = append(r.Tensors, NewTensorRange(name, st.Seen[name], st.Hist[name], rgs[i]))
	}
	if len(r.Tensors) == 0 {
		return Ranges{}, ErrNoFloatTensors
	}
	return r, nil
}

// inferTypes finds the element types of the values the graph records or that
// follow from a few operators' rules. Values missing from the map have an
// unknown type.
func inferTypes(m *onnx.Model) map[string]onnx.DataType {
	g := m.Graph()
	types := map[string]onnx.DataType{}
	record := func(vs []*onnxpb.ValueInfoProto) {
		for _, v := range vs {
			if i := onnx.InfoOf(v); i.Kind == "tensor" && i.Type != onnx.Undefined {
				types[i.Name] = i.Type
			} else if i.Kind != "" && i.Kind != "tensor" {
				types[i.Name] = onnx.Undefined
			}
		}
	}
	record(g.GetInput())
	record(g.GetOutput())
	record(g.GetValueInfo())
	for _, t := range g.GetInitializer() {
		types[t.GetName()] = onnx.DataType(t.GetDataType())
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return types
	}
	for _, n := range nodes {
		outs := n.GetOutput()
		if len(outs) == 0 {
			continue
		}
		if _, known := types[outs[0]]; known {
			continue
		}
		dt, ok := outputType(n, types)
		if !ok {
			continue
		}
		types[outs[0]] = dt
		if n.GetOpType() == "MaxPool" || n.GetOpType() == "TopK" {
			if len(outs) > 1 && outs[1] != "" {
				types[outs[1]] = onnx.Int64
			}
		}
	}
	return types
}

// outputType applies the element-type rule of n's operator to its first output.
func outputType(n *onnxpb.NodeProto, types map[string]onnx.DataType) (onnx.DataType, bool) {
	in := func(i int) (onnx.DataType, bool) {
		if i >= len(n.GetInput()) {
			return 0, false
		}
		dt, ok := types[n.GetInput()[i]]
		return dt, ok
	}
	switch n.GetOpType() {
	case "Shape", "Size", "ArgMax", "ArgMin", "NonZero", "NonMaxSuppression":
		return onnx.Int64, true
	case "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf":
		return onnx.Bool, true
	case "Cast":
		for _, a := range n.GetAttribute() {
			if a.GetName() == "to" {
				return onnx.DataType(a.GetI()), true
			}
		}
	case "Constant":
		for _, a := range n.GetAttribute() {
			switch a.GetName() {
			case "value":
				if a.GetT() != nil {
					return onnx.DataType(a.GetT().GetDataType()), true
				}
			case "value_float", "value_floats":
				return onnx.Float, true
			case "value_int", "value_ints":
				return onnx.Int64, true
			case "value_string", "value_strings":
				return onnx.String, true
			}
		}
	case "ConstantOfShape":
		for _, a := range n.GetAttribute() {
			if a.GetName() == "value" && a.GetT() != nil {
				return onnx.DataType(a.GetT().GetDataType()), true
			}
		}
		return onnx.Float, true
	case "QuantizeLinear", "DynamicQuantizeLinear":
		if dt, ok := in(2); ok {
			return dt, true
		}
		return onnx.Uint8, true
	case "DequantizeLinear":
		return in(1)
	case "Where":
		return in(1)
	case "Range", "Gather", "GatherElements", "GatherND", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
		"Flatten", "Concat", "Slice", "Expand", "Tile", "Identity", "Relu", "Conv", "ConvTranspose", "Gemm",
		"MatMul", "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "BatchNormalization", "MaxPool", "AveragePool",
		"GlobalAveragePool", "GlobalMaxPool", "Softmax", "LogSoftmax", "Sigmoid", "Tanh", "Clip", "LeakyRelu",
		"Dropout", "Pad", "Resize", "Upsample", "LRN", "Split", "ReduceMean", "ReduceSum", "ReduceMax",
		"ReduceMin", "Pow", "Sqrt", "Exp", "Log", "Abs", "Neg", "Erf", "Gelu", "HardSigmoid", "HardSwish",
		"LayerNormalization", "InstanceNormalization", "TopK":
		return in(0)
	}
	return 0, false
}
