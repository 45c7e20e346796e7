// Package check compares a model's outputs with a reference run of the same
// inputs and judges the difference against thresholds. It is the one
// checker of kiln: convert runs it on every ONNX variant before recording
// it, serve on every artifact of a repository, calibrate's accuracy uses its
// metrics. Metrics follow DESIGN.md "Checks (serve)": max abs / max rel
// error, cosine similarity (mean and worst sample), top-1/top-5 agreement
// for classifier-shaped outputs, argmax or thresholded-mask agreement for
// dense outputs, NaN/Inf counts, and the smallest tolerance that would pass
// (the elementwise rule |got-ref| <= atol + rtol*|ref| of numpy.isclose
// and Polygraphy).
package check

import (
	"context"

	"github.com/kiln-ml/kiln/onnx"
)

// Runner runs a model on one batch of named inputs and returns its outputs
// by name. ort sessions, trtexec engines and KServe v2 endpoints are all
// Runners.
type Runner interface {
	Run(ctx context.Context, inputs map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error)
}

// Kind says how an output is read, and so which agreement metrics apply.
type Kind string

// Output kinds.
const (
	// KindClassifier is an output shaped [N,C], [N,C,1,1] or [C] with C > 1:
	// scores per class; top-1 and top-5 agreement apply.
	KindClassifier Kind = "classifier"
	// KindDense is an output with spatial dimensions ([N,C,H,W], [N,C,L],
	// [N,H,W]): a map per position; argmax agreement over C applies to a
	// sample of rank 3 or more with C > 1 ([N,C,H,W]), thresholded-mask
	// agreement to the rest ([N,1,H,W], and every batched rank-3 output,
	// [N,H,W] and [N,C,L] alike, read as a mask).
	KindDense Kind = "dense"
	// KindPeaks is a local-maximum map (x * (x == MaxPool(x)), see Peak),
	// found from the graph rather than the shape: peak agreement applies,
	// and the elementwise metrics and cosine are taken at the positions
	// that are peaks on both sides.
	KindPeaks Kind = "peaks"
	// KindOther is anything else (regression values, state, int outputs):
	// only the elementwise metrics apply.
	KindOther Kind = "other"
)

// Metrics is the comparison of one output over every sample seen. Every
// float field is finite, so json.Marshal never fails: a value too large for
// float64 is reported as math.MaxFloat64.
type Metrics struct {
	Output  string `json:"output"`
	Kind    Kind   `json:"kind"`
	Samples int    `json:"samples"`
	// Elements is the number of values compared, non-finite ones included.
	Elements int64 `json:"elements"`

	// MaxAbs, MaxRel and MeanAbs are taken over the elements where both
	// values are finite. MaxRel is max |got-ref|/|ref| over the elements
	// with ref != 0: an element whose reference is exactly zero has no
	// relative error (Polygraphy would report +Inf) and is judged by atol
	// alone, see MinRTol.
	MaxAbs  float64 `json:"max_abs_error"`
	MaxRel  float64 `json:"max_rel_error"`
	MeanAbs float64 `json:"mean_abs_error"`

	// Cosine is the mean of the per-sample cosine similarities;
	// WorstCosine the lowest, for sample WorstSample. Two all-zero
	// samples have cosine 1; one all-zero sample against a non-zero one 0.
	// Non-finite pairs are left out of the sums. With no samples all three
	// are zero, which fails any cosine threshold: nothing compared is not
	// a pass.
	Cosine      float64 `json:"cosine"`
	WorstCosine float64 `json:"worst_cosine"`
	WorstSample string  `json:"worst_sample,omitempty"`

	// Top1 and Top5 are the shares of samples (KindClassifier) whose
	// reference argmax is the candidate's argmax / among its 5 best; nil
	// for other kinds. Top5 is nil when there are fewer than 6 classes.
	// Ties rank the lower class index first and NaN last.
	Top1 *float64 `json:"top1_agreement,omitempty"`
	Top5 *float64 `json:"top5_agreement,omitempty"`
	// Agreement is, for KindDense, the share of positions whose argmax over
	// the channel axis agrees (C > 1) or whose mask value > MaskThreshold
	// agrees (C == 1, or a sample of rank 2 such as [N,H,W]: a mask of
	// probabilities); nil for other kinds.
	//
	// For KindPeaks, Agreement is the lower of PeakRecall (the share of
	// the reference's peak mass, the sum of |value| over its non-zero
	// positions, that has a candidate peak within half the PeakWindow on
	// every spatial axis) and PeakPrecision (the same from the candidate's
	// side); Elements, the elementwise metrics, NormRatio and the cosines
	// are then over the positions that are peaks on both sides.
	Agreement     *float64 `json:"agreement,omitempty"`
	AgreementKind string   `json:"agreement_kind,omitempty"` // "argmax", "mask" or "peaks"
	MaskThreshold float64  `json:"mask_threshold,omitempty"`
	PeakRecall    *float64 `json:"peak_recall,omitempty"`
	PeakPrecision *float64 `json:"peak_precision,omitempty"`
	PeakWindow    string   `json:"peak_window,omitempty"` // the pooling kernel, "3x3"

	// NaN and Inf count non-finite values in the candidate's output;
	// RefNaN and RefInf in the reference's.
	NaN    int64 `json:"nan"`
	Inf    int64 `json:"inf"`
	RefNaN int64 `json:"ref_nan"`
	RefInf int64 `json:"ref_inf"`

	// NormRatio is ||got|| / ||ref|| over every finite element: cosine
	// cannot see an output scaled by a constant (probabilities halved), the
	// ratio can. It is 1 when both are all zero, and 0 when only the
	// reference is.
	NormRatio float64 `json:"norm_ratio"`

	// MinATol is the smallest atol that passes every finite element with
	// the thresholds' rtol: max |got-ref| - rtol*|ref|, floored at 0.
	// MinRTol is the smallest rtol that passes with their atol: max
	// (|got-ref|-atol)/|ref| over ref != 0, floored at 0, and
	// math.MaxFloat64 (no rtol can pass) when an element with ref == 0
	// differs by more than atol. They are given even when the output passes.
	MinATol float64 `json:"min_atol"`
	MinRTol float64 `json:"min_rtol"`
	// Outside counts the finite elements outside the elementwise rule with
	// the thresholds the Accumulator was given; ToleranceSample is the
	// sample holding the element furthest outside.
	Outside         int64  `json:"outside_tolerance"`
	ToleranceSample string `json:"tolerance_sample,omitempty"`
}

// Thresholds are the limits one output must meet. A zero field is not
// checked; non-finite candidate values are, unless AllowNonFinite (see
// Judge).
type Thresholds struct {
	// ATol and RTol bound every element: |got-ref| <= ATol + RTol*|ref|.
	// Both zero: the elementwise rule is not checked.
	ATol float64 `json:"atol,omitempty"`
	RTol float64 `json:"rtol,omitempty"`
	// ToleranceAdvisory measures the elementwise rule (Metrics.MinATol,
	// MinRTol, Outside) without failing on it; Defaults sets it for fp16,
	// and an atol or rtol override clears it.
	ToleranceAdvisory bool `json:"tolerance_advisory,omitempty"`
	// MinCosine bounds the mean cosine, MinWorstCosine the worst sample's.
	MinCosine      float64 `json:"min_cosine,omitempty"`
	MinWorstCosine float64 `json:"min_worst_cosine,omitempty"`
	// MinTop1 and MinTop5 bound classifier agreement, MinAgreement dense
	// agreement.
	MinTop1      float64 `json:"min_top1,omitempty"`
	MinTop5      float64 `json:"min_top5,omitempty"`
	MinAgreement float64 `json:"min_agreement,omitempty"`
	// MaxNormDeviation bounds |NormRatio - 1|: how far the output's
	// magnitude may drift from the reference's.
	MaxNormDeviation float64 `json:"max_norm_deviation,omitempty"`
	// AllowNonFinite turns off the NaN/Inf checks. By default a candidate
	// with more NaN (or Inf) values than the reference fails.
	AllowNonFinite bool `json:"allow_non_finite,omitempty"`
}

// Failure is one threshold an output missed.
type Failure struct {
	Output string `json:"output"`
	Metric string `json:"metric"` // "nan", "inf", "tolerance", "norm_deviation", "cosine", "worst_cosine", "top1_agreement", "top5_agreement", "agreement"
	// Value is the measured metric and Threshold the limit it missed; for
	// "tolerance" they are Metrics.MinATol and Thresholds.ATol (the atol
	// that would pass against the one given), for "nan" and "inf" the
	// candidate's and the reference's counts.
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	// Sample is the worst sample for the metric, where one is known.
	Sample string `json:"sample,omitempty"`
}
