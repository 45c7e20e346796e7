package trtexec

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// checkGolden compares got with testdata/<top-level test>/<name>.golden.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	testutil.GoldenFile(t, filepath.Join("testdata", strings.Split(t.Name(), "/")[0], name+".golden"), got)
}

func parseCorpusLog(t *testing.T, name string) *Log {
	t.Helper()
	f, err := os.Open(testutil.Corpus(t, "trt-logs", "trtexec", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := ParseLog(f)
	if err != nil {
		t.Fatalf("ParseLog(%s) error %v", name, err)
	}
	return l
}

func TestParseLog(t *testing.T) {
	for _, c := range corpusLogs {
		if !strings.HasSuffix(c.name, ".log") {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			l := parseCorpusLog(t, c.name)
			if l.Version == nil || *l.Version != c.version || l.Build != c.build {
				t.Errorf("ParseLog(%s) version %v build %q, want %v %q", c.name, l.Version, l.Build, c.version, c.build)
			}
			got, err := json.MarshalIndent(l, "", "  ")
			if err != nil {
				t.Fatalf("marshaling Log: %v", err)
			}
			checkGolden(t, c.name, append(got, '\n'))
		})
	}
}

// TestParseLogValues pins the values a reader of the golden files would
// check by hand against the corpus.
func TestParseLogValues(t *testing.T) {
	l := parseCorpusLog(t, "trt10.16_result-01.log")
	p := l.Performance
	if p == nil {
		t.Fatalf("ParseLog(result-01).Performance = nil, want the summary")
	}
	if p.ThroughputQPS != 15374.3 || p.TotalHostWalltimeSec != 3.00013 || p.TotalGPUComputeSec != 1.6586 {
		t.Errorf("ParseLog(result-01) throughput %v walltime %v gpu %v, want 15374.3 3.00013 1.6586",
			p.ThroughputQPS, p.TotalHostWalltimeSec, p.TotalGPUComputeSec)
	}
	want := Stats{Min: 0.0410156, Max: 0.14917, Mean: 0.0441053, Median: 0.0440674,
		Percentiles: Percentiles{90: 0.0450439, 95: 0.0458984, 99: 0.0512695}}
	if got, _ := json.Marshal(p.Latency); string(got) != mustJSON(t, want) {
		t.Errorf("ParseLog(result-01).Latency = %s, want %s", got, mustJSON(t, want))
	}
	if l.Status != StatusPassed || l.EngineBuildSeconds != 8.09138 || l.ComputeCapability != "9.0" || l.Device != "NVIDIA H100 PCIe" {
		t.Errorf("ParseLog(result-01) = status %s build %v cc %q device %q", l.Status, l.EngineBuildSeconds, l.ComputeCapability, l.Device)
	}
	if l.WarningCount != 4 || l.ErrorCount != 0 {
		t.Errorf("ParseLog(result-01) warnings %d errors %d, want 4 0", l.WarningCount, l.ErrorCount)
	}

	l = parseCorpusLog(t, "trt8.2_result-FP16_FAILED.log")
	if l.Status != StatusFailed || l.Performance != nil || l.BuildShapes["x:0"] != "1x1x28x28+4x1x28x28+16x1x28x28" {
		t.Errorf("ParseLog(8.2 FAILED) = status %s perf %v shapes %v", l.Status, l.Performance, l.BuildShapes)
	}
	if strings.Join(l.PrecisionFlags, " ") != "--fp16" {
		t.Errorf("ParseLog(8.2 FAILED).PrecisionFlags = %q, want [--fp16]", l.PrecisionFlags)
	}

	l = parseCorpusLog(t, "trt8.4_result-FP16.log")
	if p := l.Performance; p == nil || p.GPUCompute == nil || len(p.GPUCompute.Percentiles) != 1 || p.GPUCompute.Percentiles[99] != 0.427002 {
		t.Errorf("ParseLog(8.4 FP16).GPUCompute = %+v, want only percentile 99 = 0.427002", l.Performance)
	}

	l = parseCorpusLog(t, "trt10.16_result-02.log")
	if l.BuildShapes["x"] != "1x1x28x28+4x1x28x28+16x1x28x28" || l.InferenceShapes["x"] != "4x1x28x28" || l.EngineBuildSeconds != 24.4854 {
		t.Errorf("ParseLog(result-02) shapes %v / %v build %v", l.BuildShapes, l.InferenceShapes, l.EngineBuildSeconds)
	}
	if strings.Join(l.PrecisionFlags, " ") != "--fp16 --noTF32" || l.Precision != "FP32+FP16" {
		t.Errorf("ParseLog(result-02) flags %q precision %q", l.PrecisionFlags, l.Precision)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseLogMalformed(t *testing.T) {
	tests := []struct {
		name, in   string
		wantStatus Status
		wantErrs   int
		wantPerf   bool
	}{
		{"empty", "", StatusUnknown, 0, false},
		{"truncated", "&&&& RUNNING TensorRT.trtexec [TensorRT v100300] # trtexec\n[01/01/2024-00:00:00] [I] Start parsing", StatusUnknown, 0, false},
		{"errors without timestamp", "[E] Error[4]: x\n[F] fatal\n&&&& FAILED TensorRT.trtexec [TensorRT v8601] # t\n", StatusFailed, 2, false},
		{"broken summary line", "[I] === Performance summary ===\n[I] Throughput: lots qps\n[I] Latency: min = nan ms\n", StatusUnknown, 0, true},
		{"crlf", "&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # t\r\n&&&& PASSED TensorRT.trtexec [TensorRT v8601] # t\r\n", StatusPassed, 0, false},
		{"binary junk", "\x00\xff&&&& \n[[[\n] [E]\n", StatusUnknown, 0, false},
		{"huge line", strings.Repeat("x", 3<<20) + "\n&&&& WAIVED TensorRT.trtexec [TensorRT v8601]\n", StatusWaived, 0, false},
	}
	for _, tt := range tests {
		l, err := ParseLog(strings.NewReader(tt.in))
		if err != nil {
			t.Errorf("ParseLog(%s) error %v", tt.name, err)
			continue
		}
		if l.Status != tt.wantStatus || l.ErrorCount != tt.wantErrs || (l.Performance != nil) != tt.wantPerf {
			t.Errorf("ParseLog(%s) = status %s errors %d perf %v, want %s %d %v", tt.name, l.Status, l.ErrorCount, l.Performance != nil, tt.wantStatus, tt.wantErrs, tt.wantPerf)
		}
		if _, err := json.Marshal(l); err != nil {
			t.Errorf("json.Marshal(ParseLog(%s)) error %v", tt.name, err)
		}
	}
}

func TestPercentilesJSONRoundTrip(t *testing.T) {
	p := Percentiles{99: 1.5, 90: 0.5, 99.9: 2}
	b, err := json.Marshal(p)
	if err != nil || string(b) != `{"90":0.5,"99":1.5,"99.9":2}` {
		t.Fatalf("json.Marshal(%v) = %s, %v", p, b, err)
	}
	var back Percentiles
	if err := json.Unmarshal(b, &back); err != nil || len(back) != 3 || back[99.9] != 2 {
		t.Errorf("json.Unmarshal(%s) = %v, %v", b, back, err)
	}
}

// FuzzParseLog checks that no input makes ParseLog panic or produce a Log
// that cannot be written as JSON, and that a final verdict line is seen.
func FuzzParseLog(f *testing.F) {
	for _, c := range corpusLogs {
		b, err := os.ReadFile(testutil.CorpusPath(f, "trt-logs", "trtexec", c.name))
		if err != nil {
			continue
		}
		// Heads and tails keep the seeds small but cover banner and summary.
		f.Add(b[:min(len(b), 4096)])
		f.Add(b[max(0, len(b)-4096):])
	}
	f.Add([]byte("[I] === Performance summary ===\n[I] Latency: min = 1 ms, percentile(99%) = 2 ms\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseLog(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("ParseLog error %v on an in-memory reader", err)
		}
		if _, err := json.Marshal(l); err != nil {
			t.Fatalf("json.Marshal(ParseLog) error %v", err)
		}
		switch l.Status {
		case StatusPassed, StatusFailed, StatusWaived, StatusUnknown:
		default:
			t.Fatalf("ParseLog status %q", l.Status)
		}
		if len(l.Errors) > maxLogErrors || len(l.Errors) > l.ErrorCount || len(l.Warnings) > l.WarningCount {
			t.Fatalf("ParseLog kept %d/%d errors, %d/%d warnings", len(l.Errors), l.ErrorCount, len(l.Warnings), l.WarningCount)
		}
		// Appending a verdict line always decides the status.
		l2, _ := ParseLog(bytes.NewReader(append(append([]byte{}, data...), "\n&&&& PASSED TensorRT.trtexec [TensorRT v8601] # x\n"...)))
		if l2.Status != StatusPassed {
			t.Fatalf("ParseLog(data + PASSED line).Status = %s", l2.Status)
		}
	})
}
