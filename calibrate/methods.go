package calibrate

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Method is how a range is chosen from a tensor's histogram.
type Method string

// The range methods. Their names are what --method and the ranges file use.
const (
	MinMax     Method = "minmax"     // amax = max|x|
	Percentile Method = "percentile" // amax = edge where the |x| cdf reaches p
	Entropy    Method = "entropy"    // TensorRT EntropyCalibrator2: minimum KL divergence
	MSE        Method = "mse"        // bin centre with the least fake-quantization error
)

// Methods lists the range methods in the order help texts show them.
func Methods() []Method { return []Method{MinMax, Percentile, Entropy, MSE} }

// ParseMethod parses a method name, ignoring case and surrounding space.
func ParseMethod(s string) (Method, error) {
	if m := Method(strings.ToLower(strings.TrimSpace(s))); m.valid() {
		return m, nil
	}
	return "", fmt.Errorf("unknown calibration method %q (want minmax, percentile, entropy or mse)", s)
}

// DefaultPercentile is the percentile used when MethodOptions.Percentile is 0
// (ONNX Runtime's default; pytorch-quantization uses 99.99).
const DefaultPercentile = 99.999

// levels is the number of quantized levels on |x| for signed int8.
const levels = 128

// MinAmax replaces an amax of 0 (a tensor that was always zero): TensorRT and
// the Q/DQ operators need a positive scale. It is pytorch-quantization's
// epsilon for a zero amax; any positive scale quantizes zeros to 0.
const MinAmax = 1.0 / (1 << 24)

// ErrNoValues is returned by Compute for a histogram that saw no values, such
// as a tensor that calibration never produced.
var ErrNoValues = errors.New("no values collected")

// MethodOptions tunes the methods. The zero value gives the defaults.
type MethodOptions struct {
	// Percentile is p in (0, 100] for the percentile method; 0 means
	// DefaultPercentile.
	Percentile float64
	// StartBin is the first candidate cut for entropy and mse; 0 means 128.
	StartBin int
	// Stride is the step between candidate cuts for entropy and mse; 0 means 1.
	Stride int
	// EntropyMaxClip is the largest share of a tensor's values, in percent,
	// that an entropy cut may clip; 0 means DefaultEntropyMaxClip and a
	// negative value means no limit (TensorRT's EntropyCalibrator2 as is).
	EntropyMaxClip float64
}

// DefaultEntropyMaxClip bounds the entropy method's cut. KL divergence over a
// histogram with a tall spike (a document page's white background at the
// input, a saturated activation) can be smallest at a cut below the spike,
// which then clips most of the tensor: on PP-OCRv4 det's input, 59% of the
// values, and the int8 detector's cosine against fp32 falls to 0.04. Cuts
// that ordinary tensors get clip 0.001-0.5%.
const DefaultEntropyMaxClip = 1.0

func (o MethodOptions) withDefaults() (MethodOptions, error) {
	if o.Percentile == 0 {
		o.Percentile = DefaultPercentile
	}
	if o.StartBin == 0 {
		o.StartBin = levels
	}
	if o.Stride == 0 {
		o.Stride = 1
	}
	if o.EntropyMaxClip == 0 {
		o.EntropyMaxClip = DefaultEntropyMaxClip
	}
	switch {
	case !(o.Percentile > 0 && o.Percentile <= 100):
		return o, fmt.Errorf("percentile %v is not in (0, 100]", o.Percentile)
	case o.StartBin < 1:
		return o, fmt.Errorf("start bin %d is not positive", o.StartBin)
	case o.Stride < 1:
		return o, fmt.Errorf("stride %d is not positive", o.Stride)
	case math.IsNaN(o.EntropyMaxClip) || o.EntropyMaxClip > 100:
		return o, fmt.Errorf("entropy clip limit %v%% is not in (0, 100]", o.EntropyMaxClip)
	}
	return o, nil
}

// Range is the symmetric quantization range chosen for one tensor:
// [-Amax, +Amax] with Scale = Amax/127, and why it was chosen.
type Range struct {
	Method Method
	Amax   float64
	Scale  float64
	Detail string
}

// Compute chooses a range from a histogram with the given method.
// It returns ErrNoValues when the histogram is empty. An amax of 0 becomes
// MinAmax so that the scale is always positive; Detail says so.
func Compute(method Method, h *Histogram, opts MethodOptions) (Range, error) {
	if !method.valid() {
		return Range{}, fmt.Errorf("unknown calibration method %q", string(method))
	}
	if h == nil || h.n == 0 {
		return Range{}, ErrNoValues
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return Range{}, err
	}
	switch {
	case method == MinMax || h.width == 0: // h.width == 0: every value was 0
		amax := h.AbsMax()
		return finish(method, amax, fmt.Sprintf("%s: max|x| %.6g (min %.6g, max %.6g) over %d values",
			method, amax, h.min, h.max, h.n)), nil
	case method == Percentile:
		return percentileRange(h, opts.Percentile), nil
	case method == Entropy:
		return entropyRange(h, opts)
	default:
		return mseRange(h, opts)
	}
}

func (m Method) valid() bool {
	for _, known := range Methods() {
		if m == known {
			return true
		}
	}
	return false
}

// finish derives the scale and guards against scales TensorRT refuses.
func finish(m Method, amax float64, detail string) Range {
	const minScale = 0x1p-126 // smallest normal float32
	switch {
	case !(amax > 0):
		amax = MinAmax
		detail += fmt.Sprintf("; amax 0 replaced by 2^-24 (scale %.3g) because TensorRT needs a positive scale", amax/127)
	case amax/127 < minScale:
		amax = minScale * 127
		detail += "; scale raised to the smallest normal float32"
	}
	return Range{Method: m, Amax: amax, Scale: amax / 127, Detail: detail}
}

// clipped is the percentage of values in bins [from, Bins()).
func clipped(h *Histogram, from int) float64 {
	var c uint64
	for _, n := range h.counts[min(from, len(h.counts)):] {
		c += n
	}
	return 100 * float64(c) / float64(h.n)
}

// percentileRange follows pytorch-quantization's _compute_amax_percentile:
// amax = bin_edges[searchsorted(cumsum(hist/total), p/100)], i.e. the lower
// edge of the first bin where the cdf reaches p.
func percentileRange(h *Histogram, p float64) Range {
	total := float64(h.n)
	target := p / 100
	idx := len(h.counts)
	cdf := 0.0
	for j, c := range h.counts {
		cdf += float64(c) / total
		if cdf >= target {
			idx = j
			break
		}
	}
	return finish(Percentile, h.Edge(idx), fmt.Sprintf("percentile %g: cut at bin %d of %d, clips %.4g%% of values",
		p, idx, len(h.counts), clipped(h, idx)))
}

// entropyRange is TensorRT's EntropyCalibrator2 as pytorch-quantization's
// _compute_amax_entropy implements it. With b the |x| histogram after
// b[0] = b[1], T = sum(b) and, for a candidate cut i in StartBin..len(b):
//
//   - P is b[:i] with the outliers O = sum(b[i:]) added to P[i-1];
//   - bin j < i belongs to group floor(128*j/i) (np.digitize over
//     linspace(0, i, 129)); each group's total G is spread evenly over its m
//     non-empty bins and empty bins stay 0, giving Q;
//   - KL(P||Q) = sum p ln(p/q) over p > 0 after normalising both.
//
// The sum is regrouped so that each candidate costs O(128) instead of O(i):
// with c the P counts and Qt = sum(b[:i]),
//
//	KL = (sum c ln c - sum_g G ln(G/m) + Qt ln Qt - O ln q[i-1]) / T - ln T
//
// using prefix sums of b, of b ln b and of the number of non-empty bins. It
// picks the last i of minimum KL and amax = bin_edges[i]. A test checks it
// against a direct per-bin transcription. A candidate with P > 0 where Q = 0
// (empty bin i-1 with outliers) has KL +Inf, as in scipy; a candidate whose
// Q is all zero is +Inf too (scipy gives NaN there, and NaN would win argmin).
func entropyRange(h *Histogram, opts MethodOptions) (Range, error) {
	n := len(h.counts)
	if opts.StartBin > n {
		return Range{}, fmt.Errorf("entropy: start bin %d is above the %d bins of the histogram", opts.StartBin, n)
	}
	kls := entropyScan(h.counts, opts.StartBin, opts.Stride)
	first := firstWithin(h, opts.EntropyMaxClip)
	best, bestKL := n, math.Inf(1)
	unbounded, unboundedKL := n, math.Inf(1)
	for k, d := range kls {
		i := opts.StartBin + k*opts.Stride
		if d <= unboundedKL { // last argmin; +Inf everywhere keeps the full range
			unbounded, unboundedKL = i, d
		}
		if d <= bestKL && i >= first {
			best, bestKL = i, d
		}
	}
	detail := fmt.Sprintf("entropy: cut at bin %d of %d (%d candidates), KL %.4g, clips %.4g%% of values",
		best, n, len(kls), bestKL, clipped(h, best))
	if unbounded < first {
		detail += fmt.Sprintf("; the lowest KL, at bin %d, clips %.4g%%, above the %g%% limit", unbounded, clipped(h, unbounded), opts.EntropyMaxClip)
	}
	return finish(Entropy, h.Edge(best), detail), nil
}

// firstWithin is the lowest cut that clips at most limit percent of h's
// values (0 for a negative limit: any cut).
func firstWithin(h *Histogram, limit float64) int {
	if limit < 0 {
		return 0
	}
	allowed := uint64(limit / 100 * float64(h.n))
	var above uint64
	for i := len(h.counts); i > 0; i-- {
		if above+h.counts[i-1] > allowed {
			return i
		}
		above += h.counts[i-1]
	}
	return 0
}

// entropyScan returns KL(P||Q) for the candidate cuts start, start+stride, ... <= len(counts).
func entropyScan(counts []uint64, start, stride int) []float64 {
	n := len(counts)
	b := make([]float64, n)
	for j, c := range counts {
		b[j] = float64(c)
	}
	if n > 1 {
		b[0] = b[1] // suppress the spike of exact zeros (ReLU), as pytorch-quantization does
	}
	sum := make([]float64, n+1)  // sum of b[:k]
	nz := make([]int, n+1)       // number of non-empty bins in b[:k]
	blnb := make([]float64, n+1) // sum of b ln b over b[:k]
	for j, v := range b {
		sum[j+1], nz[j+1], blnb[j+1] = sum[j]+v, nz[j], blnb[j]
		if v > 0 {
			nz[j+1]++
			blnb[j+1] += v * math.Log(v)
		}
	}
	total := sum[n]
	lnTotal := math.Log(total)
	group := func(g, i int) (mass float64, members int) {
		s, e := (g*i+levels-1)/levels, ((g+1)*i+levels-1)/levels
		return sum[e] - sum[s], nz[e] - nz[s]
	}
	var kls []float64
	for i := start; i <= n; i += stride {
		qt := sum[i]
		out := total - qt
		last := b[i-1]
		if qt == 0 || (last == 0 && out > 0) {
			kls = append(kls, math.Inf(1))
			continue
		}
		num := blnb[i-1] + qt*math.Log(qt)
		if c := last + out; c > 0 {
			num += c * math.Log(c)
		}
		for g := 0; g < levels; g++ {
			if mass, m := group(g, i); m > 0 {
				num -= mass * math.Log(mass/float64(m))
			}
		}
		if out > 0 {
			mass, m := group(levels*(i-1)/i, i)
			num -= out * math.Log(mass/(float64(m)*qt))
		}
		kls = append(kls, num/total-lnTotal)
	}
	return kls
}

// mseRange follows pytorch-quantization's _compute_amax_mse: for every bin i
// from StartBin to the last but one, amax = centre of bin i, and the error is
// sum(count * (fakequant(centre) - centre)^2) over all bins with symmetric
// narrow-range int8 fake quantization (scale 127/amax, round half to even,
// clamp to [-127, 127]). It picks the first i of minimum error.
func mseRange(h *Histogram, opts MethodOptions) (Range, error) {
	n := len(h.counts)
	if opts.StartBin >= n {
		return Range{}, fmt.Errorf("mse: start bin %d is not below the %d bins of the histogram", opts.StartBin, n)
	}
	errs := mseScan(h.counts, opts.StartBin, opts.Stride)
	best := 0
	for k, e := range errs {
		if e < errs[best] {
			best = k
		}
	}
	bin := opts.StartBin + best*opts.Stride
	amax := (float64(bin) + 0.5) * h.width
	return finish(MSE, amax, fmt.Sprintf("mse: centre of bin %d of %d, mean squared error %.4g, clips %.4g%% of values",
		bin, n, errs[best]*h.width*h.width/float64(h.n), clipped(h, bin+1))), nil
}

// mseScan returns the fake-quantization error, in units of bin width
// squared, for amax at the centre of bins start, start+stride, ... < len(counts).
//
// In bin units a centre is c = j+0.5 and amax is i+0.5, so bin j quantizes to
// level k = round(127(2j+1)/(2i+1)), never a tie (odd over odd, times 127),
// clamped to 127, and dequantizes to q = k(2i+1)/254. The bins of one level
// form a run of j, so the error is a sum over the 128 levels of
// q²·N - 2q·C1 + C2, with N, C1, C2 prefix sums of count, count·c and
// count·c²: O(128) per candidate instead of O(bins). A test checks it against
// the per-bin sum.
func mseScan(counts []uint64, start, stride int) []float64 {
	n := len(counts)
	p0, p1, p2 := make([]float64, n+1), make([]float64, n+1), make([]float64, n+1)
	for j, c := range counts {
		cnt, x := float64(c), float64(j)+0.5
		p0[j+1], p1[j+1], p2[j+1] = p0[j]+cnt, p1[j]+cnt*x, p2[j]+cnt*x*x
	}
	var errs []float64
	for i := start; i < n; i += stride {
		d := 2*i + 1
		// first(k) is the first bin that rounds to level k or above:
		// 127(2j+1)/(2i+1) > k-1/2  <=>  508j > (2k-1)d - 254.
		first := func(k int) int {
			num := (2*k-1)*d - 254
			if num < 0 {
				return 0
			}
			return min(num/508+1, n)
		}
		e, lo := 0.0, 0
		for k := 0; k <= 127; k++ {
			hi := n
			if k < 127 {
				hi = first(k + 1)
			}
			if hi > lo {
				q := float64(k) * float64(d) / 254
				e += q*q*(p0[hi]-p0[lo]) - 2*q*(p1[hi]-p1[lo]) + (p2[hi] - p2[lo])
			}
			lo = hi
		}
		errs = append(errs, e)
	}
	return errs
}
