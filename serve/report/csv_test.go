package report

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestWriteCSV(t *testing.T) {
	m := &tinynet().Models[0]
	var b bytes.Buffer
	if err := WriteCSV(&b, m); err != nil {
		t.Fatalf("WriteCSV: %v", err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatalf("encoding/csv cannot read WriteCSV's output: %v", err)
	}
	want := "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency"
	if got := strings.Join(rows[0], ","); got != want {
		t.Fatalf("header = %s\nwant %s", got, want)
	}
	if len(rows) != 1+len(m.Perf.Points) {
		t.Fatalf("WriteCSV wrote %d rows, want header + %d", len(rows), len(m.Perf.Points))
	}
	col := func(name string) int { return slices.Index(rows[0], name) }
	for i, row := range rows[1:] {
		p := m.Perf.Points[i]
		if len(row) != len(rows[0]) {
			t.Fatalf("row %d has %d columns, header %d", i, len(row), len(rows[0]))
		}
		for name, want := range map[string]string{
			"Concurrency":              strconv.Itoa(p.Concurrency),
			"p50 latency":              strconv.Itoa(int(p.LatencyP50US)),
			"p99 latency":              strconv.Itoa(int(p.LatencyP99US)),
			"Network+Server Send/Recv": strconv.Itoa(int(p.LatencyAvgUS)),
			"Server Queue":             "0",
			"Client Send":              "0",
		} {
			if got := row[col(name)]; got != want {
				t.Errorf("row %d %s = %s, want %s", i, name, got, want)
			}
		}
		ips, err := strconv.ParseFloat(row[col("Inferences/Second")], 64)
		if err != nil || ips/p.ThroughputInferPerSec < 0.99999 || ips/p.ThroughputInferPerSec > 1.00001 {
			t.Errorf("row %d Inferences/Second = %s, want %g", i, row[1], p.ThroughputInferPerSec)
		}
	}
}

func TestWriteCSVBatches(t *testing.T) {
	m := &tinynet().Models[0]
	for _, p := range slices.Clone(m.Perf.Points) {
		p.Batch, p.ThroughputInferPerSec = 8, p.ThroughputInferPerSec*6
		m.Perf.Points = append(m.Perf.Points, p)
	}
	// Out of order, to show the rows come sorted by concurrency.
	slices.Reverse(m.Perf.Points)
	if got := m.Perf.BatchSizes(); !slices.Equal(got, []int{1, 8}) {
		t.Fatalf("BatchSizes() = %v, want [1 8]", got)
	}
	var b bytes.Buffer
	if err := WriteCSV(&b, m); err == nil || !strings.Contains(err.Error(), "batch sizes [1 8]") {
		t.Errorf("WriteCSV with two batch sizes: error %v, want one naming them", err)
	}
	b.Reset()
	if err := WriteCSVBatch(&b, m, 8); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var concs []string
	for _, r := range rows[1:] {
		concs = append(concs, r[0])
	}
	if !slices.Equal(concs, []string{"1", "2", "4", "8"}) {
		t.Errorf("WriteCSVBatch(8) concurrencies = %v, want [1 2 4 8]", concs)
	}
}

func TestWriteCSVNoPerf(t *testing.T) {
	var b bytes.Buffer
	if err := WriteCSV(&b, &tinynet().Models[3]); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), strings.Join(CSVHeader, ",")+"\n"; got != want {
		t.Errorf("WriteCSV(no perf) = %q, want the header alone", got)
	}
}
