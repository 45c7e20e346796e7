package calibrate

import (
	"context"
	"fmt"
	"iter"
	"math"
	"sort"

	"github.com/kiln-ml/kiln/internal/check"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// OutputAccuracy compares one graph output of a quantized model with fp32.
type OutputAccuracy struct {
	Output string `json:"output"`
	// Kind is how the output is read (check.KindOf, or a peak map found
	// from the graph): the metrics are the ones convert and serve judge.
	Kind check.Kind `json:"kind"`
	// Cosine is the mean of the per-sample cosine similarities (for a
	// peak map, at the positions that are peaks on both sides).
	Cosine float64 `json:"cosine"`
	// MinCosine is the lowest per-sample cosine similarity.
	MinCosine float64 `json:"min_cosine"`
	MaxAbs    float64 `json:"max_abs_error"`
	MeanAbs   float64 `json:"mean_abs_error"`
	// Classifier is true for outputs shaped [N,C] with C > 1 or [N,C,1,1];
	// then Top1 is the share of samples whose argmax agrees and Top5 the
	// share whose fp32 argmax is among the quantized model's 5 best classes.
	Classifier bool    `json:"classifier"`
	Top1       float64 `json:"top1_agreement,omitempty"`
	Top5       float64 `json:"top5_agreement,omitempty"`
	// Agreement is a dense map's argmax or mask agreement, or a peak map's
	// peak agreement (check.Metrics.Agreement); AgreementKind says which.
	Agreement     *float64 `json:"agreement,omitempty"`
	AgreementKind string   `json:"agreement_kind,omitempty"`
}

// TensorError is the quantization error of one tensor as a signal-to-
// quantization-noise ratio, 10*log10(sum x^2 / sum (x-x')^2) in dB.
type TensorError struct {
	Tensor string `json:"tensor"`
	// Kind is "quantized" for a quantized activation, x' its fake-quantized
	// value with its scale (the error of that Q/DQ alone), or "output" for
	// the output of a quantized node, x' the Q/DQ model's value (the error
	// accumulated up to that layer).
	Kind string `json:"kind"`
	// Node is the node that produces the tensor (for "output") or a node
	// that reads it quantized (for "quantized").
	Node string  `json:"node,omitempty"`
	SQNR float64 `json:"sqnr_db"`
}

// Accuracy is the accuracy of one quantized model against fp32.
type Accuracy struct {
	Samples int              `json:"samples"`
	Outputs []OutputAccuracy `json:"outputs"`
	// Tensors are sorted from the worst (lowest SQNR) to the best.
	Tensors []TensorError `json:"tensors"`

	// shapes are the fp32 dims of the outputs of the weighted nodes of
	// the reference model in the first batch, which held shapeRows
	// samples; they size the layers' compute (see layerMACs).
	shapes    map[string][]int64
	shapeRows int
}

// Evaluate runs the fp32 model ref and every quantized model on batches and
// compares their outputs and intermediate tensors (see Accuracy). The
// quantized models must come from Quantize on ref. Only sums are kept, so
// memory does not depend on the number of samples.
func Evaluate(ctx context.Context, ref *onnx.Model, models []*Quantized, r Ranges, batches iter.Seq2[*dataset.Batch, error], so ort.SessionOptions) ([]*Accuracy, error) {
	e := newEvaluation(ref, models, r)
	defer e.close()
	if err := e.open(ref, so); err != nil {
		return nil, err
	}
	for b, err := range batches {
		if err != nil {
			return nil, err
		}
		if e.samples == 0 {
			if err := e.leanIfLarge(ref, b.Tensors); err != nil {
				return nil, err
			}
		}
		if err := e.add(ctx, b); err != nil {
			return nil, err
		}
	}
	if e.samples == 0 {
		return nil, fmt.Errorf("evaluating: %w", dataset.ErrNoSamples)
	}
	return e.results(ref), nil
}

// evaluation holds the sums of one Evaluate call: the fp32 model fetches
// every tensor any comparison needs, each quantized model its outputs and
// quantized layers, so one run of each per batch does.
type evaluation struct {
	outputs []string
	// batched says the model's inputs share a batch dimension (dataset.
	// Batched), peaks are its peak-map outputs (check.PeakOutputs): how
	// its outputs are read.
	batched bool
	peaks   map[string]check.Peak
	scales  map[string]float64
	// graphOrder is the order in which fp32 activations are checked to be
	// finite (see checkFinite).
	graphOrder []string
	refFetch   []string
	refSess    *ort.Session
	// local holds the SQNR of each quantized activation against its own
	// fake quantization, in localOrder; it needs the fp32 values only.
	local      map[string]*sqnr
	localOrder []string
	plans      []*evalPlan
	samples    int
	// weightedOuts are the outputs of ref's weighted nodes, whose shapes
	// the first batch records (see Accuracy.shapes).
	weightedOuts []string
	shapes       map[string][]int64
	shapeRows    int
	// refOld is the fp32 model's last result, whose memory its next run
	// reuses (ort.Session.RunReuse), as evalPlan.old is a quantized model's.
	refOld map[string]*onnx.Tensor
	// so are the options the sessions were opened with (see leanIfLarge).
	so ort.SessionOptions
}

// evalPlan is what one quantized model is run for and its sums.
type evalPlan struct {
	q      *Quantized
	sess   *ort.Session
	fetch  []string // outputs + quantized node outputs
	layers []string // quantized node outputs
	acc    []outAcc
	layer  map[string]*sqnr
	old    map[string]*onnx.Tensor
}

// newEvaluation decides what each model fetches: the graph outputs, and of
// every quantized model the outputs of its quantized layers and the
// activations it quantizes, which the fp32 model fetches too.
func newEvaluation(ref *onnx.Model, models []*Quantized, r Ranges) *evaluation {
	e := &evaluation{scales: map[string]float64{}, local: map[string]*sqnr{}, plans: make([]*evalPlan, len(models))}
	e.outputs = []string{}
	e.batched, e.peaks = dataset.Batched(ref.Inputs()), check.PeakOutputs(ref)
	for _, o := range ref.Outputs() {
		e.outputs = append(e.outputs, o.Name)
	}
	for _, t := range r.Tensors {
		e.scales[t.Tensor] = t.Scale
	}
	e.refFetch = append([]string{}, e.outputs...)
	fetched := map[string]bool{}
	for _, o := range e.outputs {
		fetched[o] = true
	}
	want := func(t string) {
		if !fetched[t] {
			fetched[t] = true
			e.refFetch = append(e.refFetch, t)
		}
	}
	for i, q := range models {
		p := &evalPlan{q: q, layer: map[string]*sqnr{}, acc: make([]outAcc, len(e.outputs))}
		p.fetch = append(p.fetch, e.outputs...)
		for _, l := range q.Layers {
			if !contains(e.outputs, l.Output) && !contains(p.layers, l.Output) {
				p.layers = append(p.layers, l.Output)
				p.fetch = append(p.fetch, l.Output)
				p.layer[l.Output] = &sqnr{}
				want(l.Output)
			}
		}
		for _, a := range q.Activations {
			if _, ok := e.local[a]; !ok {
				e.local[a] = &sqnr{}
				e.localOrder = append(e.localOrder, a)
				want(a)
			}
		}
		e.plans[i] = p
	}
	for _, n := range ref.Graph().GetNode() {
		if weighted[n.GetOpType()] && len(n.GetOutput()) > 0 {
			e.weightedOuts = append(e.weightedOuts, n.GetOutput()[0])
			want(n.GetOutput()[0])
		}
	}
	e.graphOrder, _ = Observed(ref)
	return e
}

// open opens a session on every model with the tensors it fetches.
func (e *evaluation) open(ref *onnx.Model, so ort.SessionOptions) error {
	e.so = so
	var err error
	if e.refSess, err = openAugmented(ref, e.refFetch, so); err != nil {
		return fmt.Errorf("opening the fp32 model: %w", err)
	}
	for _, p := range e.plans {
		if p.sess, err = openAugmented(p.q.Model, p.fetch, so); err != nil {
			return fmt.Errorf("opening the Q/DQ model: %w", err)
		}
	}
	return nil
}

// close closes the sessions open has opened.
func (e *evaluation) close() {
	if e.refSess != nil {
		e.refSess.Close()
	}
	for _, p := range e.plans {
		if p.sess != nil {
			p.sess.Close()
		}
	}
}

// add runs one batch through the fp32 model and every quantized model and
// adds the comparisons to the sums. A NaN or infinite fp32 activation is an
// *ActivationError, as in Collect. Each model's run writes into the memory
// of its previous result, so that validation allocates one set of outputs
// per model, not one per batch.
func (e *evaluation) add(ctx context.Context, b *dataset.Batch) error {
	want, err := e.refSess.RunReuse(ctx, b.Tensors, nil, e.refOld)
	e.refOld = nil
	if err != nil {
		return fmt.Errorf("running fp32 on samples %s: %w", idRange(b.IDs), err)
	}
	if err := checkFinite(want, e.graphOrder, b.IDs); err != nil {
		return err
	}
	if e.shapes == nil {
		e.shapes, e.shapeRows = map[string][]int64{}, len(b.IDs)
		for _, o := range e.weightedOuts {
			if t := want[o]; t != nil {
				e.shapes[o] = t.Dims
			}
		}
	}
	for _, a := range e.localOrder {
		if t := want[a]; t != nil {
			e.local[a].addFakeQuant(floats(t), e.scales[a])
		}
	}
	for _, p := range e.plans {
		got, err := p.sess.RunReuse(ctx, b.Tensors, nil, p.old)
		p.old = nil
		if err != nil {
			return fmt.Errorf("running the Q/DQ model on samples %s: %w", idRange(b.IDs), err)
		}
		for i, o := range e.outputs {
			if err := p.acc[i].add(e, o, want[o], got[o], b); err != nil {
				return fmt.Errorf("output %q: %w", o, err)
			}
		}
		for _, l := range p.layers {
			if w, g := want[l], got[l]; w != nil && g != nil {
				p.layer[l].addPair(floats(w), floats(g))
			}
		}
		p.old = got
	}
	e.refOld = want
	e.samples += len(b.IDs)
	return nil
}

// results turns the sums into one Accuracy per quantized model, its
// tensors sorted from the worst SQNR, naming each tensor's node in ref.
func (e *evaluation) results(ref *onnx.Model) []*Accuracy {
	producer := onnx.NewIndex(ref.Graph()).Producer
	res := make([]*Accuracy, len(e.plans))
	for i, p := range e.plans {
		a := &Accuracy{Samples: e.samples, shapes: e.shapes, shapeRows: e.shapeRows}
		for j, o := range e.outputs {
			a.Outputs = append(a.Outputs, p.acc[j].result(o))
		}
		for _, t := range p.q.Activations {
			a.Tensors = append(a.Tensors, TensorError{Tensor: t, Kind: "quantized", Node: p.q.readers[t], SQNR: e.local[t].db()})
		}
		for _, l := range p.layers {
			a.Tensors = append(a.Tensors, TensorError{Tensor: l, Kind: "output", Node: nodeName(producer[l]), SQNR: p.layer[l].db()})
		}
		sort.SliceStable(a.Tensors, func(x, y int) bool { return a.Tensors[x].SQNR < a.Tensors[y].SQNR })
		res[i] = a
	}
	return res
}

// checkFinite returns an *ActivationError for the first NaN or infinite
// value among float32 results in graph order, naming the tensor and the sample.
func checkFinite(res map[string]*onnx.Tensor, order []string, ids []string) error {
	for _, n := range order {
		if res[n] == nil {
			continue
		}
		v := floats(res[n])
		for i, x := range v {
			if x-x != 0 {
				sample := idRange(ids)
				if per := len(v) / max(1, len(ids)); per > 0 && i/per < len(ids) {
					sample = ids[i/per]
				}
				return &ActivationError{Tensor: n, Sample: sample, Err: &NonFiniteError{Index: i, Value: x}}
			}
		}
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func floats(t *onnx.Tensor) []float32 {
	v, _ := t.Data.([]float32)
	return v
}

// sqnr accumulates signal and noise energy.
type sqnr struct{ signal, noise float64 }

func (s *sqnr) addPair(x, y []float32) {
	for i := range min(len(x), len(y)) {
		d := float64(x[i]) - float64(y[i])
		s.signal += float64(x[i]) * float64(x[i])
		s.noise += d * d
	}
}

// addFakeQuant adds x against its symmetric int8 fake quantization with
// scale (activations saturate to [-128, 127] as QuantizeLinear does).
func (s *sqnr) addFakeQuant(x []float32, scale float64) {
	if scale <= 0 {
		return
	}
	inv := 1 / scale
	for _, v := range x {
		q := math.RoundToEven(float64(v) * inv)
		q = max(-128, min(127, q)) * scale
		d := float64(v) - q
		s.signal += float64(v) * float64(v)
		s.noise += d * d
	}
}

// db is the SQNR in dB, capped at 200 dB for an exact match (JSON has no +Inf).
func (s *sqnr) db() float64 {
	if s.noise == 0 {
		return 200
	}
	if s.signal == 0 {
		return -200
	}
	return math.Min(200, 10*math.Log10(s.signal/s.noise))
}

// outAcc compares one output with kiln's one checker (internal/check), so
// that calibrate measures an output as convert and serve judge it: per
// sample cosines, top-k for classifiers, argmax or mask agreement for
// dense maps, peak agreement for peak maps (check.PeakOutputs). It is
// started by the first batch, whose shape decides how the output is read.
type outAcc struct {
	acc *check.Accumulator
}

func (a *outAcc) add(e *evaluation, name string, want, got *onnx.Tensor, b *dataset.Batch) error {
	if want == nil || got == nil {
		return fmt.Errorf("missing from a model's results")
	}
	batched, ids := e.batched, b.IDs
	if batched && (len(want.Dims) == 0 || want.Dims[0] != int64(len(ids))) {
		batched, ids = false, []string{idRange(b.IDs)}
	}
	if a.acc == nil {
		a.acc = check.OutputAccumulator(name, want.Dims, batched, b.Tensors, e.peaks, check.Thresholds{})
	}
	return a.acc.Add(want, got, ids, batched)
}

func (a *outAcc) result(name string) OutputAccuracy {
	o := OutputAccuracy{Output: name}
	if a.acc == nil {
		return o
	}
	m := a.acc.Metrics()
	o.Kind, o.Cosine, o.MinCosine, o.MaxAbs, o.MeanAbs = m.Kind, m.Cosine, m.WorstCosine, m.MaxAbs, m.MeanAbs
	o.Classifier = m.Kind == check.KindClassifier
	if m.Top1 != nil {
		o.Top1 = *m.Top1
	}
	if m.Top5 != nil {
		o.Top5 = *m.Top5
	}
	o.Agreement, o.AgreementKind = m.Agreement, m.AgreementKind
	return o
}
