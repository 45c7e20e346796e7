package calibrate

import "math"

// addFast adds values exactly as Add does, in one pass over the data instead
// of two once the bin width is known: calibration reads every activation of
// every sample, and a second pass over megabytes of fresh ONNX Runtime
// output costs as much as a convolution. Min and max are kept with plain
// comparisons, as Add keeps them (the min and max builtins handle NaN and
// signed zeros, which costs more than the rest of the loop). A batch that
// reaches past the last bin (the histogram must grow) or holds a NaN or an
// infinity is taken back out and given to Add, which grows the histogram or
// reports the first non-finite value.
func (h *Histogram) addFast(values []float32) error {
	if h.width == 0 || len(values) == 0 {
		return h.Add(values)
	}
	inv := 1 / h.width
	counts := h.counts
	last := uint(len(counts) - 1)
	bmin, bmax := values[0], values[0]
	for i, v := range values {
		if v != v {
			h.undo(values[:i])
			return h.Add(values)
		}
		if v < bmin {
			bmin = v
		}
		if v > bmax {
			bmax = v
		}
		// An infinity converts to some int; uint keeps it in range
		// until it is taken back out below.
		k := uint(int(math.Abs(float64(v)) * inv))
		if k > last {
			k = last
		}
		counts[k]++
	}
	if math.Max(-float64(bmin), float64(bmax)) > h.Top() {
		h.undo(values)
		return h.Add(values)
	}
	h.observe(uint64(len(values)), float64(bmin), float64(bmax))
	return nil
}

// undo takes values that addFast counted back out of the bins.
func (h *Histogram) undo(values []float32) {
	inv := 1 / h.width
	last := uint(len(h.counts) - 1)
	for _, v := range values {
		h.counts[min(uint(int(math.Abs(float64(v))*inv)), last)]--
	}
}
