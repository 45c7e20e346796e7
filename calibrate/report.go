package calibrate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// WorstLayers is how many tensors the report names as the worst.
const WorstLayers = 10

// Report is what Run did and how close the Q/DQ model is to fp32. It is
// written as report.json and, for people, report.md.
type Report struct {
	Model              string          `json:"model"`
	ModelDigest        manifest.Digest `json:"model_digest"`
	Dataset            string          `json:"dataset"`
	DatasetDigest      manifest.Digest `json:"dataset_digest"`
	Method             Method          `json:"method"`
	Batch              int             `json:"batch"`
	CalibrationSamples int             `json:"calibration_samples"`
	ValidationSamples  int             `json:"validation_samples"`
	// ValidationSplit names the validation samples, so that serve and
	// convert check variants on exactly the samples calibration did not see.
	ValidationSplit *manifest.DataSplit `json:"validation_split,omitempty"`
	// UnusedSamples are drawn samples left out because the model fixes
	// its batch size and they make no full batch.
	UnusedSamples int `json:"unused_samples,omitempty"`
	// Scope is which tensors were observed: ScopeQDQ (what the Q/DQ model
	// quantizes) or ScopeAll (every tensor, for the TensorRT cache or the
	// ONNX Runtime table).
	Scope Scope `json:"scope"`
	// TensorRanges is the number of tensors in ranges.json (and the cache).
	TensorRanges int `json:"tensor_ranges"`
	// TRTVersion is the version number in the cache header.
	TRTVersion   int        `json:"trt_version"`
	Exclude      []string   `json:"exclude,omitempty"`
	Quantization *Quantized `json:"quantization"`
	// Accuracy is the written model's accuracy against fp32 on the
	// validation samples (nil without validation samples).
	Accuracy *Accuracy `json:"accuracy,omitempty"`
	// Baseline is the accuracy without Exclude, when Exclude is set, or
	// else the first step's when the search for Config.Target kept layers.
	Baseline *Accuracy `json:"baseline,omitempty"`
	// Target is what the search for Config.Target did (nil without one).
	Target *TargetReport `json:"target,omitempty"`
	// Worst are the WorstLayers tensors with the lowest SQNR.
	Worst    []TensorError `json:"worst"`
	Files    []string      `json:"files"`
	Duration string        `json:"duration"`
}

func (r *Report) worst() {
	r.Worst = nil
	if r.Accuracy != nil {
		r.Worst = r.Accuracy.Tensors[:min(WorstLayers, len(r.Accuracy.Tensors))]
	}
}

// JSON renders the report as indented JSON with a final newline.
func (r *Report) JSON() ([]byte, error) { return indentJSON(r) }

// indentJSON renders v as two-space indented JSON with a final newline,
// leaving <, > and & as they are: the form of kiln's JSON files.
func indentJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Markdown renders the report for CI logs and people.
func (r *Report) Markdown() []byte {
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# INT8 calibration of %s\n\n", filepath.Base(r.Model))
	p("| | |\n|---|---|\n")
	p("| model | `%s` (%s) |\n", r.Model, r.ModelDigest)
	p("| dataset | `%s` (%s) |\n", r.Dataset, r.DatasetDigest)
	p("| method | %s |\n", r.Method)
	p("| samples | %d calibration, %d validation, batch %d |\n", r.CalibrationSamples, r.ValidationSamples, r.Batch)
	if r.UnusedSamples > 0 {
		p("| unused samples | %d (the model fixes batch %d; they make no full batch) |\n", r.UnusedSamples, r.Batch)
	}
	p("| ranges | %d tensors, scope %s (%s) |\n", r.TensorRanges, r.Scope, r.rangeFiles())
	if q := r.Quantization; q != nil {
		perChannel := 0
		for _, w := range q.Weights {
			if w.Axis >= 0 {
				perChannel++
			}
		}
		p("| Q/DQ model | opset %d: %d activations per tensor, %d weights int8 (%d per channel), %d layers |\n",
			q.Opset, len(q.Activations), len(q.Weights), perChannel, len(q.Layers))
		if len(q.Excluded) > 0 {
			var names []string
			for _, l := range q.Excluded {
				names = append(names, fmt.Sprintf("`%s` (%s)", layerName(l), l.Op))
			}
			p("| kept in fp32 | %s |\n", strings.Join(names, ", "))
		}
	}
	p("\n")
	if r.Accuracy == nil {
		p("No validation samples: accuracy was not measured (the Q/DQ model was run once to check that it loads).\n")
	} else {
		p("## Outputs: int8 Q/DQ against fp32 on %d samples\n\n", r.Accuracy.Samples)
		if r.Baseline != nil {
			p("Before is without exclusions, after keeps %s in fp32.\n\n", strings.Join(r.keptNames(), ", "))
			p("| output | cosine before | cosine after | top-1 before | top-1 after | top-5 after | max abs after | mean abs after |\n|---|---|---|---|---|---|---|---|\n")
			for i, o := range r.Accuracy.Outputs {
				bo := r.Baseline.Outputs[i]
				p("| `%s` | %.6f | %.6f | %s | %s | %s | %.4g | %.4g |\n", o.Output, bo.Cosine, o.Cosine,
					share(bo.Classifier, bo.Top1), share(o.Classifier, o.Top1), share(o.Classifier, o.Top5), o.MaxAbs, o.MeanAbs)
			}
		} else {
			p("| output | kind | cosine | min cosine | top-1 | top-5 | agreement | max abs | mean abs |\n|---|---|---|---|---|---|---|---|---|\n")
			for _, o := range r.Accuracy.Outputs {
				agree := "—"
				if o.Agreement != nil {
					agree = fmt.Sprintf("%.4f (%s)", *o.Agreement, o.AgreementKind)
				}
				p("| `%s` | %s | %.6f | %.6f | %s | %s | %s | %.4g | %.4g |\n", o.Output, o.Kind, o.Cosine, o.MinCosine,
					share(o.Classifier, o.Top1), share(o.Classifier, o.Top5), agree, o.MaxAbs, o.MeanAbs)
			}
		}
		p("\n## Worst tensors (SQNR, higher is better)\n\n")
		p("`quantized`: the activation against its own fake quantization; `output`: a quantized layer's output in the Q/DQ model against fp32.\n\n")
		p("| tensor | kind | node | SQNR dB |\n|---|---|---|---|\n")
		for _, t := range r.Worst {
			p("| `%s` | %s | `%s` | %.1f |\n", t.Tensor, t.Kind, t.Node, t.SQNR)
		}
	}
	if r.Target != nil {
		b.Write(r.Target.markdown())
	}
	if q := r.Quantization; q != nil && len(q.Notes) > 0 {
		p("\n## Notes\n\n")
		for _, n := range q.Notes {
			switch {
			case n.Node != "" && n.Tensor != "":
				p("- node `%s`, tensor `%s`: %s\n", n.Node, n.Tensor, n.Text)
			case n.Tensor != "":
				p("- tensor `%s`: %s\n", n.Tensor, n.Text)
			default:
				p("- %s\n", n.Text)
			}
		}
	}
	return b.Bytes()
}

// rangeFiles names the files of Files that hold ranges, the cache with its
// header.
func (r *Report) rangeFiles() string {
	var names []string
	for _, f := range r.Files {
		switch f {
		case RangesFile:
			names = append(names, f)
		case CacheFile:
			names = append(names, fmt.Sprintf("%s `TRT-%d-%s`", f, r.TRTVersion, EntropyCalibration2))
		case ORTDir + "/":
			names = append(names, f)
		}
	}
	return strings.Join(names, ", ")
}

// keptNames are Exclude and the layers the target search kept in fp32.
func (r *Report) keptNames() []string {
	names := slices.Clone(r.Exclude)
	if r.Target != nil {
		for _, l := range r.Target.Kept {
			names = append(names, layerName(l))
		}
	}
	return names
}

// markdown is the report's section on the accuracy target: the outcome,
// then each step with the layers it kept, its int8 compute and how the
// bounded metrics did.
func (t *TargetReport) markdown() []byte {
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("\n## Accuracy target `%s`\n\n", t.Target)
	verdict := "met"
	if !t.Met {
		verdict = "not met; the best reached is"
	}
	var kept []string
	for _, l := range t.Kept {
		kept = append(kept, fmt.Sprintf("`%s` (%s)", layerName(l), l.Op))
	}
	p("%s at step %d of %d: %d layers kept in fp32 by the search%s; %.1f%% of the compute (estimated multiply-accumulates of Conv, ConvTranspose, Gemm and MatMul) int8.\n\n",
		verdict, t.Best, len(t.Steps)-1, len(t.Kept), prefixed(": ", strings.Join(kept, ", ")), 100*t.Int8Share)
	p("Each step keeps the layers of the step before in fp32 and those marked +, less those marked - (a bisection of the last group).\n\n")
	p("| step | kept in fp32 | int8 compute | accuracy | missed |\n|---|---|---|---|---|\n")
	for i, st := range t.Steps {
		var change, got, missed []string
		added, dropped := t.Change(i)
		for _, l := range added {
			change = append(change, "+`"+layerName(l)+"`")
		}
		for _, l := range dropped {
			change = append(change, "-`"+layerName(l)+"`")
		}
		for _, o := range st.Outputs {
			var ms []string
			for _, m := range targetMetrics {
				if v, ok := o.metric(m); ok && t.bounds(o.Output, m) {
					ms = append(ms, fmt.Sprintf("%s %.4f", m, v))
				}
			}
			if len(ms) > 0 {
				got = append(got, fmt.Sprintf("`%s` %s", o.Output, strings.Join(ms, ", ")))
			}
		}
		for _, m := range st.Missed {
			missed = append(missed, m.String())
		}
		p("| %d | %d: %s | %.1f%% | %s | %s |\n", i, len(st.Kept), orDash(strings.Join(change, ", ")), 100*st.Int8Share, strings.Join(got, "; "), orDash(strings.Join(missed, "; ")))
	}
	return b.Bytes()
}

// bounds tells whether the target bounds metric of output.
func (t *TargetReport) bounds(output, metric string) bool {
	for _, b := range t.Target {
		if b.Metric == metric && (b.Output == "" || b.Output == output) {
			return true
		}
	}
	return false
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func layerName(l Layer) string {
	if l.Node != "" {
		return l.Node
	}
	return l.Output
}

func share(ok bool, v float64) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.4f", v)
}

func writeReport(dir string, r *Report) error {
	js, err := r.JSON()
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, ReportJSON), js, 0o644); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, ReportMD), r.Markdown(), 0o644)
}
