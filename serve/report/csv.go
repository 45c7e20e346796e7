package report

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// CSVHeader is the header row Triton's perf_analyzer writes with -f FILE in
// concurrency mode with server statistics and its default percentiles
// (report_writer.cc); tools made for its files (model-analyzer, plotting
// scripts) read columns by these names.
var CSVHeader = []string{
	"Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv",
	"Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output",
	"Client Recv", "p50 latency", "p90 latency", "p95 latency", "p99 latency",
}

// WriteCSV writes m's measurements as perf_analyzer's -f CSV: CSVHeader,
// then one row per concurrency. perf_analyzer measures one batch size per
// run (-b) and so per file; a model measured at several batch sizes needs
// one file per size (WriteCSVBatch), and WriteCSV returns an error for it.
// A model without measurements gives the header alone.
func WriteCSV(w io.Writer, m *Model) error {
	bs := m.Perf.BatchSizes()
	if len(bs) > 1 {
		return fmt.Errorf("writing perf_analyzer CSV of %s: measured at batch sizes %v, and a perf_analyzer file holds one", m.Name, bs)
	}
	batch := 0
	if len(bs) == 1 {
		batch = bs[0]
	}
	return WriteCSVBatch(w, m, batch)
}

// WriteCSVBatch writes the rows of m's measurements at one batch size, as
// perf_analyzer -b batch -f FILE would, with these differences:
//
//   - rows are in order of concurrency (perf_analyzer sorts them by
//     throughput, which for a healthy model is the same order);
//   - values are as precise as perf_analyzer's: inferences/second with 6
//     significant digits, latencies truncated to whole microseconds;
//   - kiln measures latency at the client only, so "Client Send", "Client
//     Recv" and the five "Server ..." columns are 0, and "Network+Server
//     Send/Recv" holds the mean latency: what perf_analyzer itself writes
//     there when the server reports no statistics, so that the columns still
//     add up to the mean latency.
func WriteCSVBatch(w io.Writer, m *Model, batch int) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return fmt.Errorf("writing perf_analyzer CSV of %s: %w", m.Name, err)
	}
	var pts []PerfPoint
	if m.Perf != nil {
		for _, p := range m.Perf.Points {
			if p.Batch == batch {
				pts = append(pts, p)
			}
		}
	}
	slices.SortStableFunc(pts, func(a, b PerfPoint) int { return cmp.Compare(a.Concurrency, b.Concurrency) })
	for _, p := range pts {
		row := []string{
			strconv.Itoa(p.Concurrency),
			strconv.FormatFloat(p.ThroughputInferPerSec, 'g', 6, 64),
			"0", us(p.LatencyAvgUS), "0", "0", "0", "0", "0",
			us(p.LatencyP50US), us(p.LatencyP90US), us(p.LatencyP95US), us(p.LatencyP99US),
		}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("writing perf_analyzer CSV of %s: %w", m.Name, err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing perf_analyzer CSV of %s: %w", m.Name, err)
	}
	return nil
}

// BatchSizes lists the batch sizes p measured, ascending; nil for a nil p.
func (p *Perf) BatchSizes() []int {
	if p == nil {
		return nil
	}
	var bs []int
	for _, pt := range p.Points {
		if !slices.Contains(bs, pt.Batch) {
			bs = append(bs, pt.Batch)
		}
	}
	slices.Sort(bs)
	return bs
}

// us is whole microseconds, truncated as perf_analyzer's integer division
// truncates nanoseconds.
func us(v float64) string {
	return strconv.FormatInt(int64(v), 10)
}
