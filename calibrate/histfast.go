package calibrate

import "math"

// addFast adds values exactly as Add does, in one pass over the data instead
// of two once the bin width is known: calibration reads every activation of
// every sample, and the second pass over megabytes of fresh ONNX Runtime
// output costs as much as a convolution. A batch that reaches past the last
// bin (the histogram must grow) is taken back out and given to Add.
func (h *Histogram) addFast(values []float32) error {
	if h.width == 0 || len(values) == 0 {
		return h.Add(values)
	}
	inv := 1 / h.width
	counts := h.counts
	last := len(counts) - 1
	bmin, bmax := values[0], values[0]
	outside := false
	for i, v := range values {
		if v-v != 0 {
			h.undo(values[:i])
			return &NonFiniteError{Index: i, Value: v}
		}
		bmin, bmax = min(bmin, v), max(bmax, v)
		k := int(math.Abs(float64(v)) * inv)
		if k > last {
			outside = true
			k = last
		}
		counts[k]++
	}
	if outside {
		h.undo(values)
		return h.Add(values)
	}
	h.observe(uint64(len(values)), float64(bmin), float64(bmax))
	return nil
}

// undo takes values that addFast counted back out of the bins.
func (h *Histogram) undo(values []float32) {
	inv := 1 / h.width
	last := len(h.counts) - 1
	for _, v := range values {
		h.counts[min(int(math.Abs(float64(v))*inv), last)]--
	}
}
