package calibrate

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

func compute(t testing.TB, m Method, h *Histogram, opts MethodOptions) Range {
	t.Helper()
	r, err := Compute(m, h, opts)
	if err != nil {
		t.Fatalf("Compute(%s) error: %v", m, err)
	}
	if !(r.Scale > 0) || float32(r.Scale) <= 0 || math.Abs(r.Scale-r.Amax/127) > 1e-15*r.Amax {
		t.Errorf("Compute(%s) = amax %v scale %v, want scale = amax/127 > 0", m, r.Amax, r.Scale)
	}
	t.Logf("%-10s amax %-10.5g %s", m, r.Amax, r.Detail)
	return r
}

// TestComputeKnownDistributions checks each method on distributions whose
// answer is known. The entropy bands are what TensorRT's algorithm gives, not
// a free choice: its cut for a Gaussian moves out slowly with the number of
// values (about 3.9-4.3 sigma at 2^16 values, 4.4-4.8 sigma at 2^20-2^22),
// because sparse tail bins cost little KL once empty bins drop out of Q.
func TestComputeKnownDistributions(t *testing.T) {
	const n = 1 << 20
	withOutliers := func(v []float32, o ...float32) []float32 {
		copy(v[1000:], o)
		return v
	}
	outliers := withOutliers(laplace(n, 1, 4), 100, -80, 60)
	farOutlier := withOutliers(laplace(n, 1, 4), 1000)

	tests := []struct {
		name   string
		values []float32
		method Method
		opts   MethodOptions
		lo, hi float64 // amax must be in [lo, hi]
	}{
		// Uniform on [-2, 2]: minmax is the max; entropy keeps (nearly) everything.
		{"uniform/minmax", uniform(n, 2, 1), MinMax, MethodOptions{}, 2 * (1 - 1e-5), 2},
		{"uniform/entropy", uniform(n, 2, 1), Entropy, MethodOptions{}, 1.95, 2},
		{"uniform/percentile", uniform(n, 2, 1), Percentile, MethodOptions{Percentile: 99.99}, 1.995, 2},
		{"uniform/mse", uniform(n, 2, 1), MSE, MethodOptions{}, 1.95, 2},
		// Gaussian sigma 1: P(|x| > 3.8906) = 1e-4, max|x| of 2^20 values ~ 5.
		{"gaussian/minmax", gaussian(n, 1, 1), MinMax, MethodOptions{}, 4.5, 5.6},
		{"gaussian-2^16/entropy", gaussian(1<<16, 1, 1), Entropy, MethodOptions{}, 3.5, 4.5},
		{"gaussian-2^20/entropy", gaussian(n, 1, 1), Entropy, MethodOptions{}, 4.2, 5.0},
		{"gaussian-sigma3/entropy", gaussian(n, 3, 1), Entropy, MethodOptions{}, 3 * 4.2, 3 * 5.0},
		{"gaussian/percentile", gaussian(n, 1, 1), Percentile, MethodOptions{Percentile: 99.99}, 3.89 - 0.1, 3.89 + 0.1},
		{"gaussian/percentile-default", gaussian(n, 1, 1), Percentile, MethodOptions{}, 4.42 - 0.3, 4.42 + 0.3},
		{"gaussian/mse", gaussian(n, 1, 1), MSE, MethodOptions{}, 3.5, 4.5},
		// Laplace b=1 (max|x| ~ 15) with outliers at 100, -80 and 60: entropy,
		// percentile (P(|x| > 9.21) = 1e-4) and mse clip them, minmax keeps them.
		{"laplace+outliers/minmax", outliers, MinMax, MethodOptions{}, 100, 100},
		{"laplace+outliers/entropy", outliers, Entropy, MethodOptions{}, 8, 15},
		{"laplace+outliers/percentile", outliers, Percentile, MethodOptions{Percentile: 99.99}, 9.21 - 0.2, 9.21 + 0.2},
		{"laplace+outliers/mse", outliers, MSE, MethodOptions{}, 8, 50},
		// One outlier at 1000 behind ~1900 empty bins: every cut below it folds
		// the outlier into an empty bin where Q is 0, so KL is +Inf there and
		// EntropyCalibrator2 (like pytorch-quantization) keeps the full range.
		{"laplace+far-outlier/entropy", farOutlier, Entropy, MethodOptions{}, 1000, 1000},
		{"laplace+far-outlier/percentile", farOutlier, Percentile, MethodOptions{Percentile: 99.99}, 9.21 - 0.6, 9.21 + 0.6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := compute(t, tt.method, histOf(t, tt.values), tt.opts)
			if r.Amax < tt.lo || r.Amax > tt.hi {
				t.Errorf("Compute(%s) = amax %v, want in [%v, %v]", tt.method, r.Amax, tt.lo, tt.hi)
			}
			if r.Method != tt.method || !strings.HasPrefix(r.Detail, string(tt.method)) {
				t.Errorf("Compute(%s) = method %q detail %q, want both to name the method", tt.method, r.Method, r.Detail)
			}
		})
	}
}

// ONNX Runtime's default entropy calibrator (128 bins, 128 levels) has a single
// candidate and returns min/max. kiln's must search 2048 bins.
func TestEntropyIsNotDegenerate(t *testing.T) {
	h := histOf(t, laplace(1<<16, 1, 4))
	if h.Bins() != NumBins {
		t.Fatalf("Bins() = %d, want %d", h.Bins(), NumBins)
	}
	r := compute(t, Entropy, h, MethodOptions{})
	if want := "(1921 candidates)"; !strings.Contains(r.Detail, want) {
		t.Errorf("Compute(entropy) detail = %q, want it to contain %q", r.Detail, want)
	}
	if r.Amax >= 0.9*h.AbsMax() {
		t.Errorf("Compute(entropy) = amax %v, want well below max|x| %v (not min/max)", r.Amax, h.AbsMax())
	}
	// With a start bin at the last bin there is one candidate: exactly min/max.
	one := compute(t, Entropy, h, MethodOptions{StartBin: NumBins})
	if one.Amax != h.Top() {
		t.Errorf("Compute(entropy, StartBin %d) = %v, want top edge %v", NumBins, one.Amax, h.Top())
	}
}

func TestComputeAllZero(t *testing.T) {
	for _, m := range Methods() {
		t.Run(string(m), func(t *testing.T) {
			h := histOf(t, make([]float32, 1000), make([]float32, 24))
			r := compute(t, m, h, MethodOptions{})
			if r.Amax != MinAmax || !(float32(r.Scale) > 0) {
				t.Errorf("Compute(%s, zeros) = amax %v scale %v, want amax %v and a positive float32 scale", m, r.Amax, r.Scale, MinAmax)
			}
			if !strings.Contains(r.Detail, "positive scale") {
				t.Errorf("Compute(%s, zeros) detail = %q, want it to explain the replaced amax", m, r.Detail)
			}
		})
	}
}

func TestComputeErrors(t *testing.T) {
	h := histOf(t, gaussian(1000, 1, 1))
	tests := []struct {
		name   string
		method Method
		h      *Histogram
		opts   MethodOptions
		want   string
	}{
		{"empty", Entropy, NewHistogram(), MethodOptions{}, ErrNoValues.Error()},
		{"nil", MinMax, nil, MethodOptions{}, ErrNoValues.Error()},
		{"unknown method", "kl", h, MethodOptions{}, `unknown calibration method "kl"`},
		{"percentile above 100", Percentile, h, MethodOptions{Percentile: 101}, "percentile 101 is not in (0, 100]"},
		{"negative stride", Entropy, h, MethodOptions{Stride: -1}, "stride -1"},
		{"start past bins", Entropy, h, MethodOptions{StartBin: 5000}, "start bin 5000 is above the 2048 bins"},
		{"mse start at last bin", MSE, h, MethodOptions{StartBin: 2048}, "start bin 2048 is not below"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compute(tt.method, tt.h, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Compute(%s) error = %v, want %q", tt.method, err, tt.want)
			}
		})
	}
	if _, err := Compute(Entropy, NewHistogram(), MethodOptions{}); !errors.Is(err, ErrNoValues) {
		t.Errorf("Compute(empty) error = %v, want ErrNoValues", err)
	}
}

func TestParseMethod(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Method
		ok   bool
	}{
		{"entropy", Entropy, true}, {" MinMax ", MinMax, true}, {"percentile", Percentile, true},
		{"mse", MSE, true}, {"max", "", false}, {"", "", false},
	} {
		got, err := ParseMethod(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("ParseMethod(%q) = %q, %v, want %q (ok %v)", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

// refEntropy is a direct transcription of pytorch-quantization's
// _compute_amax_entropy, bin by bin, with np.linspace/np.digitize done in
// floating point, to check the regrouped O(128)-per-candidate sum.
func refEntropy(counts []uint64, start, stride int) []float64 {
	bins := make([]float64, len(counts))
	for i, c := range counts {
		bins[i] = float64(c)
	}
	bins[0] = bins[1]
	var kls []float64
	for i := start; i <= len(bins); i += stride {
		space := make([]float64, levels+1)
		for k := range space {
			space[k] = float64(k) * (float64(i) / levels)
		}
		digit := make([]int, i)
		counter := map[int]int{}
		dens := make([]float64, levels)
		for j := 0; j < i; j++ {
			digit[j] = sort.Search(len(space), func(k int) bool { return space[k] > float64(j) }) - 1
			if bins[j] == 0 {
				digit[j] = -1
				continue
			}
			dens[digit[j]] += bins[j]
			counter[digit[j]]++
		}
		for k, c := range counter {
			dens[k] /= float64(c)
		}
		q := make([]float64, i)
		p := append([]float64(nil), bins[:i]...)
		for j := 0; j < i; j++ {
			if digit[j] != -1 {
				q[j] = dens[digit[j]]
			}
		}
		for _, v := range bins[i:] {
			p[i-1] += v
		}
		var sp, sq float64
		for j := range p {
			sp += p[j]
			sq += q[j]
		}
		kl := 0.0
		for j := range p {
			pj, qj := p[j]/sp, q[j]/sq
			switch {
			case pj == 0:
			case qj == 0 || math.IsNaN(qj):
				kl = math.Inf(1)
			default:
				kl += pj * math.Log(pj/qj)
			}
		}
		kls = append(kls, kl)
	}
	return kls
}

func lastArgmin(kls []float64) int {
	best := 0
	for k, d := range kls {
		if d <= kls[best] {
			best = k
		}
	}
	return best
}

func TestEntropyMatchesDirectTranscription(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	relu := gaussian(1<<16, 1, 5)
	for i, v := range relu {
		relu[i] = max(v, 0)
	}
	sparse := make([]uint64, 600)
	for i := range sparse {
		if r.IntN(3) == 0 {
			sparse[i] = uint64(r.IntN(1000))
		}
	}
	sparse[len(sparse)-1] = 1
	hole := histOf(t, gaussian(1<<16, 1, 6)).Counts()
	hole[300], hole[301] = 0, 0 // candidates 301, 302 have an empty last bin with outliers: KL +Inf
	tests := []struct {
		name          string
		counts        []uint64
		start, stride int
	}{
		{"gaussian", histOf(t, gaussian(1<<16, 1, 1)).Counts(), 128, 1},
		{"laplace", histOf(t, laplace(1<<16, 1, 2)).Counts(), 128, 1},
		{"uniform", histOf(t, uniform(1<<16, 1, 3)).Counts(), 128, 1},
		{"relu", histOf(t, relu).Counts(), 128, 1},
		{"grown", histOf(t, gaussian(100, 1, 8), gaussian(1<<16, 1, 4)).Counts(), 128, 3},
		{"sparse random", sparse, 128, 1},
		{"start below 128", sparse, 50, 1},
		{"empty last bins", hole, 128, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := refEntropy(tt.counts, tt.start, tt.stride)
			got := entropyScan(tt.counts, tt.start, tt.stride)
			if len(got) != len(want) {
				t.Fatalf("entropyScan: %d candidates, want %d", len(got), len(want))
			}
			for k := range want {
				if math.IsInf(want[k], 1) != math.IsInf(got[k], 1) || math.Abs(got[k]-want[k]) > 1e-9 {
					t.Fatalf("entropyScan candidate %d = %v, want %v", tt.start+k*tt.stride, got[k], want[k])
				}
			}
			if g, w := lastArgmin(got), lastArgmin(want); g != w {
				t.Errorf("entropy cut = bin %d, want %d (KL %v vs %v)", tt.start+g*tt.stride, tt.start+w*tt.stride, got[g], want[w])
			}
		})
	}
}

// mseScan regroups by quantization level; check it against the per-bin sum
// with pytorch-quantization's fake quantization (narrow range, round half to
// even) in floating point.
func TestMSEMatchesDirectSum(t *testing.T) {
	tests := []struct {
		name          string
		counts        []uint64
		start, stride int
	}{
		{"laplace", histOf(t, laplace(1<<16, 1, 11)).Counts(), 128, 1},
		{"gaussian grown", histOf(t, gaussian(100, 1, 8), gaussian(1<<16, 1, 4)).Counts(), 128, 5},
		{"small start", histOf(t, uniform(1<<12, 1, 1)).Counts(), 1, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mseScan(tt.counts, tt.start, tt.stride)
			var want []float64
			for i := tt.start; i < len(tt.counts); i += tt.stride {
				amax := float64(i) + 0.5
				scale := 127 / amax
				e := 0.0
				for j, c := range tt.counts {
					x := float64(j) + 0.5
					q := math.Min(math.RoundToEven(x*scale), 127) / scale
					e += float64(c) * (q - x) * (q - x)
				}
				want = append(want, e)
			}
			if len(got) != len(want) {
				t.Fatalf("mseScan: %d candidates, want %d", len(got), len(want))
			}
			gi, wi := 0, 0
			for k := range want {
				if math.Abs(got[k]-want[k]) > 1e-9*want[k] {
					t.Fatalf("mseScan candidate %d = %v, want %v", tt.start+k*tt.stride, got[k], want[k])
				}
				if got[k] < got[gi] {
					gi = k
				}
				if want[k] < want[wi] {
					wi = k
				}
			}
			if gi != wi {
				t.Errorf("mse pick = bin %d, want %d", tt.start+gi*tt.stride, tt.start+wi*tt.stride)
			}
		})
	}
}

func BenchmarkEntropy(b *testing.B) {
	h := histOf(b, gaussian(1<<20, 1, 1))
	for b.Loop() {
		if _, err := Compute(Entropy, h, MethodOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMSE(b *testing.B) {
	h := histOf(b, gaussian(1<<20, 1, 1))
	for b.Loop() {
		if _, err := Compute(MSE, h, MethodOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// A document page after ImageNet normalisation: 8-bit pixels give a few
// hundred discrete values with empty bins between them, and most pixels are
// white, whose three channels are the top of the range (2.25, 2.43, 2.64).
// TensorRT's KL then picks the cut just above the red channel's white, which
// clips the green and blue ones: two thirds of the tensor. The clip limit
// keeps them in range.
func TestEntropyClipLimit(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	mean, std := [3]float64{0.485, 0.456, 0.406}, [3]float64{0.229, 0.224, 0.225}
	page := make([]float32, 3<<15)
	for i := range page {
		level := 255 // paper
		switch k := r.IntN(100); {
		case k < 10:
			level = 0 // ink
		case k < 30:
			level = r.IntN(256) // antialiased edges
		}
		c := i % 3
		page[i] = float32((float64(level)/255 - mean[c]) / std[c])
	}
	h := histOf(t, page)
	clipOf := func(r Range) float64 {
		var n int
		for _, v := range page {
			if float64(v) > r.Amax {
				n++
			}
		}
		return 100 * float64(n) / float64(len(page))
	}
	trt := compute(t, Entropy, h, MethodOptions{EntropyMaxClip: -1})
	if c := clipOf(trt); c < 25 {
		t.Fatalf("unbounded entropy clips %.2f%%; this histogram no longer shows the degenerate cut the limit is for", c)
	}
	for _, limit := range []float64{0, 5, 0.1} {
		got := compute(t, Entropy, h, MethodOptions{EntropyMaxClip: limit})
		want := limit
		if limit == 0 {
			want = DefaultEntropyMaxClip
		}
		if c := clipOf(got); c > want {
			t.Errorf("entropy with limit %v%%: amax %v clips %.3f%% of values", limit, got.Amax, c)
		}
		if !strings.Contains(got.Detail, "above the") {
			t.Errorf("entropy with limit %v%%: detail %q does not say the lowest KL was refused", limit, got.Detail)
		}
	}
	// A tensor whose cut clips little is left as TensorRT cuts it.
	g := histOf(t, gaussian(1<<16, 1, 1))
	if a, b := compute(t, Entropy, g, MethodOptions{}), compute(t, Entropy, g, MethodOptions{EntropyMaxClip: -1}); a != b {
		t.Errorf("gaussian: entropy with the default limit = %+v, without = %+v; want the same", a, b)
	}
}

func TestFirstWithin(t *testing.T) {
	h := histOf(t, laplace(1<<14, 1, 3))
	for _, limit := range []float64{0.001, 0.5, 1, 30, 100} {
		first := firstWithin(h, limit)
		if c := clipped(h, first); c > limit {
			t.Errorf("firstWithin(%v) = %d clips %.4f%%", limit, first, c)
		}
		if first > 0 && clipped(h, first-1) <= limit {
			t.Errorf("firstWithin(%v) = %d, but bin %d clips only %.4f%%", limit, first, first-1, clipped(h, first-1))
		}
	}
	if got := firstWithin(h, -1); got != 0 {
		t.Errorf("firstWithin(-1) = %d, want 0", got)
	}
}
