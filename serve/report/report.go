// Package report holds the result of `kiln serve`'s checks: which artifact
// of a repository was compared with which reference on which data, with what
// verdict, and how fast it ran. It renders one Report four ways: JSON (the
// record other tools read; the schema is SCHEMA.md next to this file),
// Markdown (for a pull request or a CI summary), one self-contained HTML page
// with inline SVG charts, and per model the CSV that Triton's perf_analyzer
// writes with -f, so that tools made for perf_analyzer read kiln's numbers.
package report

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// SchemaVersion is the version of the JSON schema that WriteJSON writes and
// ReadJSON accepts. It changes when a field changes meaning or goes away;
// adding a field does not change it.
const SchemaVersion = 1

// Report is the result of checking the models of one subject.
type Report struct {
	SchemaVersion int       `json:"schema_version"`
	Tool          string    `json:"tool"`
	Created       time.Time `json:"created"`
	// Subject is what was checked: a repository directory, a gs:// URL or
	// a model file.
	Subject string `json:"subject"`
	// Device is where the models ran: "cpu", "cuda:0", "triton http://...".
	Device     string `json:"device"`
	ORTVersion string `json:"onnxruntime_version,omitempty"`
	Data       Data   `json:"data"`
	// Verdict is the overall verdict that Summarize computes.
	Verdict Verdict `json:"verdict"`
	Models  []Model `json:"models"`
}

// DataKind says where the inputs of a check came from, and so how far its
// accuracy verdicts can be trusted: check's kinds.
type DataKind = check.DataKind

// Data kinds (see check.DataKind): a dataset the user named (--data), the
// part of the calibration data calibrate held out, explicit input tensors
// (--input), or seeded random data in each input's shape and type, which
// shows that a model runs and how close fp16 stays, but cannot judge int8.
const (
	KindDataset         = check.DataDataset
	KindValidationSplit = check.DataValidation
	KindInputs          = check.DataInputs
	KindRandom          = check.DataRandom
)

// Data is what the models were fed.
type Data struct {
	Kind DataKind `json:"kind"`
	// Path is the dataset or inputs location; empty for random data.
	Path string `json:"path,omitempty"`
	// Digest identifies the data's content ("sha256:...").
	Digest  string `json:"digest,omitempty"`
	Samples int    `json:"samples"`
	// Seed is the random generator's seed; only for KindRandom.
	Seed uint64 `json:"seed,omitempty"`
	Note string `json:"note,omitempty"`
}

// Label is the one line that says what the data was, as the summaries print
// it. Random data is called out plainly, because it cannot judge int8.
func (d Data) Label() string {
	var s string
	switch d.Kind {
	case KindRandom:
		return fmt.Sprintf("inputs: seeded random data (seed %d) — accuracy of int8 not judged", d.Seed)
	case KindDataset:
		s = "inputs: dataset " + d.Path
	case KindValidationSplit:
		s = "inputs: held-out validation split of " + d.Path
	case KindInputs:
		s = "inputs: tensors from " + d.Path
	default:
		return fmt.Sprintf("inputs: %q (unknown kind)", string(d.Kind))
	}
	if d.Samples > 0 {
		s += " (" + plural(d.Samples, "sample")
		if d.Digest != "" {
			s += ", " + shortDigest(d.Digest)
		}
		s += ")"
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// Verdict is the outcome of checking one model, or of a whole report.
type Verdict string

// Verdicts, from best to worst as Summarize ranks them.
const (
	// Pass means every output met its thresholds (or the model is the reference
	// and ran).
	Pass Verdict = "pass"
	// NotJudged means the model ran, but the data cannot judge it (random data
	// for an int8 model).
	NotJudged Verdict = "not-judged"
	// NotChecked means the runtime the model needs is missing here (a TensorRT
	// engine without a GPU or trtexec).
	NotChecked Verdict = "not-checked"
	// Errored means the model did not load or did not run.
	Errored Verdict = "error"
	// Fail means at least one output missed a threshold.
	Fail Verdict = "fail"
)

var verdictRank = map[Verdict]int{Pass: 0, NotJudged: 1, NotChecked: 2, Errored: 3, Fail: 4}

// Valid reports whether v is one of the five verdicts.
func (v Verdict) Valid() bool {
	_, ok := verdictRank[v]
	return ok
}

// Model is one checked artifact.
type Model struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	// Variant is kiln's variant id ("onnx-fp16"); Runtime ("onnx", "trt")
	// and Precision ("fp32", "fp16", "int8") are its parts.
	Variant   string `json:"variant,omitempty"`
	Runtime   string `json:"runtime"`
	Precision string `json:"precision"`
	// Platform is Triton's platform or backend ("onnxruntime_onnx",
	// "tensorrt_plan").
	Platform string `json:"platform,omitempty"`
	Path     string `json:"path,omitempty"`
	Size     int64  `json:"size_bytes"`

	Verdict Verdict `json:"verdict"`
	// Reason says why the verdict is not pass: "needs GPU/TensorRT
	// (trtexec not found)", "needs real data", the load error.
	Reason string `json:"reason,omitempty"`
	// Reference is what the model was compared with (the fp32 model's name
	// or file); empty for the reference itself.
	Reference string `json:"reference,omitempty"`

	Outputs []check.Metrics `json:"outputs,omitempty"`
	// Thresholds are the limits each output was judged by, by output name.
	Thresholds map[string]check.Thresholds `json:"thresholds,omitempty"`
	Failures   []check.Failure             `json:"failures,omitempty"`

	Perf *Perf `json:"perf,omitempty"`
}

// Perf is the latency and throughput measurement of one model.
type Perf struct {
	// Warmup is the number of requests sent and discarded before measuring.
	Warmup int `json:"warmup_requests"`
	// MeasurementWindow is the length of each measurement; JSON holds it
	// in whole milliseconds.
	MeasurementWindow time.Duration `json:"measurement_window_ms"`
	Overhead          LoopOverhead  `json:"overhead"`
	Points            []PerfPoint   `json:"points"`
}

// LoopOverhead is the cost of kiln's measuring loop itself, so a reader
// can tell how much of a small latency is the harness.
type LoopOverhead struct {
	// PerRequestUS is the loop's own time per request, in microseconds.
	PerRequestUS float64 `json:"per_request_us"`
	// Share is PerRequestUS as a fraction (0..1) of the mean latency.
	Share float64 `json:"share"`
}

// PerfPoint is one measurement at one concurrency and batch size.
// Latencies are per request, in microseconds.
type PerfPoint struct {
	Concurrency int `json:"concurrency"`
	Batch       int `json:"batch"`
	// Requests is the number of requests measured.
	Requests int `json:"requests"`
	// ThroughputInferPerSec counts inferences (requests × batch) per second.
	ThroughputInferPerSec float64 `json:"throughput_infer_per_sec"`
	LatencyAvgUS          float64 `json:"latency_avg_us"`
	LatencyP50US          float64 `json:"latency_p50_us"`
	LatencyP90US          float64 `json:"latency_p90_us"`
	LatencyP95US          float64 `json:"latency_p95_us"`
	LatencyP99US          float64 `json:"latency_p99_us"`
	LatencyMinUS          float64 `json:"latency_min_us"`
	LatencyMaxUS          float64 `json:"latency_max_us"`
}

// Summarize sets the report's overall verdict to the worst model verdict,
// ranked fail > error > not-checked > not-judged > pass. A model that has
// failures is a fail whatever its verdict said; a model with no verdict and
// no failures counts as not-checked, and so does a report with no models:
// nothing was shown to pass.
func (r *Report) Summarize() {
	r.SchemaVersion = SchemaVersion
	if len(r.Models) == 0 {
		r.Verdict = NotChecked
		return
	}
	overall := Pass
	for i := range r.Models {
		m := &r.Models[i]
		switch {
		case len(m.Failures) > 0 && (m.Verdict == "" || m.Verdict == Pass):
			m.Verdict = Fail
		case m.Verdict == "" || !m.Verdict.Valid():
			m.Verdict = NotChecked
		}
		if verdictRank[m.Verdict] > verdictRank[overall] {
			overall = m.Verdict
		}
	}
	r.Verdict = overall
}

// ExitCode is the exit status kiln serve ends with for this report, after
// Summarize:
//
//   - 0 when every model passed;
//   - 3 when a model failed a check or did not load (error): the artifact
//     is not fit to serve;
//   - 4 when nothing failed but some work was not done or not judged
//     (not-checked: needs missing hardware; not-judged: random data cannot
//     judge int8), or nothing was checked at all: a partial result.
//
// Exit code 1 (kiln could not do its job) has no report to carry it.
func (r *Report) ExitCode() int {
	switch r.Verdict {
	case Pass:
		return 0
	case Fail, Errored:
		return 3
	default:
		return 4
	}
}

// Worst is the failure a summary shows, or nil when the model has none:
// the one of the most telling metric (non-finite values, then the worst
// sample's cosine, the mean cosine, top-1, top-5 and dense agreement, then
// the magnitude and the elementwise tolerance, whose relative misses are
// not comparable with the others'), and among those of one metric the
// largest relative miss |value-threshold| / |threshold|. A miss of a zero
// threshold (NaN counts) or a NaN value is infinitely large; ties go to the
// first.
func (m *Model) Worst() *check.Failure {
	var worst *check.Failure
	worstRank, worstMiss := len(metricRank)+1, -1.0
	for i := range m.Failures {
		f := &m.Failures[i]
		rank := metricRank[f.Metric]
		if rank == 0 {
			rank = len(metricRank)
		}
		if miss := relMiss(f); rank < worstRank || (rank == worstRank && miss > worstMiss) {
			worst, worstRank, worstMiss = f, rank, miss
		}
	}
	return worst
}

// metricRank orders metrics for Worst, most telling first.
var metricRank = map[string]int{"nan": 1, "inf": 2, "worst_cosine": 3, "cosine": 4, "top1_agreement": 5,
	"top5_agreement": 6, "agreement": 7, "norm_deviation": 8, "tolerance": 9}

func relMiss(f *check.Failure) float64 {
	d := math.Abs(f.Value - f.Threshold)
	switch {
	case math.IsNaN(d):
		return math.Inf(1)
	case f.Threshold == 0:
		if d == 0 {
			return 0
		}
		return math.Inf(1)
	default:
		return d / math.Abs(f.Threshold)
	}
}

// headline is the one metric a summary row shows for a model: its worst
// failure, or else its lowest worst-sample cosine with the threshold it was
// held to.
type headline struct {
	Output, Metric, Sample string
	Value, Threshold       float64
	HasThreshold, Failed   bool
}

func headlineOf(m *Model) (headline, bool) {
	if f := m.Worst(); f != nil {
		return headline{Output: f.Output, Metric: f.Metric, Sample: f.Sample,
			Value: f.Value, Threshold: f.Threshold, HasThreshold: true, Failed: true}, true
	}
	o := lowestCosine(m)
	if o == nil {
		return headline{}, false
	}
	h := headline{Output: o.Output, Metric: "worst_cosine", Value: o.WorstCosine, Sample: o.WorstSample}
	t := m.Thresholds[o.Output]
	switch {
	case t.MinWorstCosine != 0:
		h.Threshold, h.HasThreshold = t.MinWorstCosine, true
	case t.MinCosine != 0:
		h.Metric, h.Value, h.Threshold, h.HasThreshold = "cosine", o.Cosine, t.MinCosine, true
	}
	return h, true
}

// lowestCosine is the output whose worst sample is least like the
// reference, or nil when the model has no metrics.
// A NaN cosine (the candidate gave NaN) is the lowest of all.
func lowestCosine(m *Model) *check.Metrics {
	var low *check.Metrics
	for i := range m.Outputs {
		o := &m.Outputs[i]
		if math.IsNaN(o.WorstCosine) {
			return o
		}
		if low == nil || o.WorstCosine < low.WorstCosine {
			low = o
		}
	}
	return low
}

// cosineThreshold is the cosine bound output o of m was held to, or 0.
func cosineThreshold(m *Model, output string) float64 {
	t := m.Thresholds[output]
	return cmp.Or(t.MinWorstCosine, t.MinCosine)
}

// lowestTop1 is the lowest top-1 agreement over m's outputs.
func lowestTop1(m *Model) (float64, bool) {
	low, ok := 0.0, false
	for _, o := range m.Outputs {
		if o.Top1 != nil && (!ok || *o.Top1 < low) {
			low, ok = *o.Top1, true
		}
	}
	return low, ok
}

// smallestBatch is the smallest batch size p measured, which the latency
// summaries use so that models are compared like for like.
func (p *Perf) smallestBatch() int {
	if p == nil || len(p.Points) == 0 {
		return 0
	}
	return slices.MinFunc(p.Points, func(a, b PerfPoint) int { return cmp.Compare(a.Batch, b.Batch) }).Batch
}

// at is the point at concurrency c and the smallest batch, or nil.
func (p *Perf) at(c int) *PerfPoint {
	b := p.smallestBatch()
	for i := range p.Points {
		if pt := &p.Points[i]; pt.Concurrency == c && pt.Batch == b {
			return pt
		}
	}
	return nil
}

// best is the point with the highest throughput, or nil.
func (p *Perf) best() *PerfPoint {
	if p == nil {
		return nil
	}
	var best *PerfPoint
	for i := range p.Points {
		if pt := &p.Points[i]; best == nil || pt.ThroughputInferPerSec > best.ThroughputInferPerSec {
			best = pt
		}
	}
	return best
}

// group is the models compared with one reference, in report order.
type group struct {
	Reference string
	Models    []*Model
}

// groups splits the models by the reference they were compared with; a
// reference model heads its own group.
func groups(r *Report) []group {
	var gs []group
	index := map[string]int{}
	for i := range r.Models {
		m := &r.Models[i]
		key := cmp.Or(m.Reference, m.Name)
		j, ok := index[key]
		if !ok {
			j = len(gs)
			index[key] = j
			gs = append(gs, group{Reference: key})
		}
		gs[j].Models = append(gs[j].Models, m)
	}
	return gs
}

// counts is the number of models with each verdict.
func counts(r *Report) map[Verdict]int {
	n := map[Verdict]int{}
	for _, m := range r.Models {
		n[m.Verdict]++
	}
	return n
}

// countLine says how many models had each verdict, worst first:
// "4 models: 1 failed, 1 not checked, 2 passed".
func countLine(r *Report) string {
	n := counts(r)
	words := []struct {
		v    Verdict
		word string
	}{{Fail, "failed"}, {Errored, "did not run"}, {NotChecked, "not checked"}, {NotJudged, "not judged"}, {Pass, "passed"}}
	s := ""
	for _, w := range words {
		if n[w.v] == 0 {
			continue
		}
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%d %s", n[w.v], w.word)
	}
	if len(r.Models) == 0 {
		return "no models"
	}
	return plural(len(r.Models), "model") + ": " + s
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19] + "…"
	}
	return d
}
