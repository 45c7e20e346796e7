package check

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

func TestDefaults(t *testing.T) {
	fp32 := Thresholds{ATol: 1e-4, RTol: 1e-3, MinCosine: 0.99999, MinWorstCosine: 0.9999,
		MinTop1: 0.99, MinTop5: 0.999, MinAgreement: 0.99, MaxNormDeviation: 1e-3}
	for _, tc := range []struct {
		p    manifest.Precision
		want Thresholds
	}{
		{manifest.FP32, fp32},
		{manifest.FP16, Thresholds{ATol: 1e-3, RTol: 1e-2, ToleranceAdvisory: true, MinCosine: 0.999,
			MinWorstCosine: 0.99, MinTop1: 0.99, MinTop5: 0.995, MinAgreement: 0.98, MaxNormDeviation: 1e-2}},
		{manifest.INT8, Thresholds{MinCosine: 0.99, MinWorstCosine: 0.95, MinTop1: 0.98, MinTop5: 0.99, MinAgreement: 0.95, MaxNormDeviation: 0.05}},
		{"bf16", fp32},
		{"", fp32},
	} {
		t.Run(string(tc.p), func(t *testing.T) {
			if got := Defaults(tc.p); got != tc.want {
				t.Errorf("Defaults(%q) = %+v, want %+v", tc.p, got, tc.want)
			}
		})
	}
}

// TestDefaultsHealthy judges the metrics of a healthy model of each
// precision, and of a broken one.
func TestDefaultsHealthy(t *testing.T) {
	one, top5 := 1.0, 1.0
	healthy := func(cos float64, minATol float64) Metrics {
		return Metrics{Output: "logits", Kind: KindClassifier, Samples: 32, Cosine: cos, WorstCosine: cos - 1e-5,
			Top1: &one, Top5: &top5, MinATol: minATol, Outside: 3}
	}
	for _, tc := range []struct {
		p     manifest.Precision
		m     Metrics
		fails int
	}{
		{manifest.FP32, healthy(0.999999, 5e-5), 0},
		{manifest.FP32, healthy(0.999999, 2e-4), 1}, // outside atol
		// 2e-2 on near-zero logits breaks atol 1e-3, and fp16 passes on cosine.
		{manifest.FP16, healthy(0.99995, 2e-2), 0},
		{manifest.FP16, healthy(0.6, 2e-2), 2}, // the clamped BatchNorm case
		{manifest.INT8, healthy(0.995, 0.5), 0},
		{manifest.INT8, healthy(0.98, 0.5), 1},
	} {
		t.Run(fmt.Sprint(tc.p, tc.m.Cosine, tc.m.MinATol), func(t *testing.T) {
			if fs := Judge(tc.m, Defaults(tc.p)); len(fs) != tc.fails {
				t.Errorf("Judge(cosine %v, min atol %v, Defaults(%s)) = %v, want %d failures", tc.m.Cosine, tc.m.MinATol, tc.p, fs, tc.fails)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	low, high := 0.5, 1.0
	base := Metrics{Output: "out", Samples: 4, Cosine: 1, WorstCosine: 1, WorstSample: "w", ToleranceSample: "t"}
	with := func(f func(*Metrics)) Metrics {
		m := base
		f(&m)
		return m
	}
	for _, tc := range []struct {
		name string
		m    Metrics
		t    Thresholds
		want []Failure
	}{
		{"pass", base, Defaults(manifest.FP32), nil},
		{"tolerance", with(func(m *Metrics) { m.MinATol = 0.01; m.Outside = 7 }), Thresholds{ATol: 1e-3, RTol: 1e-2},
			[]Failure{{Output: "out", Metric: "tolerance", Value: 0.01, Threshold: 1e-3, Sample: "t"}}},
		{"tolerance at its limit", with(func(m *Metrics) { m.MinATol = 1e-3 }), Thresholds{ATol: 1e-3, RTol: 1e-2}, nil},
		{"tolerance rtol only", with(func(m *Metrics) { m.MinATol = 1e-9 }), Thresholds{RTol: 1e-2},
			[]Failure{{Output: "out", Metric: "tolerance", Value: 1e-9, Threshold: 0, Sample: "t"}}},
		{"tolerance advisory", with(func(m *Metrics) { m.MinATol = 0.01 }), Thresholds{ATol: 1e-3, RTol: 1e-2, ToleranceAdvisory: true}, nil},
		{"tolerance unchecked", with(func(m *Metrics) { m.MinATol = 0.01 }), Thresholds{}, nil},
		{"cosine", with(func(m *Metrics) { m.Cosine, m.WorstCosine = 0.99, 0.98 }), Thresholds{MinCosine: 0.999},
			[]Failure{{Output: "out", Metric: "cosine", Value: 0.99, Threshold: 0.999, Sample: "w"}}},
		{"worst cosine", with(func(m *Metrics) { m.WorstCosine = 0.9 }), Thresholds{MinCosine: 0.99, MinWorstCosine: 0.95},
			[]Failure{{Output: "out", Metric: "worst_cosine", Value: 0.9, Threshold: 0.95, Sample: "w"}}},
		{"top1", with(func(m *Metrics) { m.Top1, m.Top5 = &low, &high }), Thresholds{MinTop1: 0.98, MinTop5: 0.99},
			[]Failure{{Output: "out", Metric: "top1_agreement", Value: 0.5, Threshold: 0.98}}},
		{"top5", with(func(m *Metrics) { m.Top1, m.Top5 = &high, &low }), Thresholds{MinTop1: 0.98, MinTop5: 0.99},
			[]Failure{{Output: "out", Metric: "top5_agreement", Value: 0.5, Threshold: 0.99}}},
		{"top-k of no classifier", base, Thresholds{MinTop1: 0.98, MinTop5: 0.99, MinAgreement: 0.95}, nil},
		{"agreement", with(func(m *Metrics) { m.Agreement = &low }), Thresholds{MinAgreement: 0.95},
			[]Failure{{Output: "out", Metric: "agreement", Value: 0.5, Threshold: 0.95}}},
		{"nan", with(func(m *Metrics) { m.NaN, m.RefNaN = 3, 1 }), Thresholds{},
			[]Failure{{Output: "out", Metric: "nan", Value: 3, Threshold: 1}}},
		{"inf", with(func(m *Metrics) { m.Inf = 2 }), Thresholds{},
			[]Failure{{Output: "out", Metric: "inf", Value: 2, Threshold: 0}}},
		{"inf allowed", with(func(m *Metrics) { m.Inf = 2 }), Thresholds{AllowNonFinite: true}, nil},
		{"no samples", Metrics{Output: "out"}, Thresholds{MinCosine: 0.99, MinWorstCosine: 0.9}, []Failure{
			{Output: "out", Metric: "cosine", Value: 0, Threshold: 0.99},
			{Output: "out", Metric: "worst_cosine", Value: 0, Threshold: 0.9}}},
		{"all, in order", with(func(m *Metrics) {
			m.NaN, m.Inf, m.MinATol, m.Cosine, m.WorstCosine = 1, 1, 1, 0.5, 0.5
			m.Top1, m.Top5, m.Agreement = &low, &low, &low
		}), Thresholds{ATol: 0.1, MinCosine: 0.9, MinWorstCosine: 0.8, MinTop1: 0.9, MinTop5: 0.9, MinAgreement: 0.9}, []Failure{
			{Output: "out", Metric: "nan", Value: 1},
			{Output: "out", Metric: "inf", Value: 1},
			{Output: "out", Metric: "tolerance", Value: 1, Threshold: 0.1, Sample: "t"},
			{Output: "out", Metric: "cosine", Value: 0.5, Threshold: 0.9, Sample: "w"},
			{Output: "out", Metric: "worst_cosine", Value: 0.5, Threshold: 0.8, Sample: "w"},
			{Output: "out", Metric: "top1_agreement", Value: 0.5, Threshold: 0.9},
			{Output: "out", Metric: "top5_agreement", Value: 0.5, Threshold: 0.9},
			{Output: "out", Metric: "agreement", Value: 0.5, Threshold: 0.9}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Judge(tc.m, tc.t)
			if len(got) != len(tc.want) {
				t.Fatalf("Judge(%s) = %v, want %v", tc.name, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("Judge(%s)[%d] = %+v, want %+v", tc.name, i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestJudgeAccumulated judges what an Accumulator measured with the same
// thresholds: the tolerance rule agrees with Outside.
func TestJudgeAccumulated(t *testing.T) {
	th := Thresholds{ATol: 0.1, RTol: 0.1}
	for _, tc := range []struct {
		name string
		got  []float32
		fail bool
	}{
		{"inside", []float32{1.15, 2.25}, false}, // |d| 0.15 <= 0.2, 0.25 <= 0.3
		{"outside", []float32{1.25, 2.25}, true}, // 0.25 > 0.2
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := accumulate(t, KindOther, th, false, accBatch{[]int64{2}, []float32{1, 2}, tc.got, []string{"x"}})
			fs := Judge(m, th)
			if failed := len(fs) > 0; failed != tc.fail || failed != (m.Outside > 0) {
				t.Errorf("Judge(%v) = %v with Outside %d, want failing %v", tc.got, fs, m.Outside, tc.fail)
			}
		})
	}
}

func TestMetricsJSON(t *testing.T) {
	m := Metrics{MinRTol: math.MaxFloat64, MaxAbs: math.MaxFloat64}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("json.Marshal(%+v) = %v", m, err)
	}
	var back Metrics
	if err := json.Unmarshal(b, &back); err != nil || back.MinRTol != math.MaxFloat64 {
		t.Errorf("json round trip of MinRTol = %v, %v, want %v", back.MinRTol, err, math.MaxFloat64)
	}
}

// Cosine cannot see an output scaled by a constant; the norm ratio can.
func TestScaledOutputFails(t *testing.T) {
	ref, _ := onnx.NewTensor("probs", []int64{2, 4}, []float32{0.1, 0.2, 0.3, 0.4, 0.4, 0.3, 0.2, 0.1})
	half, _ := onnx.NewTensor("probs", []int64{2, 4}, []float32{0.05, 0.1, 0.15, 0.2, 0.2, 0.15, 0.1, 0.05})
	th := Defaults(manifest.FP16)
	a := NewAccumulator("probs", KindClassifier, th)
	if err := a.Add(ref, half, []string{"a", "b"}, true); err != nil {
		t.Fatal(err)
	}
	m := a.Metrics()
	if m.Cosine < 0.999999 || m.NormRatio != 0.5 {
		t.Fatalf("Metrics of a halved output = cosine %v, norm ratio %v; want 1 and 0.5", m.Cosine, m.NormRatio)
	}
	fs := Judge(m, th)
	if len(fs) != 1 || fs[0].Metric != "norm_deviation" || fs[0].Value != 0.5 {
		t.Errorf("Judge(halved output) = %v, want one norm_deviation failure of 0.5", fs)
	}
}
