package check

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/onnx"
)

// maskThreshold is the value above which an element of a mask counts as
// set: dense C == 1 outputs are read as probabilities (sigmoid maps).
const maskThreshold = 0.5

// Accumulator compares one output batch by batch. It keeps only sums and
// extremes, so its memory does not grow with the number of samples; the
// one buffer it holds, for widening non-float32/float64 data, is as large
// as the largest batch. An Accumulator is for one goroutine at a time.
type Accumulator struct {
	output string
	kind   Kind
	th     Thresholds

	// Fixed by the first batch.
	started          bool
	refType, gotType onnx.DataType
	classes          int64  // KindClassifier: the class count
	mode             string // KindDense: "argmax" or "mask"
	peak             Peak   // KindPeaks: the pattern, and view, how a sample is read
	view             peakView

	samples     int
	elements    int64
	sums        elemStats
	sumCos      float64
	worstCos    float64
	worstSample string
	tolSet      bool
	tolWorst    float64
	tolSample   string
	top1, top5  int
	agree, pos  int64
	// KindPeaks: peak mass of each side, and the part of it kept.
	refMass, refKept, gotMass, gotKept float64

	bufRef, bufGot   []float64
	peakRef, peakGot []float64 // KindPeaks: co-located values
}

// NewAccumulator starts the comparison of the output named output, read as
// kind (KindOf), measuring the elementwise rule with th's ATol and RTol.
// Integer and bool outputs are compared as numbers and always read as
// KindOther: their top-k or argmax would not mean what it means for scores.
func NewAccumulator(output string, kind Kind, th Thresholds) *Accumulator {
	if kind != KindClassifier && kind != KindDense {
		kind = KindOther
	}
	return &Accumulator{output: output, kind: kind, th: th}
}

// NewPeakAccumulator starts the comparison of an output PeakOutputs found,
// read as KindPeaks. Where the first batch's shape does not show p's
// spatial axes (a Reshape made them ambiguous), the output is read as
// KindOther: strict, never looser.
func NewPeakAccumulator(output string, p Peak, th Thresholds) *Accumulator {
	return &Accumulator{output: output, kind: KindPeaks, peak: p, th: th}
}

// layout is how the samples of one batch are read.
type layout struct {
	size     int // elements per sample
	channels int // KindDense argmax: the channel count
}

// Add compares one batch. When batched, sample i is the slice along dim 0
// and is named ids[i], so len(ids) must equal dim 0; when not, the whole
// tensor is one sample named ids[0]. Shapes must be equal. Element types
// may differ in width within a family, since that is often the conversion
// being checked (an fp16 model with fp16 outputs, a TensorRT engine giving
// int32 for int64): any of float32, float64, float16 and bfloat16 compares
// with any other, any integer type or bool with any other, but a float
// never with an integer. On error nothing of the batch is counted.
func (a *Accumulator) Add(ref, got *onnx.Tensor, ids []string, batched bool) error {
	if err := a.add(ref, got, ids, batched); err != nil {
		return fmt.Errorf("output %q: %w", a.output, err)
	}
	return nil
}

func (a *Accumulator) add(ref, got *onnx.Tensor, ids []string, batched bool) error {
	if ref == nil || got == nil {
		return errors.New("reference or candidate tensor is missing")
	}
	fam, err := families(ref, got)
	if err != nil {
		return err
	}
	if a.started && (ref.Type != a.refType || got.Type != a.gotType) {
		return fmt.Errorf("element types %s (reference) and %s (candidate) differ from the first batch's %s and %s",
			ref.Type, got.Type, a.refType, a.gotType)
	}
	l, err := a.layoutOf(ref, got, ids, batched)
	if err != nil {
		return err
	}
	if !a.started {
		a.started, a.refType, a.gotType = true, ref.Type, got.Type
		if fam != floats {
			a.kind = KindOther
		}
	}
	if r, ok := ref.Data.([]float32); ok {
		if g, ok := got.Data.([]float32); ok {
			compareBatch(a, r, g, ids, l)
			return nil
		}
	}
	if r, ok := ref.Data.([]float64); ok {
		if g, ok := got.Data.([]float64); ok {
			compareBatch(a, r, g, ids, l)
			return nil
		}
	}
	a.bufRef = widen(a.bufRef[:0], ref.Data)
	a.bufGot = widen(a.bufGot[:0], got.Data)
	compareBatch(a, a.bufRef, a.bufGot, ids, l)
	return nil
}

// layoutOf checks shapes, element counts and ids, and how the kind reads
// a sample. It changes nothing but the class count or dense mode the first
// batch fixes.
func (a *Accumulator) layoutOf(ref, got *onnx.Tensor, ids []string, batched bool) (layout, error) {
	if !slices.Equal(ref.Dims, got.Dims) {
		return layout{}, fmt.Errorf("candidate shape %v (%s) differs from reference shape %v (%s)",
			got.Dims, got.Type, ref.Dims, ref.Type)
	}
	n, err := onnx.NumElements(ref.Dims)
	if err != nil {
		return layout{}, fmt.Errorf("reference shape: %w", err)
	}
	if ref.Len() != n || got.Len() != n {
		return layout{}, fmt.Errorf("shape %v needs %d elements, reference holds %d and candidate %d",
			ref.Dims, n, ref.Len(), got.Len())
	}
	sample := ref.Dims
	switch {
	case batched && len(ref.Dims) == 0:
		return layout{}, errors.New("a batched output needs a batch dim, the shape is []")
	case batched && ref.Dims[0] != int64(len(ids)):
		return layout{}, fmt.Errorf("batch of %d samples (shape %v) comes with %d ids", ref.Dims[0], ref.Dims, len(ids))
	case batched:
		sample = ref.Dims[1:]
	case len(ids) != 1:
		return layout{}, fmt.Errorf("an unbatched output is one sample and needs 1 id, got %d", len(ids))
	}
	l := layout{size: n}
	if len(ids) > 0 {
		l.size = n / len(ids)
	}
	if !isFloatType(ref.Type) {
		return l, nil // read as KindOther
	}
	switch a.kind {
	case KindClassifier:
		c := classes(sample)
		if c <= 1 {
			return layout{}, fmt.Errorf("shape %v is not classifier-shaped ([N,C], [N,C,1,1] or [C] with C > 1)", ref.Dims)
		}
		if a.started && c != a.classes {
			return layout{}, fmt.Errorf("shape %v has %d classes, the first batch had %d", ref.Dims, c, a.classes)
		}
		a.classes = c
	case KindDense:
		if len(sample) < 2 {
			return layout{}, fmt.Errorf("shape %v has no spatial dims for a dense output", ref.Dims)
		}
		mode := "mask"
		if len(sample) >= 3 && sample[0] > 1 {
			mode, l.channels = "argmax", int(sample[0])
		}
		if a.started && mode != a.mode {
			return layout{}, fmt.Errorf("shape %v reads as a %s map, the first batch as a %s map", ref.Dims, mode, a.mode)
		}
		a.mode = mode
	case KindPeaks:
		v, ok := a.peak.viewOf(sample)
		switch {
		case !ok && !a.started:
			a.kind = KindOther
		case !ok || (a.started && !slices.Equal(v.spatial, a.view.spatial)):
			return layout{}, fmt.Errorf("shape %v does not show the spatial axes of a %v peak map", ref.Dims, a.peak.Kernel)
		default:
			a.view = v
		}
	}
	return l, nil
}

// addSample folds one sample's element statistics and cosine into the
// totals.
func (a *Accumulator) addSample(id string, size int, s elemStats, cos float64) {
	a.samples++
	a.elements += int64(size)
	a.sums.merge(s)
	a.sumCos += cos
	if a.samples == 1 || cos < a.worstCos {
		a.worstCos, a.worstSample = cos, id
	}
	if s.outside > 0 && (!a.tolSet || s.needATol > a.tolWorst) {
		a.tolSet, a.tolWorst, a.tolSample = true, s.needATol, id
	}
}

// Metrics returns the comparison so far; the Accumulator can go on adding
// batches afterwards.
func (a *Accumulator) Metrics() Metrics {
	s := a.sums
	m := Metrics{
		Output:   a.output,
		Kind:     a.kind,
		Samples:  a.samples,
		Elements: a.elements,
		MaxAbs:   finite(s.maxAbs),
		MaxRel:   finite(s.maxRel),
		NaN:      s.nan, Inf: s.inf, RefNaN: s.refNaN, RefInf: s.refInf,
		MinATol:         finite(s.needATol),
		MinRTol:         finite(s.needRTol),
		Outside:         s.outside,
		ToleranceSample: a.tolSample,
	}
	if s.unbounded {
		m.MinRTol = math.MaxFloat64
	}
	if s.finite > 0 {
		m.MeanAbs = finite(s.sumAbs / float64(s.finite))
	}
	switch {
	case s.rr > 0:
		m.NormRatio = finite(math.Sqrt(s.gg / s.rr))
	case s.gg == 0:
		m.NormRatio = 1
	}
	if a.samples == 0 {
		return m
	}
	m.Cosine = a.sumCos / float64(a.samples)
	m.WorstCosine, m.WorstSample = a.worstCos, a.worstSample
	switch {
	case a.kind == KindClassifier:
		m.Top1 = share(int64(a.top1), int64(a.samples))
		if a.classes > 5 {
			m.Top5 = share(int64(a.top5), int64(a.samples))
		}
	case a.kind == KindPeaks:
		recall, precision := keptShare(a.refKept, a.refMass), keptShare(a.gotKept, a.gotMass)
		m.PeakRecall, m.PeakPrecision, m.PeakWindow = &recall, &precision, a.peak.window()
		m.Agreement, m.AgreementKind = share1(min(recall, precision)), "peaks"
	case a.kind == KindDense && a.pos > 0:
		m.Agreement = share(a.agree, a.pos)
		m.AgreementKind = a.mode
		if a.mode == "mask" {
			m.MaskThreshold = maskThreshold
		}
	}
	return m
}

// keptShare is kept/mass, 1 when there is no mass: no peaks on a side
// lose nothing.
func keptShare(kept, mass float64) float64 {
	if mass == 0 {
		return 1
	}
	return kept / mass
}

func share1(v float64) *float64 { return &v }

func share(n, of int64) *float64 {
	v := float64(n) / float64(of)
	return &v
}

// finite keeps JSON encodable: an overflowed sum or error is reported as
// the largest float64.
func finite(v float64) float64 {
	switch {
	case math.IsInf(v, 1):
		return math.MaxFloat64
	case math.IsInf(v, -1):
		return -math.MaxFloat64
	case math.IsNaN(v):
		return 0
	}
	return v
}
