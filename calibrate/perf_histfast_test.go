package calibrate

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// TestAddFastEdges: addFast leaves exactly Add's histogram (signed zeros of
// min and max included) and Add's error for batches at the edges of its fast
// path: values on the last edge, growth, infinities and NaNs in either order.
func TestAddFastEdges(t *testing.T) {
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
		t.Run(tc.name, func(t *testing.T) {
			a, b := NewHistogram(), NewHistogram()
			for i, v := range tc.batches {
				errA, errB := a.Add(v), b.addFast(v)
				var nfA, nfB *NonFiniteError
				if errors.As(errA, &nfA) != errors.As(errB, &nfB) || nfA != nil && nfA.Index != nfB.Index {
					t.Fatalf("batch %d: Add = %v, addFast = %v", i, errA, errB)
				}
			}
			if !slices.Equal(a.Counts(), b.Counts()) || a.Count() != b.Count() || a.BinWidth() != b.BinWidth() ||
				math.Float64bits(a.Min()) != math.Float64bits(b.Min()) || math.Float64bits(a.Max()) != math.Float64bits(b.Max()) {
				t.Errorf("addFast: n=%d min=%v max=%v bins=%d, want Add's n=%d min=%v max=%v bins=%d",
					b.Count(), b.Min(), b.Max(), b.Bins(), a.Count(), a.Min(), a.Max(), a.Bins())
			}
		})
	}
}
