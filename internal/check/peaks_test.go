package check

import (
	"context"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// peakModel is heat -> Sigmoid -> x * Cast(Equal(x, MaxPool(x))), the
// CenterNet peak extraction, with the MaxPool's strides and, when nhwc,
// a Transpose to [N,H,W,C] on every path into the Mul's x.
func peakModel(strides int64, nhwc, swap bool) *onnx.Model {
	b := testmodels.NewBuilder("peaks", 1)
	heat := b.Input("heat", onnx.Float, 1, 1, 8, 8)
	x := b.Node("Sigmoid", []string{heat})
	pool := b.Node("MaxPool", []string{x}, testmodels.Ints("kernel_shape", 3, 3),
		testmodels.Ints("pads", 1, 1, 1, 1), testmodels.Ints("strides", strides, strides))
	a := x
	if nhwc {
		perm := testmodels.Ints("perm", 0, 2, 3, 1)
		a = b.Node("Transpose", []string{x}, perm)
		pool = b.Node("Transpose", []string{pool}, perm)
	}
	eq := b.Node("Equal", []string{a, pool})
	if swap {
		eq = b.Node("Equal", []string{pool, a})
	}
	mask := b.Node("Cast", []string{eq}, testmodels.Int("to", int64(onnx.Float)))
	if swap {
		b.Node("Mul", []string{mask, a})
	} else {
		b.Node("Mul", []string{a, mask})
	}
	b.Rename("scores")
	b.Output("scores", onnx.Float)
	b.Node("Relu", []string{heat})
	b.Rename("plain")
	b.Output("plain", onnx.Float)
	return &onnx.Model{Proto: b.Model(13, 8)}
}

func TestPeakOutputs(t *testing.T) {
	for _, tc := range []struct {
		name          string
		m             *onnx.Model
		found, layout bool
	}{
		{"nchw", peakModel(1, false, false), true, true},
		{"swapped operands", peakModel(1, false, true), true, true},
		{"transposed", peakModel(1, true, false), true, false},
		{"strided pool", peakModel(2, false, false), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PeakOutputs(tc.m)
			p, ok := got["scores"]
			if ok != tc.found {
				t.Fatalf("PeakOutputs = %v, want scores found: %v", got, tc.found)
			}
			if _, plain := got["plain"]; plain {
				t.Errorf("PeakOutputs found the plain Relu output: %v", got)
			}
			if ok && (p.PoolLayout != tc.layout || p.window() != "3x3") {
				t.Errorf("peak = %+v (window %s), want pool layout %v and window 3x3", p, p.window(), tc.layout)
			}
		})
	}
}

// M-LSD's scores are a peak map behind two Reshapes to NHWC; its offsets
// are not.
func TestPeakOutputsMLSD(t *testing.T) {
	m, err := onnx.Load(testutil.Corpus(t, "models", "real", "mlsd_tiny_320.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	got := PeakOutputs(m)
	if p, ok := got["scores"]; !ok || p.PoolLayout || len(got) != 1 {
		t.Fatalf("PeakOutputs(mlsd) = %+v, want only scores, not in the pool layout", got)
	}
	v, ok := got["scores"].viewOf([]int64{1, 160, 160, 1})
	if !ok || v.outer != 1 || v.inner != 1 || v.spatial[0] != 160 || v.radius[1] != 1 {
		t.Errorf("view of [1,160,160,1] = %+v, %v", v, ok)
	}
}

// peaksAt is an h×w map, zero but at the given positions.
func peaksAt(h, w int, at map[[2]int]float32) []float32 {
	v := make([]float32, h*w)
	for p, x := range at {
		v[p[0]*w+p[1]] = x
	}
	return v
}

func TestPeakAgreement(t *testing.T) {
	ref := peaksAt(8, 8, map[[2]int]float32{{1, 1}: 0.9, {5, 5}: 0.1, {6, 1}: 0.5})
	for _, tc := range []struct {
		name              string
		got               []float32
		recall, precision float64
		cosine            float64
	}{
		{"same", ref, 1, 1, 1},
		// A peak one position away is still the same peak; its value is
		// not compared (no co-located pair), the others are.
		{"moved by one", peaksAt(8, 8, map[[2]int]float32{{1, 2}: 0.9, {5, 5}: 0.1, {6, 1}: 0.5}), 1, 1, 1},
		// Two positions away it is lost: 0.9 of the 1.5 of peak mass.
		{"moved by two", peaksAt(8, 8, map[[2]int]float32{{1, 3}: 0.9, {5, 5}: 0.1, {6, 1}: 0.5}), 0.6 / 1.5, 0.6 / 1.5, 1},
		// A tie both sides of a peak keeps recall and precision.
		{"tie", peaksAt(8, 8, map[[2]int]float32{{1, 1}: 0.9, {1, 2}: 0.9, {5, 5}: 0.1, {6, 1}: 0.5}), 1, 1, 1},
		{"extra peak", peaksAt(8, 8, map[[2]int]float32{{1, 1}: 0.9, {5, 5}: 0.1, {6, 1}: 0.5, {3, 7}: 0.5}), 1, 1.5 / 2, 1},
		// Nothing co-located leaves no values to compare: cosine 1, as for
		// two all-zero samples, and the agreement fails.
		{"no peaks", make([]float32, 64), 0, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := NewPeakAccumulator("scores", Peak{Kernel: []int64{3, 3}}, Thresholds{})
			if err := acc.Add(accTensor(t, []int64{1, 8, 8, 1}, ref), accTensor(t, []int64{1, 8, 8, 1}, tc.got), []string{"s"}, false); err != nil {
				t.Fatal(err)
			}
			m := acc.Metrics()
			if m.Kind != KindPeaks || m.AgreementKind != "peaks" || m.PeakWindow != "3x3" {
				t.Fatalf("metrics = %+v, want kind peaks", m)
			}
			if math.Abs(*m.PeakRecall-tc.recall) > 1e-6 || math.Abs(*m.PeakPrecision-tc.precision) > 1e-6 {
				t.Errorf("recall %v precision %v, want %v %v", *m.PeakRecall, *m.PeakPrecision, tc.recall, tc.precision)
			}
			if want := min(tc.recall, tc.precision); math.Abs(*m.Agreement-want) > 1e-6 {
				t.Errorf("agreement %v, want %v", *m.Agreement, want)
			}
			if math.Abs(m.Cosine-tc.cosine) > 1e-6 {
				t.Errorf("cosine at co-located peaks %v, want %v", m.Cosine, tc.cosine)
			}
			fs := Judge(m, Defaults("fp16"))
			if pass := len(fs) == 0; pass != (tc.recall >= 0.98 && tc.precision >= 0.98) {
				t.Errorf("Judge = %v", fs)
			}
		})
	}
}

// Values are compared where both sides have a peak: a peak at the right
// place with half its value fails cosine's neighbour, the norm ratio, and
// the elementwise rule.
func TestPeakValues(t *testing.T) {
	ref := peaksAt(8, 8, map[[2]int]float32{{1, 1}: 0.9, {5, 5}: 0.4})
	got := peaksAt(8, 8, map[[2]int]float32{{1, 1}: 0.45, {5, 5}: 0.4})
	acc := NewPeakAccumulator("scores", Peak{Kernel: []int64{3, 3}}, Defaults("fp32"))
	if err := acc.Add(accTensor(t, []int64{1, 8, 8, 1}, ref), accTensor(t, []int64{1, 8, 8, 1}, got), []string{"s"}, false); err != nil {
		t.Fatal(err)
	}
	m := acc.Metrics()
	if m.Elements != 2 || math.Abs(m.MaxAbs-0.45) > 1e-6 || *m.Agreement != 1 {
		t.Fatalf("metrics = %+v, want 2 co-located values, max abs 0.45, agreement 1", m)
	}
	metrics := map[string]bool{}
	for _, f := range Judge(m, Defaults("fp32")) {
		metrics[f.Metric] = true
	}
	if !metrics["tolerance"] || !metrics["norm_deviation"] || !metrics["cosine"] {
		t.Errorf("failures %v, want tolerance, norm_deviation and cosine", metrics)
	}
}

// A batched NCHW peak map reads its spatial axes from the pool layout and
// keeps the peaks of each sample and channel apart; a shape that does not
// show the spatial axes falls back to the elementwise kinds.
func TestPeakLayouts(t *testing.T) {
	ref := make([]float32, 2*2*4*4) // [N=2,C=2,4,4]
	got := make([]float32, len(ref))
	ref[0*16+1*4+1] = 1 // sample 0, channel 0
	got[1*16+1*4+1] = 1 // sample 0, channel 1: not the same peak
	ref[2*16+0] = 1     // sample 1, channel 0
	got[2*16+1] = 1     // one position away: the same
	acc := NewPeakAccumulator("hm", Peak{Kernel: []int64{3, 3}, PoolLayout: true}, Thresholds{})
	if err := acc.Add(accTensor(t, []int64{2, 2, 4, 4}, ref), accTensor(t, []int64{2, 2, 4, 4}, got), []string{"a", "b"}, true); err != nil {
		t.Fatal(err)
	}
	if m := acc.Metrics(); *m.PeakRecall != 0.5 || *m.PeakPrecision != 0.5 {
		t.Errorf("recall %v precision %v, want 0.5 each", *m.PeakRecall, *m.PeakPrecision)
	}
	amb := NewPeakAccumulator("hm", Peak{Kernel: []int64{3, 3}}, Thresholds{})
	if err := amb.Add(accTensor(t, []int64{1, 4, 4, 2}, make([]float32, 32)), accTensor(t, []int64{1, 4, 4, 2}, make([]float32, 32)), []string{"s"}, false); err != nil {
		t.Fatal(err)
	}
	if m := amb.Metrics(); m.Kind != KindOther || m.Agreement != nil {
		t.Errorf("ambiguous [1,4,4,2] read as %s (agreement %v), want other", m.Kind, m.Agreement)
	}
}

// Compare reads the outputs named in Reference.Peaks as peak maps.
func TestComparePeaks(t *testing.T) {
	ref := peaksAt(8, 8, map[[2]int]float32{{1, 1}: 0.9})
	got := peaksAt(8, 8, map[[2]int]float32{{2, 2}: 0.9})
	feeds := []Feed{{IDs: []string{"s"}, Tensors: map[string]*onnx.Tensor{"x": accTensor(t, []int64{1}, []float32{0})}}}
	r, err := RunReference(context.Background(), fixedRunner{"scores": accTensor(t, []int64{1, 8, 8, 1}, ref)}, feeds, nil)
	if err != nil {
		t.Fatal(err)
	}
	cand := fixedRunner{"scores": accTensor(t, []int64{1, 8, 8, 1}, got)}
	res, err := r.Compare(context.Background(), cand, func(string) Thresholds { return Defaults("fp16") })
	if err != nil || res.Passed() {
		t.Fatalf("without Peaks: %v, %+v; want a failed cosine", err, res)
	}
	r.Peaks = map[string]Peak{"scores": {Kernel: []int64{3, 3}}}
	res, err = r.Compare(context.Background(), cand, func(string) Thresholds { return Defaults("fp16") })
	if err != nil || !res.Passed() || res.Outputs[0].Kind != KindPeaks {
		t.Fatalf("with Peaks: %v, %+v; want a pass read as peaks", err, res)
	}
}

// fixedRunner returns the same outputs for any input.
type fixedRunner map[string]*onnx.Tensor

func (f fixedRunner) Run(context.Context, map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	return f, nil
}
