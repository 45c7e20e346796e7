package check

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Override is one --threshold flag: a metric's limit for the outputs it
// matches. An empty Model or Output matches every model or output (the
// flag spells it *).
type Override struct {
	Model  string
	Output string
	Metric string // atol, rtol, cosine, worst_cosine, top1, top5, agreement, allow_non_finite
	Value  float64
}

// overrideMetrics maps a metric name to the check it sets and the range
// its value must be in.
var overrideMetrics = map[string]struct {
	lo, hi float64
	set    func(*Thresholds, float64)
}{
	"atol":             {0, math.MaxFloat64, func(t *Thresholds, v float64) { t.ATol, t.ToleranceAdvisory = v, false }},
	"rtol":             {0, math.MaxFloat64, func(t *Thresholds, v float64) { t.RTol, t.ToleranceAdvisory = v, false }},
	"cosine":           {0, 1, func(t *Thresholds, v float64) { t.MinCosine = v }},
	"worst_cosine":     {0, 1, func(t *Thresholds, v float64) { t.MinWorstCosine = v }},
	"top1":             {0, 1, func(t *Thresholds, v float64) { t.MinTop1 = v }},
	"top5":             {0, 1, func(t *Thresholds, v float64) { t.MinTop5 = v }},
	"agreement":        {0, 1, func(t *Thresholds, v float64) { t.MinAgreement = v }},
	"norm_deviation":   {0, math.MaxFloat64, func(t *Thresholds, v float64) { t.MaxNormDeviation = v }},
	"allow_non_finite": {0, 1, func(t *Thresholds, v float64) { t.AllowNonFinite = v != 0 }},
}

// metricNames lists the metrics for messages.
const metricNames = "atol, rtol, cosine, worst_cosine, top1, top5, agreement, norm_deviation or allow_non_finite"

// ParseOverride reads the --threshold flag's [MODEL[/OUTPUT]:]METRIC=VALUE:
// "cosine=0.995", "det_onnx_fp16:cosine=0.99",
// "det_onnx_fp16/sigmoid_0.tmp_0:rtol=0.05", "*/logits:top1=0.97". MODEL or
// OUTPUT * matches any. The prefix ends at the last colon and the model at
// the first slash, so output names may hold both ("m/Identity:0:rtol=1e-3").
// atol and rtol take a finite value >= 0 (setting either enforces the
// elementwise rule, advisory for fp16 by default), the other limits a value
// in [0, 1] where 0 turns the check off, allow_non_finite a boolean (0, 1,
// true, false).
func ParseOverride(s string) (Override, error) {
	var o Override
	rest := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		prefix := s[:i]
		rest = s[i+1:]
		model, output, hasOutput := strings.Cut(prefix, "/")
		switch {
		case model == "":
			return Override{}, fmt.Errorf("threshold %q: empty model in %q (use * for any model)", s, prefix+":")
		case hasOutput && output == "":
			return Override{}, fmt.Errorf("threshold %q: empty output in %q (use * for any output)", s, prefix+":")
		}
		if model != "*" {
			o.Model = model
		}
		if output != "*" {
			o.Output = output
		}
	}
	metric, value, ok := strings.Cut(rest, "=")
	if !ok {
		return Override{}, fmt.Errorf("threshold %q: %q is not METRIC=VALUE", s, rest)
	}
	spec, ok := overrideMetrics[metric]
	if !ok {
		return Override{}, fmt.Errorf("threshold %q: unknown metric %q (want %s)", s, metric, metricNames)
	}
	o.Metric = metric
	v, err := parseValue(metric, value)
	if err != nil {
		return Override{}, fmt.Errorf("threshold %q: %w", s, err)
	}
	if !(v >= spec.lo && v <= spec.hi) {
		return Override{}, fmt.Errorf("threshold %q: %s value %s is outside [%g, %g]", s, metric, value, spec.lo, spec.hi)
	}
	o.Value = v
	return o, nil
}

func parseValue(metric, value string) (float64, error) {
	if metric == "allow_non_finite" {
		b, err := strconv.ParseBool(value)
		if err != nil {
			return 0, fmt.Errorf("allow_non_finite value %q is not 0, 1, true or false", value)
		}
		return float64(b2i(b)), nil
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%s value %q is not a finite number", metric, value)
	}
	return v, nil
}

// String returns the flag form of o, which ParseOverride reads back as o.
func (o Override) String() string {
	v := strconv.FormatFloat(o.Value, 'g', -1, 64)
	if o.Metric == "allow_non_finite" {
		v = strconv.FormatBool(o.Value != 0)
	}
	s := o.Metric + "=" + v
	model := o.Model
	if model == "" {
		model = "*"
	}
	switch {
	case o.Output != "":
		return model + "/" + o.Output + ":" + s
	case o.Model != "":
		return o.Model + ":" + s
	}
	return s
}

// specificity ranks an override: one naming the model and the output
// beats one naming either, which beats one naming neither.
func (o Override) specificity() int {
	return b2i(o.Model != "") + b2i(o.Output != "")
}

func (o Override) matches(model, output string) bool {
	return (o.Model == "" || o.Model == model) && (o.Output == "" || o.Output == output)
}

// Resolve returns base with the overrides that match model and output
// applied: the more specific override of a metric wins whatever the order
// (model and output over model or output alone, over neither), and between
// equally specific ones the later. An override of an unknown metric is
// ignored; ParseOverride never returns one.
func Resolve(base Thresholds, overrides []Override, model, output string) Thresholds {
	var match []Override
	for _, o := range overrides {
		if o.matches(model, output) {
			match = append(match, o)
		}
	}
	slices.SortStableFunc(match, func(a, b Override) int { return a.specificity() - b.specificity() })
	t := base
	for _, o := range match {
		if spec, ok := overrideMetrics[o.Metric]; ok {
			spec.set(&t, o.Value)
		}
	}
	return t
}
