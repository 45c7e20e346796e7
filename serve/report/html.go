package report

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"strconv"
)

//go:embed report.html.tmpl
var htmlSource string

var htmlTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"f":    func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"add":  func(a, b float64) float64 { return a + b },
	"sub":  func(a, b float64) float64 { return a - b },
	"mid":  func(a, b float64) float64 { return (a + b) / 2 },
	"half": func(a float64) float64 { return a / 2 },
}).Parse(htmlSource))

// htmlPage is what the template draws.
type htmlPage struct {
	R          *Report
	Word       string
	Counts     string
	Provenance string
	Random     bool
	OneGroup   bool
	Groups     []htmlGroup
	Failures   []string
	Reasons    []string
	Charts     []chart
}

type htmlGroup struct {
	Reference string
	Rows      []htmlRow
}

type htmlRow struct {
	Name, Runtime, Verdict, Class, Worst, Latency, Throughput, Size string
}

// Class is the CSS class of a verdict's colour; an unknown verdict (a
// report not summarized) is grey rather than a class made from user data.
func (htmlPage) Class(v Verdict) string {
	if v.Valid() {
		return "v-" + string(v)
	}
	return "v-unknown"
}

// WriteHTML writes r as one self-contained HTML page: a banner with the
// overall verdict in its colour, the data label, a table per reference like
// WriteMarkdown's, the failures, and three inline SVG charts (latency p50
// and p99 against concurrency, one line per model; worst-sample cosine and
// top-1 agreement per model with thresholds marked; size per model). The
// page loads nothing (its Content-Security-Policy forbids it) and runs no
// script. html/template escapes all text from the report. Each chart is an
// <svg id="chart-latency|chart-accuracy|chart-size"> whose data elements
// carry data-model, data-metric and data-value; a chart without data says
// "no data".
func WriteHTML(w io.Writer, r *Report) error {
	p := htmlPage{
		R:          r,
		Word:       verdictWord(r.Verdict),
		Counts:     countLine(r),
		Provenance: provenance(r),
		Random:     r.Data.Kind == KindRandom,
		Reasons:    reasons(r),
		Charts:     []chart{latencyChart(r), accuracyChart(r), sizeChart(r)},
	}
	gs := groups(r)
	p.OneGroup = len(gs) == 1
	for _, g := range gs {
		hg := htmlGroup{Reference: g.Reference}
		for _, m := range g.Models {
			hg.Rows = append(hg.Rows, htmlRow{
				Name: m.Name, Runtime: runtimeCell(m), Verdict: string(m.Verdict), Class: p.Class(m.Verdict),
				Worst: worstCell(m), Latency: latencyCell(m.Perf), Throughput: throughputCell(m.Perf), Size: sizeCell(m.Size),
			})
		}
		p.Groups = append(p.Groups, hg)
	}
	for _, f := range failures(r) {
		p.Failures = append(p.Failures, failureLine(f))
	}
	if err := htmlTemplate.Execute(w, p); err != nil {
		return fmt.Errorf("writing HTML report of %s: %w", r.Subject, err)
	}
	return nil
}
