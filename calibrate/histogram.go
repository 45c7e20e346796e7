package calibrate

import (
	"fmt"
	"math"
)

// NumBins is the number of bins a histogram starts with, as in TensorRT's
// entropy calibration and pytorch-quantization's HistogramCalibrator.
const NumBins = 2048

// MaxBins bounds the number of bins a histogram may grow to. pytorch-quantization
// grows without a bound, so a first batch with a tiny max followed by a batch
// with a large one can ask for billions of bins; kiln instead doubles the bin
// width (merging pairs of bins, counts kept exactly) whenever growth would pass
// MaxBins. Histograms that grow less than 8x, the common case, are identical
// to pytorch-quantization's.
const MaxBins = 8 * NumBins

// NonFiniteError reports a NaN or infinite value given to Histogram.Add.
// The histogram is left unchanged; the caller adds the tensor name.
type NonFiniteError struct {
	Index int     // position of the first offending value in the batch
	Value float32 // NaN, +Inf or -Inf
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("value %d of the batch is %v", e.Index, e.Value)
}

// Histogram summarises the values of one tensor for calibration: the number
// of values, their signed minimum and maximum, and a histogram of |x| over
// [0, Bins()*BinWidth()].
//
// The first batch with a non-zero value fixes the bin width at max|x|/2048.
// A later batch whose max|x| lies above the last edge appends bins of the same
// width, ceil(max|x|/width) bins in all, and keeps the old counts (as
// pytorch-quantization's HistogramCalibrator.collect does). Batches that are
// all zero before that are counted into bin 0 once the width is known
// (pytorch-quantization divides by a zero width there).
//
// Memory is O(bins), independent of the number of values. A Histogram is not
// safe for concurrent use; collect in parallel into several and Merge them.
type Histogram struct {
	counts   []uint64
	width    float64 // 0 until a non-zero value has been seen
	zeros    uint64  // values seen while width was 0 (all exact zeros)
	n        uint64
	min, max float64
}

// NewHistogram returns an empty histogram. The zero Histogram is empty too.
func NewHistogram() *Histogram { return &Histogram{} }

// Add adds a batch of values. A NaN or infinite value is rejected with a
// *NonFiniteError and nothing of the batch is added.
func (h *Histogram) Add(values []float32) error {
	if h.width > 0 && len(values) > 0 {
		// The bins usually cover the batch already: count it in the
		// pass that finds its range, and take that pass back when they
		// do not (Add then does what it does before the width is
		// known) or when a value is not finite.
		inv := 1 / h.width
		lo, hi, finite := countMinMax(h.counts, values, inv, 1)
		if finite && math.Max(-float64(lo), float64(hi)) <= h.Top() {
			h.observe(uint64(len(values)), float64(lo), float64(hi))
			return nil
		}
		countMinMax(h.counts, values, inv, ^uint64(0))
	}
	var s batchScan
	if err := s.add(values); err != nil {
		return err
	}
	if h.begin(s.lo, s.hi, s.n) {
		count(h.counts, values, 1/h.width)
	}
	return nil
}

// batchScan is what adding a batch needs to know of it before counting it,
// gathered a piece at a time: the batch's min and max as a first-of-equals
// scan finds them, the number of values, and, for a ReLU derived from the
// batch, its first value and first value <= 0.
type batchScan struct {
	lo, hi         float32
	n              int
	first, firstLE float32
	hasLE          bool
}

// add scans the next piece of the batch. A NaN or infinity is a
// *NonFiniteError whose index counts from the start of the batch.
func (s *batchScan) add(values []float32) error {
	if len(values) == 0 {
		return nil
	}
	lo, hi, finite := minMax(values)
	if !finite {
		nf := nonFinite(values).(*NonFiniteError)
		nf.Index += s.n
		return nf
	}
	// Strictly beyond: the first of equal values stays, as in a scan of
	// the whole batch.
	if s.n == 0 || lo < s.lo {
		s.lo = lo
	}
	if s.n == 0 || hi > s.hi {
		s.hi = hi
	}
	if s.n == 0 {
		s.first = values[0]
	}
	if !s.hasLE && lo <= 0 {
		for _, v := range values {
			if v <= 0 {
				s.firstLE, s.hasLE = v, true
				break
			}
		}
	}
	s.n += len(values)
	return nil
}

// relu is the scan of the batch's ReLU (ONNX Runtime's: 0 for a negative
// value, -0 kept): its max is the max when positive and else the ReLU of
// the first value (the first of equal zeros); its min is the min when
// positive and else the ReLU of the first value <= 0.
func (s batchScan) relu() (lo, hi float32) {
	lo, hi = s.lo, s.hi
	if hi <= 0 {
		hi = reluOf(s.first)
	}
	if lo <= 0 && s.hasLE {
		lo = reluOf(s.firstLE)
	}
	return lo, hi
}

// begin does what Add does for a batch of n values between lo and hi before
// counting them: it records them, and either makes the bins cover the batch
// or, while no bin width is known and the batch is all zeros, counts them
// as zeros. It reports whether the values are still to be counted.
func (h *Histogram) begin(lo, hi float32, n int) bool {
	if n == 0 {
		return false
	}
	h.observe(uint64(n), float64(lo), float64(hi))
	amax := math.Max(-float64(lo), float64(hi))
	if amax == 0 && h.width == 0 {
		h.zeros += uint64(n)
		return false
	}
	h.cover(amax)
	return true
}

// nonFinite reports the first NaN or infinity of values.
func nonFinite(values []float32) error {
	for i, v := range values {
		if v-v != 0 { // NaN for NaN and ±Inf
			return &NonFiniteError{Index: i, Value: v}
		}
	}
	return nil
}

// observe counts n values between lo and hi.
func (h *Histogram) observe(n uint64, lo, hi float64) {
	if h.n == 0 {
		h.min, h.max = lo, hi
	} else {
		h.min, h.max = math.Min(h.min, lo), math.Max(h.max, hi)
	}
	h.n += n
}

// cover makes the histogram reach amax > 0: it sets the width on the first
// non-zero value, appends bins when amax is above the last edge, and doubles
// the width when that would pass MaxBins.
func (h *Histogram) cover(amax float64) {
	if h.width == 0 {
		h.width = amax / NumBins
		h.counts = make([]uint64, NumBins)
		h.counts[0] = h.zeros
		h.zeros = 0
		return
	}
	if amax <= h.Top() {
		return
	}
	need := amax / h.width
	for need > MaxBins {
		h.coarsen()
		need /= 2
	}
	nb := int(math.Ceil(need))
	if float64(nb)*h.width < amax {
		nb++ // rounding put the last edge just below amax
	}
	if nb > len(h.counts) {
		grown := make([]uint64, nb)
		copy(grown, h.counts)
		h.counts = grown
	}
}

// coarsen doubles the bin width, adding each pair of bins into one.
func (h *Histogram) coarsen() {
	half := make([]uint64, (len(h.counts)+1)/2)
	for i, c := range h.counts {
		half[i/2] += c
	}
	h.counts = half
	h.width *= 2
}

// Merge adds the values summarised by o into h, so that histograms collected
// in parallel can be combined. When both have the same bin width (for example
// both saw the global max|x| in their first batch) the result is exactly the
// histogram of all values; otherwise each bin of the finer histogram is placed
// by its centre into the coarser one, which is exact to within one bin.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.n == 0 {
		return
	}
	h.observe(o.n, o.min, o.max)
	switch {
	case o.width == 0:
		if h.width == 0 {
			h.zeros += o.zeros
		} else {
			h.counts[0] += o.zeros
		}
		return
	case h.width == 0:
		zeros := h.zeros
		h.counts = append([]uint64(nil), o.counts...)
		h.width = o.width
		h.zeros = 0
		h.counts[0] += zeros
		return
	}
	src := o.counts
	srcWidth := o.width
	if o.width > h.width {
		// Rebin h into o's coarser grid.
		src, srcWidth = h.counts, h.width
		h.counts = append([]uint64(nil), o.counts...)
		h.width = o.width
	}
	if srcWidth == h.width {
		if len(src) > len(h.counts) {
			grown := make([]uint64, len(src))
			copy(grown, h.counts)
			h.counts = grown
		}
	} else {
		h.cover(float64(len(src)) * srcWidth)
	}
	last := len(h.counts) - 1
	for j, c := range src {
		if c == 0 {
			continue
		}
		k := j
		if srcWidth != h.width {
			k = int((float64(j) + 0.5) * srcWidth / h.width)
		}
		if k > last {
			k = last
		}
		h.counts[k] += c
	}
}

// Count is the number of values added.
func (h *Histogram) Count() uint64 { return h.n }

// Min is the smallest value added (+Inf when empty).
func (h *Histogram) Min() float64 {
	if h.n == 0 {
		return math.Inf(1)
	}
	return h.min
}

// Max is the largest value added (-Inf when empty).
func (h *Histogram) Max() float64 {
	if h.n == 0 {
		return math.Inf(-1)
	}
	return h.max
}

// AbsMax is max|x| over the values added (0 when empty).
func (h *Histogram) AbsMax() float64 {
	if h.n == 0 {
		return 0
	}
	return math.Max(-h.min, h.max)
}

// Bins is the number of bins (0 until a non-zero value has been added).
func (h *Histogram) Bins() int { return len(h.counts) }

// BinWidth is the width of every bin (0 until a non-zero value has been added).
func (h *Histogram) BinWidth() float64 { return h.width }

// Edge is the lower edge of bin i, i*BinWidth(); Edge(Bins()) is the top.
func (h *Histogram) Edge(i int) float64 { return float64(i) * h.width }

// Top is the upper edge of the last bin; it is >= AbsMax().
func (h *Histogram) Top() float64 { return h.Edge(len(h.counts)) }

// Counts returns a copy of the bin counts.
func (h *Histogram) Counts() []uint64 {
	return append([]uint64(nil), h.counts...)
}
