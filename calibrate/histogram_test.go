package calibrate

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func sum(c []uint64) (s uint64) {
	for _, v := range c {
		s += v
	}
	return s
}

func TestHistogramFirstBatch(t *testing.T) {
	h := histOf(t, []float32{-4, 0, 1, 2, 3.999, 4})
	if h.Bins() != NumBins || h.BinWidth() != 4.0/NumBins || h.Top() != 4 {
		t.Fatalf("after Add: Bins() = %d, BinWidth() = %v, Top() = %v, want %d, %v, 4", h.Bins(), h.BinWidth(), h.Top(), NumBins, 4.0/NumBins)
	}
	c := h.Counts()
	// |x| = 4 lands in the last bin (torch.histc includes the max), 1 at bin 512.
	want := map[int]uint64{0: 1, 512: 1, 1024: 1, 2047: 3}
	for i, n := range c {
		if n != want[i] {
			t.Errorf("Counts()[%d] = %d, want %d", i, n, want[i])
		}
	}
	if h.Count() != 6 || h.Min() != -4 || h.Max() != 4 || h.AbsMax() != 4 {
		t.Errorf("Count, Min, Max, AbsMax = %d, %v, %v, %v, want 6, -4, 4, 4", h.Count(), h.Min(), h.Max(), h.AbsMax())
	}
}

// Growth as in pytorch-quantization: width kept, bins = ceil(max/width).
func TestHistogramGrowth(t *testing.T) {
	tests := []struct {
		name     string
		batches  [][]float32
		wantBins int
	}{
		{"no growth", [][]float32{{1}, {0.5, -1}}, 2048},
		{"exact multiple", [][]float32{{1}, {1.5}}, 3072},
		{"rounds up", [][]float32{{1}, {1.5001}}, 3073},
		{"negative max grows too", [][]float32{{1}, {-2}}, 4096},
		{"several", [][]float32{{1}, {1.25}, {1.1}, {3}}, 6144},
		{"zeros first", [][]float32{{0, 0, 0}, {2}, {3}}, 3072},
		{"coarsened once", [][]float32{{1}, {8.5}}, 17408 / 2},
		{"coarsened twice", [][]float32{{1}, {16.5}}, 33792 / 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := histOf(t, tt.batches...)
			if h.Bins() != tt.wantBins {
				t.Errorf("Bins() = %d, want %d", h.Bins(), tt.wantBins)
			}
			if h.Top() < h.AbsMax() || h.Top()-h.BinWidth() >= h.AbsMax() {
				t.Errorf("Top() = %v, want the first edge at or above max|x| %v", h.Top(), h.AbsMax())
			}
			if sum(h.Counts()) != h.Count() {
				t.Errorf("sum(Counts()) = %d, want Count() %d", sum(h.Counts()), h.Count())
			}
		})
	}
	// Old counts keep their bins.
	h := histOf(t, []float32{0.25, 1}, []float32{2})
	if c := h.Counts(); c[512] != 1 || c[2047] != 1 || c[4095] != 1 || sum(c) != 3 {
		t.Errorf("after growth Counts()[512, 2047, 4095] = %d, %d, %d, want 1, 1, 1", c[512], c[2047], c[4095])
	}
	// Coarsening adds pairs of bins: 0.25 (bin 512) -> 256, 1 (bin 2047) -> 1023.
	h = histOf(t, []float32{0.25, 1}, []float32{8.5})
	if c := h.Counts(); h.BinWidth() != 2.0/NumBins || c[256] != 1 || c[1023] != 1 || c[len(c)-1] != 1 {
		t.Errorf("after coarsening width %v, counts[256, 1023, last] = %d, %d, %d, want 2/2048, 1, 1, 1",
			h.BinWidth(), c[256], c[1023], c[len(c)-1])
	}
}

func TestHistogramRejectsNonFinite(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		h := histOf(t, []float32{1, 2})
		err := h.Add([]float32{0.5, 3, bad, 7})
		var nf *NonFiniteError
		if !errors.As(err, &nf) || nf.Index != 2 {
			t.Errorf("Add(..., %v) = %v, want *NonFiniteError at index 2", bad, err)
		}
		if h.Count() != 2 || h.AbsMax() != 2 || h.Bins() != NumBins || sum(h.Counts()) != 2 {
			t.Errorf("Add(..., %v) changed the histogram: count %d, max %v, bins %d", bad, h.Count(), h.AbsMax(), h.Bins())
		}
	}
}

// Collecting in batches that grow the histogram gives the range of one big
// batch within a bin width (the grids differ: the first batch sets the width).
func TestHistogramBatchesMatchOneBatch(t *testing.T) {
	all := gaussian(1<<20, 1, 21)
	one := histOf(t, all)
	var batches [][]float32
	for i := 0; i < len(all); i += 1 << 14 {
		batches = append(batches, all[i:i+1<<14])
	}
	grown := histOf(t, batches...)
	if grown.Bins() <= NumBins {
		t.Fatalf("batched Bins() = %d, want growth past %d", grown.Bins(), NumBins)
	}
	t.Logf("one batch: %d bins of %.5g; %d batches: %d bins of %.5g", one.Bins(), one.BinWidth(), len(batches), grown.Bins(), grown.BinWidth())
	for _, tt := range []struct {
		method Method
		opts   MethodOptions
		tol    float64 // in bins of the coarser grid
	}{
		{MinMax, MethodOptions{}, 0},
		{Percentile, MethodOptions{Percentile: 99.99}, 1},
		{Percentile, MethodOptions{}, 1},
		{Entropy, MethodOptions{}, 3},
		{MSE, MethodOptions{}, 8}, // flat minimum: 6 bins apart is 0.05% in error
	} {
		a := compute(t, tt.method, one, tt.opts)
		b := compute(t, tt.method, grown, tt.opts)
		if d := math.Abs(a.Amax - b.Amax); d > tt.tol*one.BinWidth() {
			t.Errorf("Compute(%s) batched = %v, one batch = %v: differ by %.2f bins, want <= %v", tt.method, b.Amax, a.Amax, d/one.BinWidth(), tt.tol)
		}
	}
}

func TestHistogramMerge(t *testing.T) {
	a, b := gaussian(1<<16, 1, 31), gaussian(1<<16, 2, 32)
	// Same first-batch max on both sides: same grid, exact merge.
	a[0], b[0] = 20, -20
	whole := histOf(t, append(slices.Clone(a), b...))
	ha, hb := histOf(t, a), histOf(t, b)
	ha.Merge(hb)
	if !slices.Equal(ha.Counts(), whole.Counts()) || ha.Count() != whole.Count() || ha.Min() != whole.Min() || ha.Max() != whole.Max() {
		t.Errorf("Merge with the same width differs from one histogram of all values")
	}
	// Different widths: within a bin of the coarser grid.
	c, d := gaussian(1<<16, 1, 33), gaussian(1<<16, 3, 34)
	whole = histOf(t, append(slices.Clone(c), d...))
	for _, order := range []string{"fine+coarse", "coarse+fine"} {
		h1, h2 := histOf(t, c), histOf(t, d)
		if order == "coarse+fine" {
			h1, h2 = h2, h1
		}
		h1.Merge(h2)
		if h1.Count() != whole.Count() || sum(h1.Counts()) != h1.Count() || h1.Top() < h1.AbsMax() {
			t.Fatalf("%s: count %d, sum %d, top %v, want %d values under max %v", order, h1.Count(), sum(h1.Counts()), h1.Top(), whole.Count(), h1.AbsMax())
		}
		p1 := compute(t, Percentile, h1, MethodOptions{Percentile: 99.9})
		p2 := compute(t, Percentile, whole, MethodOptions{Percentile: 99.9})
		if w := math.Max(h1.BinWidth(), whole.BinWidth()); math.Abs(p1.Amax-p2.Amax) > 2*w {
			t.Errorf("%s: merged percentile %v, one histogram %v, want within 2 bins (%v)", order, p1.Amax, p2.Amax, w)
		}
	}
	// Zero-only and empty histograms.
	z := histOf(t, make([]float32, 10))
	h := histOf(t, []float32{1})
	h.Merge(z)
	h.Merge(NewHistogram())
	h.Merge(nil)
	if h.Count() != 11 || h.Counts()[0] != 10 {
		t.Errorf("merging zeros: Count() = %d, Counts()[0] = %d, want 11, 10", h.Count(), h.Counts()[0])
	}
	z.Merge(histOf(t, []float32{2}))
	if z.Count() != 11 || z.Counts()[0] != 10 || z.BinWidth() != 2.0/NumBins {
		t.Errorf("merging into zeros: Count() = %d, Counts()[0] = %d, width %v", z.Count(), z.Counts()[0], z.BinWidth())
	}
}

func TestHistogramZeroValue(t *testing.T) {
	var h Histogram
	if h.Count() != 0 || !math.IsInf(h.Min(), 1) || !math.IsInf(h.Max(), -1) || h.AbsMax() != 0 {
		t.Errorf("empty: Count, Min, Max, AbsMax = %d, %v, %v, %v, want 0, +Inf, -Inf, 0", h.Count(), h.Min(), h.Max(), h.AbsMax())
	}
	if err := h.Add([]float32{0.5, 2}); err != nil {
		t.Fatal(err)
	}
	var m Histogram
	m.Merge(&h)
	for _, g := range []*Histogram{&h, &m} {
		if g.Count() != 2 || g.Min() != 0.5 || g.Max() != 2 || g.Bins() != NumBins {
			t.Errorf("Count, Min, Max, Bins = %d, %v, %v, %d, want 2, 0.5, 2, %d", g.Count(), g.Min(), g.Max(), g.Bins(), NumBins)
		}
	}
}

func BenchmarkHistogramAdd(b *testing.B) {
	batch := gaussian(1<<16, 1, 1)
	h := histOf(b, batch)
	b.SetBytes(int64(4 * len(batch)))
	for b.Loop() {
		if err := h.Add(batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*float64(len(batch))/b.Elapsed().Seconds(), "values/s")
}
