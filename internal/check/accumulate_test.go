package check

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/x448/float16"

	"github.com/kiln-ml/kiln/onnx"
)

// accTensor builds a tensor for these tests; data's Go type sets its type.
func accTensor(t testing.TB, dims []int64, data any) *onnx.Tensor {
	t.Helper()
	x, err := onnx.NewTensor("out", dims, data)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func f16s(v ...float32) []float16.Float16 {
	out := make([]float16.Float16, len(v))
	for i, x := range v {
		out[i] = float16.Fromfloat32(x)
	}
	return out
}

func bf16s(v ...float32) []onnx.BF16 {
	out := make([]onnx.BF16, len(v))
	for i, x := range v {
		out[i] = onnx.BF16From(x)
	}
	return out
}

// accumulate runs one Add per batch and returns the metrics.
func accumulate(t *testing.T, kind Kind, th Thresholds, batched bool, batches ...accBatch) Metrics {
	t.Helper()
	a := NewAccumulator("out", kind, th)
	for _, b := range batches {
		if err := a.Add(accTensor(t, b.dims, b.ref), accTensor(t, b.dims, b.got), b.ids, batched); err != nil {
			t.Fatalf("Add(%v) = %v, want nil", b.ids, err)
		}
	}
	m := a.Metrics()
	if _, err := json.Marshal(m); err != nil {
		t.Errorf("json.Marshal(Metrics) = %v, want nil", err)
	}
	return m
}

type accBatch struct {
	dims     []int64
	ref, got any
	ids      []string
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }

func ptrIs(p *float64, want float64) bool { return p != nil && near(*p, want) }

func TestAccumulatorIdentical(t *testing.T) {
	data := []float32{1, 2, 3, 4, 5, 6, -7, 0, 9, 10, 11, 12}
	m := accumulate(t, KindClassifier, Defaults("fp32"), true,
		accBatch{[]int64{2, 6}, data, data, []string{"a", "b"}})
	want := Metrics{Output: "out", Kind: KindClassifier, Samples: 2, Elements: 12,
		Cosine: 1, WorstCosine: 1, WorstSample: "a", NormRatio: 1}
	one := 1.0
	want.Top1, want.Top5 = &one, &one
	if m.Top1 == nil || m.Top5 == nil || *m.Top1 != 1 || *m.Top5 != 1 {
		t.Fatalf("Metrics() top-k = %v, %v, want 1, 1", m.Top1, m.Top5)
	}
	m.Top1, m.Top5 = want.Top1, want.Top5
	if m != want {
		t.Errorf("Metrics() = %+v, want %+v", m, want)
	}
	if fs := Judge(m, Defaults("fp32")); len(fs) != 0 {
		t.Errorf("Judge(identical) = %v, want no failures", fs)
	}
}

func TestAccumulatorElementwise(t *testing.T) {
	// d = |got-ref| = [0.5, 0, 0.25, 1]; |ref| = [1, 2, 0, 4].
	ref := []float64{1, -2, 0, 4}
	got := []float64{1.5, -2, 0.25, 3}
	cos := (1*1.5 + 4 + 0 + 4*3) / math.Sqrt((1+4+0+16)*(2.25+4+0.0625+9))
	for _, tc := range []struct {
		name             string
		th               Thresholds
		minATol, minRTol float64
		outside          int64
	}{
		// d - 0.1|ref| = [0.4, -0.2, 0.25, 0.6]; ref == 0 and d 0.25 > atol 0.1: no rtol passes.
		{"unbounded rtol", Thresholds{ATol: 0.1, RTol: 0.1}, 0.6, math.MaxFloat64, 3},
		// (d - 0.3)/|ref| = [0.2, <0, -, 0.175]; element 2 (0.25 <= 0.3) passes by atol.
		{"bounded rtol", Thresholds{ATol: 0.3, RTol: 0.1}, 0.6, 0.2, 2},
		// rtol 0: MinATol is MaxAbs; atol 0: MinRTol is MaxRel but ref == 0 differs.
		{"no tolerance", Thresholds{}, 1, math.MaxFloat64, 3},
		// d - |ref| = [-0.5, -2, 0.25, -3]: only the zero reference needs atol.
		{"loose", Thresholds{ATol: 1, RTol: 1}, 0.25, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := accumulate(t, KindOther, tc.th, false, accBatch{[]int64{4}, ref, got, []string{"x"}})
			for _, c := range []struct {
				name      string
				got, want float64
			}{
				{"MaxAbs", m.MaxAbs, 1},
				{"MaxRel", m.MaxRel, 0.5},
				{"MeanAbs", m.MeanAbs, 1.75 / 4},
				{"Cosine", m.Cosine, cos},
				{"WorstCosine", m.WorstCosine, cos},
				{"MinATol", m.MinATol, tc.minATol},
				{"MinRTol", m.MinRTol, tc.minRTol},
			} {
				if !near(c.got, c.want) {
					t.Errorf("Metrics().%s = %v, want %v", c.name, c.got, c.want)
				}
			}
			if m.Outside != tc.outside || m.Elements != 4 || m.Samples != 1 {
				t.Errorf("Metrics() Outside, Elements, Samples = %d, %d, %d, want %d, 4, 1", m.Outside, m.Elements, m.Samples, tc.outside)
			}
			if wantSample := map[bool]string{true: "x"}[tc.outside > 0]; m.ToleranceSample != wantSample {
				t.Errorf("Metrics().ToleranceSample = %q, want %q", m.ToleranceSample, wantSample)
			}
			if m.Top1 != nil || m.Agreement != nil {
				t.Errorf("Metrics() of KindOther has Top1 %v, Agreement %v, want nil", m.Top1, m.Agreement)
			}
		})
	}
}

func TestAccumulatorWorstSample(t *testing.T) {
	// a: [1,0]·[1,0] = 1; b: [1,0]·[0,1] = 0; c: [1,1]·[1,0] = 1/√2.
	m := accumulate(t, KindOther, Thresholds{ATol: 0.5}, true,
		accBatch{[]int64{2, 2}, []float32{1, 0, 1, 0}, []float32{1, 0, 0, 1}, []string{"a", "b"}},
		accBatch{[]int64{1, 2}, []float32{1, 1}, []float32{1, 0}, []string{"c"}})
	if m.Samples != 3 || m.WorstSample != "b" || m.WorstCosine != 0 {
		t.Errorf("Metrics() Samples, WorstSample, WorstCosine = %d, %q, %v, want 3, b, 0", m.Samples, m.WorstSample, m.WorstCosine)
	}
	if want := (1 + 0 + 1/math.Sqrt2) / 3; !near(m.Cosine, want) {
		t.Errorf("Metrics().Cosine = %v, want %v", m.Cosine, want)
	}
	// b: |1-0| = 1 and |0-1| = 1 exceed atol 0.5 by 0.5; c: |1-0| by 0.5 too,
	// and the first sample furthest outside is named.
	if m.Outside != 3 || m.ToleranceSample != "b" || m.MinATol != 1 {
		t.Errorf("Metrics() Outside, ToleranceSample, MinATol = %d, %q, %v, want 3, b, 1", m.Outside, m.ToleranceSample, m.MinATol)
	}
}

func TestAccumulatorZeroSamples(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ref, got []float32
		want     float64
	}{
		{"both zero", []float32{0, 0}, []float32{0, 0}, 1},
		{"reference zero", []float32{0, 0}, []float32{1, 0}, 0},
		{"candidate zero", []float32{0, 3}, []float32{0, 0}, 0},
		{"opposite", []float32{1, 2}, []float32{-1, -2}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := accumulate(t, KindOther, Thresholds{}, false, accBatch{[]int64{2}, tc.ref, tc.got, []string{"s"}})
			if m.Cosine != tc.want {
				t.Errorf("Metrics().Cosine = %v, want %v", m.Cosine, tc.want)
			}
		})
	}
}

func TestAccumulatorClassifier(t *testing.T) {
	ref := []float32{
		0, 0, 9, 0, 0, 0, 0, // s0: argmax 2
		5, 1, 1, 1, 1, 1, 1, // s1: argmax 0
		9, 0, 0, 0, 0, 0, 0, // s2: argmax 0
		0, 4, 0, 0, 0, 0, 0, // s3: argmax 1
	}
	got := []float32{
		0, 0, 9, 0, 0, 0, 0, // same: top-1
		5, 6, 7, 8, 0, 0, 0, // 3 values above class 0: top-5 only
		1, 2, 3, 4, 5, 6, 0, // 5 values above class 0: neither
		4, 4, 0, 0, 0, 0, 0, // tie with class 0, which comes first: top-5 only
	}
	ids := []string{"s0", "s1", "s2", "s3"}
	for _, tc := range []struct {
		name string
		dims []int64
	}{
		{"[N,C]", []int64{4, 7}},
		{"[N,C,1,1]", []int64{4, 7, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := accumulate(t, KindOf(tc.dims, true), Thresholds{}, true, accBatch{tc.dims, ref, got, ids})
			if m.Kind != KindClassifier || !ptrIs(m.Top1, 1.0/4) || !ptrIs(m.Top5, 3.0/4) {
				t.Errorf("Metrics() Kind, Top1, Top5 = %s, %v, %v, want classifier, 0.25, 0.75", m.Kind, deref(m.Top1), deref(m.Top5))
			}
		})
	}
	t.Run("five classes", func(t *testing.T) {
		m := accumulate(t, KindClassifier, Thresholds{}, false,
			accBatch{[]int64{5}, []float32{1, 2, 3, 4, 5}, []float32{5, 4, 3, 2, 1}, []string{"x"}})
		if !ptrIs(m.Top1, 0) || m.Top5 != nil {
			t.Errorf("Metrics() Top1, Top5 = %v, %v, want 0, nil", deref(m.Top1), m.Top5)
		}
	})
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestAccumulatorDense(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dims     []int64
		ref, got []float32
		kind     string
		want     float64
	}{
		// argmax over C=2: ref [0,1,0,1], got [0,0,1,1] per position.
		{"argmax", []int64{1, 2, 2, 2}, []float32{1, 0, 1, 0, 0, 1, 0, 1}, []float32{1, 1, 0, 0, 0, 0, 1, 1}, "argmax", 0.5},
		// > 0.5: ref [T,F,T,F], got [T,T,F,F].
		{"mask C=1", []int64{1, 1, 2, 2}, []float32{0.9, 0.1, 0.6, 0.4}, []float32{0.8, 0.6, 0.4, 0.3}, "mask", 0.5},
		// [N,1,L]; 0.5 itself is unset: ref [T,F,F,T], got [T,F,T,F].
		{"mask rank 3", []int64{1, 1, 4}, []float32{0.7, 0.2, 0.5, 0.9}, []float32{0.6, 0.3, 0.51, 0.1}, "mask", 0.5},
		// two samples of C=3 over 1 position: argmax 2 and 0 vs 2 and 1.
		{"argmax two samples", []int64{2, 3, 1, 1, 1}, []float32{0, 1, 2, 5, 0, 0}, []float32{0, 1, 3, 0, 5, 0}, "argmax", 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := []string{"a", "b"}[:tc.dims[0]]
			m := accumulate(t, KindOf(tc.dims, true), Thresholds{}, true, accBatch{tc.dims, tc.ref, tc.got, ids})
			if m.Kind != KindDense || !ptrIs(m.Agreement, tc.want) || m.AgreementKind != tc.kind {
				t.Errorf("Metrics() Kind, Agreement, AgreementKind = %s, %v, %q, want dense, %v, %q",
					m.Kind, deref(m.Agreement), m.AgreementKind, tc.want, tc.kind)
			}
			if wantTh := map[string]float64{"mask": 0.5}[tc.kind]; m.MaskThreshold != wantTh {
				t.Errorf("Metrics().MaskThreshold = %v, want %v", m.MaskThreshold, wantTh)
			}
		})
	}
}

func TestAccumulatorNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	ref := []float32{1, 2, nan, 4}
	got := []float32{nan, 2, nan, inf}
	m := accumulate(t, KindOther, Defaults("fp32"), false, accBatch{[]int64{4}, ref, got, []string{"x"}})
	if m.NaN != 2 || m.Inf != 1 || m.RefNaN != 1 || m.RefInf != 0 || m.Elements != 4 {
		t.Errorf("Metrics() NaN, Inf, RefNaN, RefInf, Elements = %d, %d, %d, %d, %d, want 2, 1, 1, 0, 4",
			m.NaN, m.Inf, m.RefNaN, m.RefInf, m.Elements)
	}
	// Only element 1 (2 against 2) is finite on both sides.
	if m.MaxAbs != 0 || m.MeanAbs != 0 || m.Cosine != 1 {
		t.Errorf("Metrics() MaxAbs, MeanAbs, Cosine = %v, %v, %v, want 0, 0, 1", m.MaxAbs, m.MeanAbs, m.Cosine)
	}
	fs := Judge(m, Defaults("fp32"))
	if len(fs) != 2 || fs[0].Metric != "nan" || fs[0].Value != 2 || fs[0].Threshold != 1 || fs[1].Metric != "inf" {
		t.Errorf("Judge(non-finite) = %v, want nan 2 > 1 and inf 1 > 0", fs)
	}
	allow := Defaults("fp32")
	allow.AllowNonFinite = true
	if fs := Judge(m, allow); len(fs) != 0 {
		t.Errorf("Judge(non-finite, AllowNonFinite) = %v, want none", fs)
	}
	same := accumulate(t, KindOther, Defaults("fp32"), false, accBatch{[]int64{2}, []float32{nan, 1}, []float32{nan, 1}, []string{"x"}})
	if fs := Judge(same, Defaults("fp32")); len(fs) != 0 {
		t.Errorf("Judge(NaN where the reference has NaN) = %v, want none", fs)
	}
}

func TestAccumulatorTypes(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		kind                 Kind
		ref, got             any
		maxAbs, maxRel, mean float64
		wantKind             Kind
	}{
		// d = [0, 0.25, 0]: 0.25/0.5.
		{"float16", KindClassifier, f16s(1, 0.5, -2), f16s(1, 0.75, -2), 0.25, 0.5, 0.25 / 3, KindClassifier},
		{"float32 against float16", KindOther, []float32{1, 0.5, -2}, f16s(1, 0.75, -2), 0.25, 0.5, 0.25 / 3, KindOther},
		{"bfloat16", KindOther, bf16s(1, 0.5, -2), bf16s(1, 0.75, -2), 0.25, 0.5, 0.25 / 3, KindOther},
		// d = [0, 1, 2]: max(1/5, 2/7).
		{"int64", KindClassifier, []int64{3, 5, 7}, []int64{3, 4, 9}, 2, 2.0 / 7, 1, KindOther},
		{"int64 against int32", KindOther, []int64{3, 5, 7}, []int32{3, 4, 9}, 2, 2.0 / 7, 1, KindOther},
		{"uint8", KindOther, []uint8{3, 5, 7}, []uint8{3, 4, 9}, 2, 2.0 / 7, 1, KindOther},
		// d = [0, 1, 1]: the false reference has no relative error, 1/1 for the other.
		{"bool", KindClassifier, []bool{true, false, true}, []bool{true, true, false}, 1, 1, 2.0 / 3, KindOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccumulator("out", tc.kind, Thresholds{})
			if err := a.Add(accTensor(t, []int64{3}, tc.ref), accTensor(t, []int64{3}, tc.got), []string{"x"}, false); err != nil {
				t.Fatalf("Add() = %v, want nil", err)
			}
			m := a.Metrics()
			if !near(m.MaxAbs, tc.maxAbs) || !near(m.MaxRel, tc.maxRel) || !near(m.MeanAbs, tc.mean) || m.Kind != tc.wantKind {
				t.Errorf("Metrics() MaxAbs, MaxRel, MeanAbs, Kind = %v, %v, %v, %s, want %v, %v, %v, %s",
					m.MaxAbs, m.MaxRel, m.MeanAbs, m.Kind, tc.maxAbs, tc.maxRel, tc.mean, tc.wantKind)
			}
		})
	}
}

func TestAccumulatorExtremes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ref, got   []float64
		cos, maxAb float64
	}{
		// r·g overflows: the scaled pass finds [1,1]·[1,-1] = 0.
		{"huge", []float64{1e300, 1e300}, []float64{1e300, -1e300}, 0, 2e300},
		// |g-r| overflows: reported as the largest float64.
		{"overflowing error", []float64{-1.5e308, 1}, []float64{1.5e308, 1}, -1, math.MaxFloat64},
		// r*r underflows to 0: the scaled pass still sees equal vectors.
		{"tiny", []float64{1e-200, 2e-200}, []float64{1e-200, 2e-200}, 1, 0},
		{"subnormal", []float64{5e-324, 0}, []float64{0, 5e-324}, 0, 5e-324},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := accumulate(t, KindOther, Thresholds{RTol: 1e-3}, false, accBatch{[]int64{2}, tc.ref, tc.got, []string{"x"}})
			if !near(m.Cosine, tc.cos) || m.MaxAbs != tc.maxAb {
				t.Errorf("Metrics() Cosine, MaxAbs = %v, %v, want %v, %v", m.Cosine, m.MaxAbs, tc.cos, tc.maxAb)
			}
		})
	}
}

func TestAccumulatorErrors(t *testing.T) {
	f := func(dims ...int64) *onnx.Tensor {
		n := 1
		for _, d := range dims {
			n *= int(d)
		}
		return accTensor(t, dims, make([]float32, n))
	}
	bad := &onnx.Tensor{Name: "out", Type: onnx.Float, Dims: []int64{2}, Data: []int32{1, 2}}
	short := &onnx.Tensor{Name: "out", Type: onnx.Float, Dims: []int64{3}, Data: []float32{1, 2}}
	for _, tc := range []struct {
		name     string
		kind     Kind
		ref, got *onnx.Tensor
		ids      []string
		batched  bool
		want     []string
	}{
		{"shape", KindOther, f(2, 3), f(3, 2), []string{"a", "b"}, true, []string{"[2 3]", "[3 2]"}},
		{"type", KindOther, f(2), accTensor(t, []int64{2}, []int64{1, 2}), []string{"a"}, false, []string{"float32", "int64"}},
		{"data", KindOther, f(2), bad, []string{"a"}, false, []string{"float32", "[]int32"}},
		{"count", KindOther, f(3), short, []string{"a"}, false, []string{"3 elements", "candidate 2"}},
		{"string", KindOther, accTensor(t, []int64{1}, []string{"x"}), accTensor(t, []int64{1}, []string{"x"}), []string{"a"}, false, []string{"string"}},
		{"missing", KindOther, f(2), nil, []string{"a"}, false, []string{"missing"}},
		{"ids", KindOther, f(2, 3), f(2, 3), []string{"a"}, true, []string{"2 samples", "1 ids"}},
		{"unbatched ids", KindOther, f(2), f(2), []string{"a", "b"}, false, []string{"1 id"}},
		{"no batch dim", KindOther, f(), f(), nil, true, []string{"batch dim"}},
		{"not a classifier", KindClassifier, f(2, 1), f(2, 1), []string{"a", "b"}, true, []string{"classifier", "[2 1]"}},
		{"not dense", KindDense, f(2, 4), f(2, 4), []string{"a", "b"}, true, []string{"dense", "[2 4]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccumulator("logits", tc.kind, Thresholds{})
			err := a.Add(tc.ref, tc.got, tc.ids, tc.batched)
			if err == nil {
				t.Fatalf("Add() = nil, want an error")
			}
			for _, w := range append(tc.want, `"logits"`) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Add() = %q, want it to name %s", err, w)
				}
			}
			if m := a.Metrics(); m.Samples != 0 || m.Elements != 0 {
				t.Errorf("Metrics() after a failed Add = %d samples, %d elements, want 0, 0", m.Samples, m.Elements)
			}
		})
	}
}

func TestAccumulatorBatchesDisagree(t *testing.T) {
	a := NewAccumulator("out", KindClassifier, Thresholds{})
	x := accTensor(t, []int64{1, 7}, make([]float32, 7))
	if err := a.Add(x, x, []string{"a"}, true); err != nil {
		t.Fatal(err)
	}
	y := accTensor(t, []int64{1, 8}, make([]float32, 8))
	if err := a.Add(y, y, []string{"b"}, true); err == nil || !strings.Contains(err.Error(), "8 classes") {
		t.Errorf("Add(8 classes after 7) = %v, want an error naming 8 classes", err)
	}
	z := accTensor(t, []int64{1, 7}, make([]float64, 7))
	if err := a.Add(z, z, []string{"c"}, true); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("Add(float64 after float32) = %v, want an error naming float64", err)
	}
	if m := a.Metrics(); m.Samples != 1 {
		t.Errorf("Metrics().Samples = %d, want 1", m.Samples)
	}
}
