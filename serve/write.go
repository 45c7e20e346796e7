package serve

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/serve/report"
)

// Report file names in the -o directory.
const (
	ReportJSON     = "report.json"
	ReportMarkdown = "report.md"
	ReportHTML     = "report.html"
	// PerfCSVSuffix ends the perf_analyzer CSVs of each timed model, one
	// per batch size as perf_analyzer -b writes them: <model>.b<batch>.perf.csv.
	PerfCSVSuffix = ".perf.csv"
)

// WriteReports writes the report as JSON, Markdown and HTML, and the
// perf_analyzer CSV of every timed model, into dir, all or nothing.
func WriteReports(dir string, rep *report.Report) ([]string, error) {
	files := map[string][]byte{}
	render := func(name string, f func(*bytes.Buffer) error) error {
		var b bytes.Buffer
		if err := f(&b); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		files[filepath.Join(dir, name)] = b.Bytes()
		return nil
	}
	steps := []struct {
		name string
		f    func(*bytes.Buffer) error
	}{
		{ReportJSON, func(b *bytes.Buffer) error { return report.WriteJSON(b, rep) }},
		{ReportMarkdown, func(b *bytes.Buffer) error { return report.WriteMarkdown(b, rep) }},
		{ReportHTML, func(b *bytes.Buffer) error { return report.WriteHTML(b, rep) }},
	}
	for i := range rep.Models {
		m := &rep.Models[i]
		if m.Perf == nil || len(m.Perf.Points) == 0 {
			continue
		}
		for _, batch := range batchSizes(m.Perf) {
			steps = append(steps, struct {
				name string
				f    func(*bytes.Buffer) error
			}{fmt.Sprintf("%s.b%d%s", m.Name, batch, PerfCSVSuffix), func(b *bytes.Buffer) error { return report.WriteCSVBatch(b, m, batch) }})
		}
	}
	var names []string
	for _, s := range steps {
		if err := render(s.name, s.f); err != nil {
			return nil, err
		}
		names = append(names, filepath.Join(dir, s.name))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFiles(files, 0o644); err != nil {
		return nil, err
	}
	return names, nil
}

// batchSizes lists the batch sizes p measured, in order.
func batchSizes(p *report.Perf) []int {
	var out []int
	for _, pt := range p.Points {
		if !slices.Contains(out, pt.Batch) {
			out = append(out, pt.Batch)
		}
	}
	return out
}
