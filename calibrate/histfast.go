package calibrate

import "math"

// The histogram kernels. Calibration reads every activation of every
// sample, so Add reads a batch once where it can, with the tightest loops
// it can: once the bin width is known, countMinMax counts each value into
// the bins as they are while it finds the batch's min and max, which rarely
// grow the bins. Otherwise, and when the batch turns out to grow them or to
// hold a NaN or infinity (the pass is then taken back), Add makes two
// passes: minMax (a streaming read: min, max and whether all are finite),
// then, once the histogram covers the batch's max|x|, count. Each has a
// vector path (histsimd.go, with Go's SIMD experiment) that gives the same
// results as the scalar one.

// minMax returns the min and max of values as a first-of-equals scan finds
// them (so a zero extreme has the sign of the first zero), and whether all
// are finite; with a non-finite value the min and max mean nothing.
func minMax(values []float32) (lo, hi float32, finite bool) {
	if useSIMD && len(values) >= simdMin {
		return minMaxSIMD(values)
	}
	return minMaxScalar(values)
}

// minMaxScalar is minMax with plain comparisons (the min and max builtins
// handle NaN and signed zeros, which costs more than the rest of the loop).
func minMaxScalar(values []float32) (lo, hi float32, finite bool) {
	lo, hi, finite = values[0], values[0], true
	for _, v := range values {
		lo, hi, finite = scanned(v, lo, hi, finite)
	}
	return lo, hi, finite
}

// scanned is one step of a first-of-equals scan for the min and max (and
// whether all are finite) of values: lo, hi and finite after v.
func scanned(v, lo, hi float32, finite bool) (float32, float32, bool) {
	if v-v != 0 { // NaN for NaN and ±Inf
		finite = false
	}
	if v < lo {
		lo = v
	}
	if v > hi {
		hi = v
	}
	return lo, hi, finite
}

// count adds one to the bin of |v|·inv, or to the last bin past it, for
// each of values, which must be finite.
func count(counts []uint64, values []float32, inv float64) {
	if useSIMD && len(values) >= simdMin {
		countSIMD(counts, values, inv)
		return
	}
	countScalar(counts, values, inv)
}

func countScalar(counts []uint64, values []float32, inv float64) {
	last := uint(len(counts) - 1)
	for _, v := range values {
		counts[min(uint(int(math.Abs(float64(v))*inv)), last)]++
	}
}

// countRelu is count for hc and, in the same pass, count of the values'
// ReLU for rc.
func countRelu(hc, rc []uint64, values []float32, inv, rinv float64) {
	if useSIMD && len(values) >= simdMin {
		countReluSIMD(hc, rc, values, inv, rinv)
		return
	}
	countReluScalar(hc, rc, values, inv, rinv)
}

func countReluScalar(hc, rc []uint64, values []float32, inv, rinv float64) {
	last, rlast := uint(len(hc)-1), uint(len(rc)-1)
	for _, v := range values {
		hc[min(uint(int(math.Abs(float64(v))*inv)), last)]++
		// A negative v truncates to a k <= 0, which is ReLU's bin 0.
		kr := int(float64(v) * rinv)
		kr &^= kr >> 63 // 0 when negative, without a branch to mispredict
		rc[min(uint(kr), rlast)]++
	}
}

// countMinMax is count and minMax in one pass: it adds d to the bin of
// each value (1 counts the values; ^uint64(0), minus one, takes back what
// the same call with 1 added) and returns the values' min, max and whether
// all are finite as minMax does. A non-finite value goes into a bin like
// the others (the last, or bin 0 where the conversion to int gives 0), so
// that taking the pass back is exact.
func countMinMax(counts []uint64, values []float32, inv float64, d uint64) (lo, hi float32, finite bool) {
	if useSIMD && len(values) >= simdMin {
		return countMinMaxSIMD(counts, values, inv, d)
	}
	return countMinMaxScalar(counts, values, inv, d)
}

func countMinMaxScalar(counts []uint64, values []float32, inv float64, d uint64) (lo, hi float32, finite bool) {
	last := uint(len(counts) - 1)
	lo, hi, finite = values[0], values[0], true
	for _, v := range values {
		lo, hi, finite = scanned(v, lo, hi, finite)
		counts[min(uint(int(math.Abs(float64(v))*inv)), last)] += d
	}
	return lo, hi, finite
}
