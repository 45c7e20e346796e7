package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The number formats the Markdown and HTML summaries share, so both say the
// same thing about the same report.

// num prints a metric with up to 6 significant digits: 0.99998, 0.981, 12.5.
func num(v float64) string {
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// latency prints microseconds in the unit that keeps 3 digits in view.
func latency(us float64) string {
	switch {
	case math.IsNaN(us) || math.IsInf(us, 0):
		return num(us)
	case us < 1000:
		return fmt.Sprintf("%.0f µs", us)
	case us < 1e6:
		return fmt.Sprintf("%.3g ms", us/1e3)
	default:
		return fmt.Sprintf("%.3g s", us/1e6)
	}
}

// bytesIEC prints a size with binary units: 1.2 MiB.
func bytesIEC(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"} {
		v, unit = v/1024, u
		if v < 1024 {
			break
		}
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}

// latencyCell is "p50 / p99" at concurrency 1, or "—".
func latencyCell(p *Perf) string {
	if p == nil {
		return "—"
	}
	pt := p.at(1)
	if pt == nil {
		return "—"
	}
	return latency(pt.LatencyP50US) + " / " + latency(pt.LatencyP99US)
}

// throughputCell is the best throughput and where it was reached, or "—".
func throughputCell(p *Perf) string {
	pt := p.best()
	if pt == nil {
		return "—"
	}
	where := fmt.Sprintf("c%d", pt.Concurrency)
	if pt.Batch > 1 {
		where += fmt.Sprintf(", b%d", pt.Batch)
	}
	return fmt.Sprintf("%.0f infer/s (%s)", pt.ThroughputInferPerSec, where)
}

func sizeCell(n int64) string {
	if n <= 0 {
		return "—"
	}
	return bytesIEC(n)
}

// comparison is "0.981 < 0.99" for a miss, "0.99998 ≥ 0.999" for a lower
// bound met, or the bare value when nothing bounded it. A headline that is
// not a failure is a cosine, a lower bound, whose miss may still show when
// the model was not judged.
func (h headline) comparison() string {
	switch {
	case !h.HasThreshold:
		return num(h.Value)
	case h.Failed:
		return num(h.Value) + " " + missOp(h.Value, h.Threshold) + " " + num(h.Threshold)
	case !(h.Value >= h.Threshold): // NaN misses too
		return num(h.Value) + " < " + num(h.Threshold)
	default:
		return num(h.Value) + " ≥ " + num(h.Threshold)
	}
}

// failureLine is one failure in full, as both summaries list it.
func failureLine(f failureOf) string {
	s := fmt.Sprintf("%s: output %s, %s %s %s %s", f.Model, f.Output, f.Metric, num(f.Value),
		missOp(f.Value, f.Threshold), num(f.Threshold))
	if f.Sample != "" {
		s += ", worst sample " + f.Sample
	}
	return s
}

func missOp(v, t float64) string {
	if v < t {
		return "<"
	}
	return ">"
}

// runtimeCell is "onnx/fp16".
func runtimeCell(m *Model) string {
	return strings.Trim(m.Runtime+"/"+m.Precision, "/")
}
