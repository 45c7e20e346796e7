package calibrate

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// addReference is Add as plain loops: the specification the histogram
// kernels (minMax, count and their vector paths) are held to.
func addReference(h *Histogram, values []float32) error {
	if len(values) == 0 {
		return nil
	}
	bmin, bmax := values[0], values[0]
	for i, v := range values {
		if v-v != 0 {
			return &NonFiniteError{Index: i, Value: v}
		}
		if v < bmin {
			bmin = v
		}
		if v > bmax {
			bmax = v
		}
	}
	h.observe(uint64(len(values)), float64(bmin), float64(bmax))
	amax := math.Max(-float64(bmin), float64(bmax))
	if amax == 0 && h.width == 0 {
		h.zeros += uint64(len(values))
		return nil
	}
	h.cover(amax)
	inv := 1 / h.width
	last := len(h.counts) - 1
	for _, v := range values {
		h.counts[min(int(math.Abs(float64(v))*inv), last)]++
	}
	return nil
}

// TestAddKernels: Add leaves exactly addReference's histogram (signed zeros
// of min and max included) and error for batches at the edges: values on
// the last edge, growth, infinities and NaNs in either order; each batch
// also repeated to run the vector paths.
func TestAddKernels(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	tests := []struct {
		name    string
		batches [][]float32
	}{
		{"top edge", [][]float32{{-4, 1, 2}, {4, -4, 4, 0.5}}},
		{"grows", [][]float32{{1, -0.5}, {3, 0.25}, {-100, 2}}},
		{"signed zeros", [][]float32{{1, 0}, {0, negZero, 0.5}, {negZero, 0, 0.5, -0.5}}},
		{"nan", [][]float32{{1, 2}, {0.5, nan, 1}, {0.25}}},
		{"inf before nan", [][]float32{{1, 2}, {0.5, inf, nan}, {0.25}}},
		{"nan before inf", [][]float32{{1, 2}, {nan, -inf}, {0.25}}},
		{"inf only", [][]float32{{1, 2}, {0.5, -inf}, {2}}},
		{"first value", [][]float32{{1, 2}, {nan}, {-1}}},
	}
	for _, tc := range tests {
		tc.name, tc.batches = tc.name+" x37", tile(tc.batches)
		tests = append(tests, tc)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := NewHistogram(), NewHistogram()
			for i, v := range tc.batches {
				errA, errB := addReference(a, v), b.Add(v)
				var nfA, nfB *NonFiniteError
				if errors.As(errA, &nfA) != errors.As(errB, &nfB) || nfA != nil && nfA.Index != nfB.Index {
					t.Fatalf("batch %d: addReference = %v, Add = %v", i, errA, errB)
				}
			}
			if !slices.Equal(a.Counts(), b.Counts()) || a.Count() != b.Count() || a.BinWidth() != b.BinWidth() ||
				math.Float64bits(a.Min()) != math.Float64bits(b.Min()) || math.Float64bits(a.Max()) != math.Float64bits(b.Max()) {
				t.Errorf("Add: n=%d min=%v max=%v bins=%d, want n=%d min=%v max=%v bins=%d",
					b.Count(), b.Min(), b.Max(), b.Bins(), a.Count(), a.Min(), a.Max(), a.Bins())
			}
		})
	}
}

// TestAddKernelsRandom: Add gives exactly addReference's histogram over
// batches that grow the range, one of which holds a NaN.
func TestAddKernelsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := NewHistogram(), NewHistogram()
	for i := range 50 {
		v := make([]float32, 1000+i)
		scale := 1 + float64(i%7)*3
		for j := range v {
			v[j] = float32(rng.NormFloat64() * scale)
		}
		if i == 20 {
			v[500] = float32(math.NaN())
		}
		errA, errB := addReference(a, v), b.Add(v)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("batch %d: addReference = %v, Add = %v", i, errA, errB)
		}
	}
	if d := sameHist(a, b); d != "" {
		t.Errorf("Add and addReference differ in %s", d)
	}
}
