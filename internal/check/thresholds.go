package check

import (
	"math"

	"github.com/kiln-ml/kiln/manifest"
)

// Defaults returns the thresholds for a variant of precision p, compared
// with the fp32 ONNX Runtime reference. An unknown precision gets fp32's,
// the strictest: not knowing is no reason to loosen.
//
// fp32 (another runtime or kernel set, same arithmetic): the elementwise
// rule atol 1e-4 + rtol 1e-3 (float32 reassociation over deep graphs
// stays well inside it), mean cosine 0.99999 and no sample below 0.9999,
// top-1 0.99, top-5 0.999 and dense agreement 0.99, which leave room only
// for near-ties that flip. A TensorRT fp32 engine meets them only when
// built without TF32 (trtexec --noTF32): TF32's 10-bit mantissa is
// reduced precision, not fp32.
//
// fp16: mean cosine 0.999 and no sample below 0.99, top-1 0.99, top-5
// 0.995, dense agreement 0.98. A healthy fp16 CNN has cosine above 0.9999
// and top-1 1.0, while a broken conversion (a BatchNorm variance clamped
// at 65504 gave cosine 0.45-0.66 on a PP-OCR detector) lands far below.
// The elementwise rule atol 1e-3 + rtol 1e-2 is measured but advisory:
// fp16 error scales with an output's magnitude, not with each element's,
// so logits of magnitude 10 with an error of 1e-2 on the elements near
// zero break any fixed atol while the model is fine. Polygraphy fails such
// outputs; kiln reports the atol and rtol that would pass and fails on
// them only when an atol or rtol override asks it to.
//
// int8: no elementwise rule, since quantization error is a fraction of
// each tensor's range, not of each element; judged by what quantization
// must keep, the direction of the output and the decisions read from it:
// mean cosine 0.99 and no sample below 0.95, top-1 0.98, top-5 0.99 and
// dense agreement 0.95.
func Defaults(p manifest.Precision) Thresholds {
	switch p {
	case manifest.FP16:
		return Thresholds{
			ATol: 1e-3, RTol: 1e-2, ToleranceAdvisory: true, MaxNormDeviation: 1e-2,
			MinCosine: 0.999, MinWorstCosine: 0.99,
			MinTop1: 0.99, MinTop5: 0.995, MinAgreement: 0.98,
		}
	case manifest.INT8:
		return Thresholds{
			MinCosine: 0.99, MinWorstCosine: 0.95, MaxNormDeviation: 0.05,
			MinTop1: 0.98, MinTop5: 0.99, MinAgreement: 0.95,
		}
	}
	return Thresholds{
		ATol: 1e-4, RTol: 1e-3, MaxNormDeviation: 1e-3,
		MinCosine: 0.99999, MinWorstCosine: 0.9999,
		MinTop1: 0.99, MinTop5: 0.999, MinAgreement: 0.99,
	}
}

// Judge returns every threshold of t that m misses, in a fixed order: nan,
// inf, tolerance, norm_deviation (not checked when NormRatio is 0, an
// all-zero candidate, which cosine 0 already fails), cosine, worst_cosine, top1_agreement, top5_agreement,
// agreement. A zero threshold is not checked, nor an agreement metric m
// does not have (Top1 of a dense output). Unless t.AllowNonFinite, a
// candidate with more NaN (or Inf) values than the reference fails: counts
// are compared, not positions. The elementwise rule fails when some element
// needs a larger atol than t.ATol at t.RTol (m.MinATol > t.ATol), so m must
// come from an Accumulator given t's RTol; it is not checked when
// t.ToleranceAdvisory. Cosine failures name m.WorstSample, tolerance ones
// m.ToleranceSample.
func Judge(m Metrics, t Thresholds) []Failure {
	var fs []Failure
	fail := func(metric string, v, th float64, sample string) {
		fs = append(fs, Failure{Output: m.Output, Metric: metric, Value: v, Threshold: th, Sample: sample})
	}
	if !t.AllowNonFinite {
		if m.NaN > m.RefNaN {
			fail("nan", float64(m.NaN), float64(m.RefNaN), "")
		}
		if m.Inf > m.RefInf {
			fail("inf", float64(m.Inf), float64(m.RefInf), "")
		}
	}
	if (t.ATol > 0 || t.RTol > 0) && !t.ToleranceAdvisory && m.MinATol > t.ATol {
		fail("tolerance", m.MinATol, t.ATol, m.ToleranceSample)
	}
	if dev := math.Abs(m.NormRatio - 1); t.MaxNormDeviation > 0 && m.NormRatio > 0 && !(dev <= t.MaxNormDeviation) {
		fail("norm_deviation", dev, t.MaxNormDeviation, "")
	}
	if t.MinCosine > 0 && !(m.Cosine >= t.MinCosine) {
		fail("cosine", m.Cosine, t.MinCosine, m.WorstSample)
	}
	if t.MinWorstCosine > 0 && !(m.WorstCosine >= t.MinWorstCosine) {
		fail("worst_cosine", m.WorstCosine, t.MinWorstCosine, m.WorstSample)
	}
	below := func(metric string, v *float64, th float64) {
		if th > 0 && v != nil && !(*v >= th) {
			fail(metric, *v, th, "")
		}
	}
	below("top1_agreement", m.Top1, t.MinTop1)
	below("top5_agreement", m.Top5, t.MinTop5)
	below("agreement", m.Agreement, t.MinAgreement)
	return fs
}
