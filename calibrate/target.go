package calibrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
)

// The metrics a Target bounds, each an OutputAccuracy field: Cosine,
// MinCosine, Top1 and Top5 (the last two of classifier outputs only) and
// Agreement (of dense and peak maps only).
const (
	MetricCosine    = "cosine"
	MetricMinCosine = "min_cosine"
	MetricTop1      = "top1"
	MetricTop5      = "top5"
	MetricAgreement = "agreement"
)

var targetMetrics = []string{MetricCosine, MetricMinCosine, MetricTop1, MetricTop5, MetricAgreement}

// Bound is one lower bound of a Target: Metric of Output (of every output
// when Output is "") against fp32 must be at least Min.
type Bound struct {
	Output string  `json:"output,omitempty"`
	Metric string  `json:"metric"`
	Min    float64 `json:"min"`
}

// Target is the accuracy the int8 model must reach against fp32 on the
// validation samples: every bound must hold. Bounds on top1 or top5 for
// every output apply to the classifier outputs.
type Target []Bound

// ParseTarget reads a target spec: comma-separated METRIC=VALUE items
// (cosine, min_cosine, top1, top5, agreement; e.g. cosine=0.99,top1=0.98) for every
// output. OUTPUT:METRIC=VALUE bounds one output, and the items after it in
// the same spec too, up to the next OUTPUT: prefix; "*:" goes back to every
// output. The output is what comes before the last colon, so TensorFlow
// names such as logits:0 work (logits:0:top1=0.98). Output names are
// checked against the model when calibrating.
func ParseTarget(spec string) (Target, error) {
	var t Target
	output := ""
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		eq := strings.LastIndex(item, "=")
		if eq < 0 {
			return nil, fmt.Errorf("accuracy target item %q: want METRIC=VALUE or OUTPUT:METRIC=VALUE", item)
		}
		key, val := item[:eq], strings.TrimSpace(item[eq+1:])
		if c := strings.LastIndex(key, ":"); c >= 0 {
			output, key = strings.TrimSpace(key[:c]), key[c+1:]
			if output == "" {
				return nil, fmt.Errorf("accuracy target item %q: empty output name before ':'", item)
			}
			if output == "*" {
				output = ""
			}
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("accuracy target item %q: %q is not a number", item, val)
		}
		t = append(t, Bound{Output: output, Metric: strings.TrimSpace(key), Min: v})
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// String is the target in ParseTarget's form.
func (t Target) String() string {
	var b strings.Builder
	output := ""
	for i, x := range t {
		if i > 0 {
			b.WriteByte(',')
		}
		if x.Output != output {
			output = x.Output
			if output == "" {
				b.WriteString("*")
			}
			b.WriteString(output + ":")
		}
		b.WriteString(x.Metric + "=" + strconv.FormatFloat(x.Min, 'g', -1, 64))
	}
	return b.String()
}

// Validate checks every bound: a known metric, a value it can take
// (cosines in [-1, 1], agreements in [0, 1]) and no bound given twice.
func (t Target) Validate() error {
	seen := map[Bound]bool{}
	for _, b := range t {
		what := b.Metric
		if b.Output != "" {
			what = b.Output + ":" + b.Metric
		}
		lo := 0.0
		switch b.Metric {
		case MetricCosine, MetricMinCosine:
			lo = -1
		case MetricTop1, MetricTop5, MetricAgreement:
		default:
			return fmt.Errorf("accuracy target %s: unknown metric %q (want one of %s)", what, b.Metric, strings.Join(targetMetrics, ", "))
		}
		if !(b.Min >= lo && b.Min <= 1) {
			return fmt.Errorf("accuracy target %s=%v: want a value in [%v, 1]", what, b.Min, lo)
		}
		key := Bound{Output: b.Output, Metric: b.Metric}
		if seen[key] {
			return fmt.Errorf("accuracy target %s is given twice", what)
		}
		seen[key] = true
	}
	return nil
}

// checkOutputs refuses bounds on outputs m does not have, naming them.
func (t Target) checkOutputs(m *onnx.Model) error {
	var names []string
	for _, o := range m.Outputs() {
		names = append(names, o.Name)
	}
	for _, b := range t {
		if b.Output != "" && !contains(names, b.Output) {
			return fmt.Errorf("accuracy target %s:%s: the model has no output %q (its outputs: %s)", b.Output, b.Metric, b.Output, strings.Join(names, ", "))
		}
	}
	return nil
}

// Miss is a bound an int8 model does not reach: Got is below Min.
type Miss struct {
	Output string  `json:"output"`
	Metric string  `json:"metric"`
	Min    float64 `json:"min"`
	Got    float64 `json:"got"`
}

func (m Miss) String() string {
	return fmt.Sprintf("%s %s %.4f < %v", m.Output, m.Metric, m.Got, m.Min)
}

// metric is the value of a target metric for o; top1 and top5 exist for
// classifier outputs only.
func (o OutputAccuracy) metric(name string) (float64, bool) {
	switch name {
	case MetricCosine:
		return o.Cosine, true
	case MetricMinCosine:
		return o.MinCosine, true
	case MetricTop1:
		return o.Top1, o.Classifier
	case MetricTop5:
		return o.Top5, o.Classifier
	case MetricAgreement:
		if o.Agreement != nil {
			return *o.Agreement, true
		}
	}
	return 0, false
}

// missed lists the bounds a misses. A top1 or top5 bound that applies to
// no classifier output is an error: it could never be judged.
func (t Target) missed(a *Accuracy) ([]Miss, error) {
	var out []Miss
	for _, b := range t {
		judged := false
		for _, o := range a.Outputs {
			if b.Output != "" && o.Output != b.Output {
				continue
			}
			v, ok := o.metric(b.Metric)
			if !ok {
				continue
			}
			judged = true
			if !(v >= b.Min) {
				out = append(out, Miss{Output: o.Output, Metric: b.Metric, Min: b.Min, Got: v})
			}
		}
		if !judged {
			what := "no output is"
			if b.Output != "" {
				what = fmt.Sprintf("output %q is not", b.Output)
			}
			kind := "a classifier ([N,C] or [N,C,1,1])"
			if b.Metric == MetricAgreement {
				kind = "a dense or peak map"
			}
			return nil, fmt.Errorf("accuracy target %s: %s %s, so %s does not apply", Target{b}, what, kind, b.Metric)
		}
	}
	return out, nil
}

// shortfall is how far misses are from their bounds, summed: the measure
// of the best step of a target that is not met.
func shortfall(misses []Miss) float64 {
	s := 0.0
	for _, m := range misses {
		s += m.Min - m.Got
	}
	return s
}

// TargetError is the error of a run whose Q/DQ model misses Config.Target
// even with every layer the search may keep in fp32 kept so. Report is the
// run's report at the best step reached (its Target, Accuracy and
// Quantization say which layers that keeps in fp32 and how close it came);
// Run writes nothing then.
type TargetError struct {
	Report *Report
}

func (e *TargetError) Error() string {
	t := e.Report.Target
	best := t.Steps[t.Best]
	var misses []string
	for _, m := range best.Missed {
		misses = append(misses, m.String())
	}
	return fmt.Sprintf("accuracy target %s not met: the best reached, after %d of %d steps with %d layers kept in fp32 (%.1f%% of compute int8), has %s",
		t.Target, t.Best, len(t.Steps)-1, len(t.Kept), 100*best.Int8Share, strings.Join(misses, ", "))
}

// errNoTargetSamples is returned for a target without validation samples.
var errNoTargetSamples = errors.New("an accuracy target needs validation samples (see --calib-fraction and --validation)")

// TargetReport is what the search for Config.Target did (Report.Target).
type TargetReport struct {
	Target Target `json:"target"`
	Met    bool   `json:"met"`
	// Steps are the models measured on the validation samples: the first
	// as calibrated (with Config.Exclude), then one per group of layers
	// kept in fp32 on top of the step before, and, once a group meets the
	// target, bisections of that group (see meetTarget).
	Steps []TargetStep `json:"steps"`
	// Best is the step the run's model is: of the steps that meet the
	// target the one with the most int8 compute, or, when none does, the
	// closest to it (the smallest summed shortfall).
	Best int `json:"best_step"`
	// Kept are the layers Best keeps in fp32 (see TargetStep.Kept).
	Kept []Layer `json:"kept,omitempty"`
	// Int8Share is Best's share of compute that is int8 (see TargetStep).
	Int8Share float64 `json:"int8_compute_share"`
}

// TargetStep is one model the search measured.
type TargetStep struct {
	// Kept are the layers the step keeps in fp32 beyond Config.Exclude,
	// in the order the search chose them.
	Kept    []Layer          `json:"kept,omitempty"`
	Outputs []OutputAccuracy `json:"outputs"`
	Missed  []Miss           `json:"missed,omitempty"`
	// Int8Share is the share of the estimated multiply-accumulates of the
	// Conv, ConvTranspose, Gemm and MatMul nodes with initializer weights
	// that the Q/DQ model runs in int8 (see layerMACs).
	Int8Share float64 `json:"int8_compute_share"`
}

// Change is what step i keeps in fp32 that step i-1 did not (added) and
// what step i-1 kept that step i does not (dropped, in a bisection).
func (t *TargetReport) Change(i int) (added, dropped []Layer) {
	if i <= 0 || i >= len(t.Steps) {
		return nil, nil
	}
	now, before := t.Steps[i].Kept, t.Steps[i-1].Kept
	for _, l := range now {
		if !slices.Contains(before, l) {
			added = append(added, l)
		}
	}
	for _, l := range before {
		if !slices.Contains(now, l) {
			dropped = append(dropped, l)
		}
	}
	return added, dropped
}

// The re-validations of a target search: the groups of layers kept grow
// (1, 1, 2, 4, ...: 1023 layers in 11 steps; the last growth step keeps all
// the layers left but one), and a group of more than one layer that meets
// the target is then bisected, up to maxRefineSteps times, for the
// shortest prefix of it (in the order ranked) that still does.
const (
	maxTargetSteps = 12
	maxRefineSteps = 4
)

// targetSearch carries one search: the fp32 model, the compute of its
// layers, the steps so far, the current model and the best one.
type targetSearch struct {
	t       Target
	ix      *onnx.Index
	macs    map[string]int64 // by weighted node output
	total   int64
	rep     TargetReport
	cur     *Quantized
	curAcc  *Accuracy
	best    *Quantized
	bestAcc *Accuracy
	score   float64   // the best step's shortfall
	first   *Accuracy // the first step's
}

func newTargetSearch(t Target, m *onnx.Model, first *Accuracy) *targetSearch {
	s := &targetSearch{t: t, ix: onnx.NewIndex(m.Graph()), macs: layerMACs(m, first), rep: TargetReport{Target: t}, first: first}
	for _, v := range s.macs {
		s.total += v
	}
	return s
}

// layerMACs estimates the multiply-accumulates per sample of each Conv,
// ConvTranspose, Gemm and MatMul node of m whose weight is an initializer,
// by its first output: the weight's elements times the output positions
// each is used at (output elements per sample over output channels: the
// spatial positions of a Conv, the rows of a MatMul; 1 for Gemm), with the
// output shapes a's evaluation saw. A ConvTranspose counts as a Conv of its
// output, which overcounts it by its strides' area; nodes whose weights are
// computed (attention's MatMuls) are left out, an output not seen counts
// one position.
func layerMACs(m *onnx.Model, a *Accuracy) map[string]int64 {
	ix := onnx.NewIndex(m.Graph())
	out := map[string]int64{}
	for _, n := range m.Graph().GetNode() {
		ins, outs := n.GetInput(), n.GetOutput()
		if !weighted[n.GetOpType()] || len(ins) < 2 || len(outs) == 0 {
			continue
		}
		w, ok := ix.Initializers[ins[1]]
		if !ok {
			continue
		}
		elems, _ := onnx.NumElements(w.GetDims())
		positions := int64(1)
		if d := a.shapes[outs[0]]; len(d) >= 2 && a.shapeRows > 0 {
			ch := d[len(d)-1]
			if n.GetOpType() == "Conv" || n.GetOpType() == "ConvTranspose" {
				ch = d[1]
			}
			if all, _ := onnx.NumElements(d); ch > 0 {
				positions = max(1, int64(all)/int64(a.shapeRows)/ch)
			}
		}
		out[outs[0]] = int64(elems) * positions
	}
	return out
}

// measure records a step: the layers it keeps, how q did and its share of
// int8 compute. It becomes the best step when it meets the target with more
// int8 compute than the best so far, or, while none meets it, when it is
// closer. It tells whether the step meets the target.
func (s *targetSearch) measure(kept []Layer, q *Quantized, a *Accuracy) (bool, error) {
	misses, err := s.t.missed(a)
	if err != nil {
		return false, err
	}
	st := TargetStep{Kept: kept, Outputs: a.Outputs, Missed: misses, Int8Share: s.int8Share(q)}
	s.rep.Steps = append(s.rep.Steps, st)
	met, sc := len(misses) == 0, shortfall(misses)
	better := s.best == nil
	if !better {
		b := s.rep.Steps[s.rep.Best]
		bestMet := len(b.Missed) == 0
		better = met && !bestMet || met && bestMet && st.Int8Share > b.Int8Share || !met && !bestMet && sc < s.score
	}
	if better {
		s.best, s.bestAcc, s.score, s.rep.Best = q, a, sc, len(s.rep.Steps)-1
	}
	return met, nil
}

// int8Share is the share of layerMACs that q runs in int8.
func (s *targetSearch) int8Share(q *Quantized) float64 {
	if s.total == 0 {
		return 0
	}
	var n int64
	for _, l := range q.Layers {
		n += s.macs[l.Output]
	}
	return float64(n) / float64(s.total)
}

// next is the group of layers to keep in fp32 next: the current model's
// quantized weighted nodes and Adds with the worst SQNR (see layerScore),
// as many as the step's group size. It is nil when the growth is over: the
// cap is reached, or one layer is left (a model without int8 layers is no
// int8 model).
func (s *targetSearch) next() []Layer {
	k := len(s.rep.Steps) // the step to come
	var cands []Layer
	for _, l := range s.cur.Layers {
		if weighted[l.Op] || l.Op == "Add" || l.Op == "Sum" {
			cands = append(cands, l)
		}
	}
	if len(cands) <= 1 || k > maxTargetSteps {
		return nil
	}
	out, in := map[string]float64{}, map[string]float64{}
	for _, t := range s.curAcc.Tensors {
		if t.Kind == "output" {
			out[t.Tensor] = t.SQNR
		} else {
			in[t.Tensor] = t.SQNR
		}
	}
	scores := map[string]float64{}
	for _, l := range cands {
		scores[l.Output] = s.layerScore(l, out, in)
	}
	sort.SliceStable(cands, func(a, b int) bool { return scores[cands[a].Output] < scores[cands[b].Output] })
	size := 1
	switch {
	case k == maxTargetSteps:
		size = len(cands) // all but one, below
	case k > 2:
		size = 1 << (k - 2)
	}
	return cands[:min(size, len(cands)-1)]
}

// layerScore ranks a layer for keeping in fp32, lowest first: the worst
// SQNR of its own quantized inputs against their fake quantization (the
// error its Q/DQ adds, which keeping it in fp32 removes), or, for a layer
// without quantized activations, the SQNR of its output in the Q/DQ model
// against fp32. The output's SQNR alone would rank by the error
// accumulated up to a layer, which grows with depth wherever it comes
// from: on PP-OCR's direction classifier it put the last layers first,
// and only keeping the first convolutions in fp32 helped.
func (s *targetSearch) layerScore(l Layer, out, in map[string]float64) float64 {
	v, found := math.Inf(1), false
	if n := s.ix.Producer[l.Output]; n != nil {
		for _, x := range n.GetInput() {
			if q, ok := in[x]; ok {
				v, found = min(v, q), true
			}
		}
	}
	if o, ok := out[l.Output]; ok && !found {
		return o
	}
	return v
}

// meetTarget keeps layers of the Q/DQ model q in fp32, worst first and
// re-measuring on the validation samples after each group, until the
// model meets j.cfg.Target; a group of several layers that meets it is
// then bisected for the shortest prefix that still does (see
// maxTargetSteps). It records in rep what it did (TargetReport) and
// returns the model to write, or a *TargetError carrying rep at the best
// step reached when no step meets the target.
func (rn *runner) meetTarget(ctx context.Context, j *job, ranges Ranges, rep *Report, q *Quantized) (*Quantized, error) {
	rep.Scope = j.cfg.Scope() // Run sets it too, but a *TargetError's report is not Run's
	s := newTargetSearch(j.cfg.Target, j.m, rep.Accuracy)
	met, err := s.measure(nil, q, rep.Accuracy)
	if err != nil {
		return nil, err
	}
	try := func(kept []Layer) (bool, error) {
		excl := slices.Clone(j.cfg.Exclude)
		for _, l := range kept {
			excl = append(excl, l.Output)
		}
		next, err := Quantize(j.m, ranges, QuantizeOptions{Exclude: excl})
		if err != nil {
			return false, err
		}
		accs, err := rn.validate(ctx, j, []*Quantized{next}, ranges)
		if err != nil {
			return false, err
		}
		met, err := s.measure(kept, next, accs[0])
		st := s.rep.Steps[len(s.rep.Steps)-1]
		rn.log.Info("accuracy target step", "step", len(s.rep.Steps)-1, "kept", len(kept), "int8_share", st.Int8Share, "met", met)
		s.cur, s.curAcc = next, accs[0]
		return met, err
	}
	var base, group []Layer
	s.cur, s.curAcc = q, rep.Accuracy
	for !met {
		if group = s.next(); group == nil {
			break
		}
		base = s.rep.Steps[len(s.rep.Steps)-1].Kept
		if met, err = try(append(slices.Clone(base), group...)); err != nil {
			return nil, err
		}
	}
	// Bisect the group that met the target: prefixes of lo layers miss it,
	// of hi layers meet it.
	for lo, hi, i := 0, len(group), 0; met && hi-lo > 1 && i < maxRefineSteps; i++ {
		mid := (lo + hi) / 2
		ok, err := try(append(slices.Clone(base), group[:mid]...))
		if err != nil {
			return nil, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return s.finish(rep)
}

// finish puts the best step into rep: its model, accuracy and the layers
// it keeps; the first step becomes the baseline when there is none.
func (s *targetSearch) finish(rep *Report) (*Quantized, error) {
	r := &s.rep
	r.Met = len(r.Steps[r.Best].Missed) == 0
	r.Int8Share = r.Steps[r.Best].Int8Share
	r.Kept = r.Steps[r.Best].Kept
	rep.Target = r
	if r.Best > 0 && rep.Baseline == nil {
		rep.Baseline = s.first
	}
	rep.Quantization, rep.Accuracy = s.best, s.bestAcc
	rep.worst()
	if !r.Met {
		return nil, &TargetError{Report: rep}
	}
	return s.best, nil
}
