package trtexec

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
)

// Status is trtexec's final verdict, from its last "&&&&" line.
type Status string

// The verdicts trtexec prints (reference/formats.md §7.1), and Unknown for a
// log that stops before one (a crash, a kill, a truncated file).
const (
	StatusPassed  Status = "PASSED"
	StatusFailed  Status = "FAILED"
	StatusWaived  Status = "WAIVED"
	StatusUnknown Status = "unknown"
)

// How many error and warning messages a Log keeps; the counts are exact.
const (
	maxLogErrors   = 20
	maxLogWarnings = 10
)

// Log is what kiln reads from a trtexec console log.
type Log struct {
	// Version comes from the banner ("[TensorRT v101601]"), else from the
	// "TensorRT version: 10.16.1" line.
	Version *manifest.TRTVersion `json:"version,omitempty"`
	// Build is the build number of "[b11]"; empty before TensorRT 8.4.
	Build string `json:"build,omitempty"`
	// Command is the command line from the banner, argv joined by spaces.
	Command string `json:"command,omitempty"`
	Status  Status `json:"status"`
	// PrecisionFlags are the precision-related flags of the command line.
	PrecisionFlags []string `json:"precision_flags,omitempty"`
	// Precision is trtexec's own summary, "FP32+FP16".
	Precision string `json:"precision,omitempty"`
	// BuildShapes maps an input to its "min+opt+max" dims, InferenceShapes
	// to its inference dims, as trtexec echoes them.
	BuildShapes     map[string]string `json:"build_shapes,omitempty"`
	InferenceShapes map[string]string `json:"inference_shapes,omitempty"`
	// WorkspaceMiB is the workspace pool trtexec took from the command line
	// ("Memory Pools: workspace: 1024 MiB", 8.2 "Workspace: 1024 MiB");
	// zero when default. It shows misread sizes: TensorRT 10 takes
	// "workspace:1024MiB" as 1024 bytes (corpus trt10.16_result-02).
	WorkspaceMiB float64 `json:"workspace_mib,omitempty"`
	// Device and ComputeCapability describe the GPU trtexec ran on.
	Device            string `json:"device,omitempty"`
	ComputeCapability string `json:"compute_capability,omitempty"`
	// ErrorCount counts [E] and [F] lines; Errors keeps the first ones,
	// without timestamp and severity.
	ErrorCount   int      `json:"error_count"`
	Errors       []string `json:"errors,omitempty"`
	WarningCount int      `json:"warning_count"`
	Warnings     []string `json:"warnings,omitempty"`
	// EngineBuildSeconds is from "Engine built in X sec."; zero if absent.
	EngineBuildSeconds float64 `json:"engine_build_seconds,omitempty"`
	// Performance is the "=== Performance summary ===" block, if any.
	Performance *Performance `json:"performance,omitempty"`
}

// Performance is trtexec's performance summary (samples/common/
// sampleReporting.cpp printEpilog). Times are in milliseconds, totals in
// seconds.
type Performance struct {
	ThroughputQPS float64 `json:"throughput_qps"`
	Latency       *Stats  `json:"latency,omitempty"`
	Enqueue       *Stats  `json:"enqueue,omitempty"`
	H2D           *Stats  `json:"h2d,omitempty"`
	GPUCompute    *Stats  `json:"gpu_compute,omitempty"`
	D2H           *Stats  `json:"d2h,omitempty"`
	// TotalHostWalltimeSec and TotalGPUComputeSec are in seconds.
	TotalHostWalltimeSec float64 `json:"total_host_walltime_s"`
	TotalGPUComputeSec   float64 `json:"total_gpu_compute_s"`
}

// Stats is one timing line of the summary, in milliseconds.
type Stats struct {
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	// Percentiles maps a percentage (99) to its value.
	Percentiles Percentiles `json:"percentiles,omitempty"`
}

// Percentiles maps a percentage to a time. It marshals to a JSON object
// keyed by the percentage ("99", "99.9"), which plain float keys cannot.
type Percentiles map[float64]float64

// MarshalJSON writes the map with keys in increasing order.
func (p Percentiles) MarshalJSON() ([]byte, error) {
	keys := make([]float64, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Float64s(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		v, err := json.Marshal(p[k])
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "%q:%s", strconv.FormatFloat(k, 'g', -1, 64), v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *Percentiles) UnmarshalJSON(data []byte) error {
	var m map[string]float64
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*p = make(Percentiles, len(m))
	for k, v := range m {
		f, err := parseFinite(k, 64)
		if err != nil {
			return fmt.Errorf("percentile key %q: %w", k, err)
		}
		(*p)[f] = v
	}
	return nil
}

// logLineRE splits "[07/07/2026-02:10:45] [I] text" into severity and text.
// The timestamp is optional: some builds and redirected loggers omit it.
var logLineRE = regexp.MustCompile(`^(?:\[[0-9/:.\- ]+\] )?\[([VIWEF])\] ?(.*)$`)

// statsRE matches one "key = value ms" item of a timing line.
var statsRE = regexp.MustCompile(`^(min|max|mean|median|percentile\(([0-9.]+)%\)) = (\S+) ms$`)

// precisionFlags are the command-line flags that choose a precision.
var precisionFlags = map[string]bool{"--fp16": true, "--bf16": true, "--int8": true, "--fp8": true,
	"--int4": true, "--best": true, "--stronglyTyped": true, "--noTF32": true, "--calib": true}

// maxLogLine bounds one line; longer lines are cut (trtexec's longest, layer
// info JSON, stay well below).
const maxLogLine = 1 << 20

// ParseLog reads a trtexec console log. It never fails on content it does
// not understand, only on a read error: unknown lines are skipped, and a
// log without a final "&&&&" line has Status unknown.
func ParseLog(r io.Reader) (*Log, error) {
	l := &Log{Status: StatusUnknown}
	br := bufio.NewReaderSize(r, 64<<10)
	inSummary := false
	for {
		line, err := readLine(br)
		if line != "" || err == nil {
			inSummary = l.parseLine(line, inSummary)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return l, fmt.Errorf("reading trtexec log: %w", err)
		}
	}
	return l, nil
}

// readLine returns the next line without its ending, cut at maxLogLine.
func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	full := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !full && len(b)+len(chunk) <= maxLogLine {
			b = append(b, chunk...)
		} else {
			full = true
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		s := strings.TrimRight(string(b), "\r\n")
		if err == io.EOF && len(b) == 0 {
			return "", io.EOF
		}
		return s, err
	}
}

// parseLine takes one line into l and reports whether the performance
// summary continues after it.
func (l *Log) parseLine(line string, inSummary bool) bool {
	if strings.HasPrefix(line, "&&&& ") {
		l.parseBanner(line)
		return false
	}
	m := logLineRE.FindStringSubmatch(line)
	if m == nil {
		return false
	}
	sev, text := m[1], strings.TrimRight(m[2], " ")
	switch sev {
	case "E", "F":
		l.ErrorCount++
		if len(l.Errors) < maxLogErrors {
			l.Errors = append(l.Errors, text)
		}
		return false
	case "W":
		l.WarningCount++
		if len(l.Warnings) < maxLogWarnings {
			l.Warnings = append(l.Warnings, text)
		}
		return false
	case "V":
		return false
	}
	if text == "=== Performance summary ===" {
		if l.Performance == nil {
			l.Performance = &Performance{}
		}
		return true
	}
	if inSummary && l.parseSummary(text) {
		return true
	}
	l.parseInfo(text)
	return false
}

func (l *Log) parseBanner(line string) {
	b, err := ParseBanner(line)
	if err != nil {
		return
	}
	switch b.Status {
	case "RUNNING":
		v := b.Version
		l.Version, l.Build, l.Command = &v, b.Build, b.Command
		l.PrecisionFlags = nil
		for _, a := range strings.Fields(b.Command) {
			name, _, _ := strings.Cut(a, "=")
			if precisionFlags[name] {
				l.PrecisionFlags = append(l.PrecisionFlags, a)
			}
		}
	default:
		l.Status = Status(b.Status)
		if l.Version == nil {
			v := b.Version
			l.Version = &v
		}
	}
}

// parseInfo reads the [I] lines kiln cares about outside the summary.
func (l *Log) parseInfo(text string) {
	key, val, ok := strings.Cut(text, ": ")
	if !ok {
		// "Engine built in 8.09138 sec." has no colon.
		if rest, ok := strings.CutPrefix(text, "Engine built in "); ok {
			if f, err := parseFinite(strings.TrimSuffix(rest, " sec."), 64); err == nil {
				l.EngineBuildSeconds = f
			}
		}
		return
	}
	key = strings.TrimSpace(key)
	switch {
	case key == "Precision":
		l.Precision = val
	case key == "Memory Pools" || key == "Workspace":
		ws := strings.TrimPrefix(val, "workspace: ")
		ws, _, _ = strings.Cut(ws, ",")
		if f, err := parseFinite(strings.TrimSuffix(ws, " MiB"), 64); err == nil && strings.HasSuffix(ws, " MiB") {
			l.WorkspaceMiB = f
		}
	case key == "Selected Device":
		l.Device = val
	case key == "Compute Capability":
		l.ComputeCapability = val
	case key == "TensorRT version":
		if l.Version == nil {
			if v, err := manifest.ParseTRTVersion(val); err == nil {
				l.Version = &v
			}
		}
	case strings.HasPrefix(key, "Input build shape"):
		// 8.x "Input build shape: x:0=1x1x28x28+4x1x28x28+16x1x28x28",
		// 10.x "Input build shape (profile 0): x=...". Names may hold '='
		// only before the last one.
		if i := strings.LastIndexByte(val, '='); i > 0 {
			if l.BuildShapes == nil {
				l.BuildShapes = map[string]string{}
			}
			l.BuildShapes[val[:i]] = val[i+1:]
		}
	case strings.HasPrefix(key, "Input inference shape"):
		if i := strings.LastIndexByte(val, '='); i > 0 {
			if l.InferenceShapes == nil {
				l.InferenceShapes = map[string]string{}
			}
			l.InferenceShapes[val[:i]] = val[i+1:]
		}
	}
}

// parseSummary reads one line of the performance summary; false means the
// line is not part of it.
func (l *Log) parseSummary(text string) bool {
	key, val, ok := strings.Cut(text, ": ")
	if !ok {
		return false
	}
	p := l.Performance
	seconds := func(dst *float64) bool {
		f, err := parseFinite(strings.TrimSuffix(val, " s"), 64)
		if err != nil || !strings.HasSuffix(val, " s") {
			return false
		}
		*dst = f
		return true
	}
	stats := func(dst **Stats) bool {
		s, ok := parseStats(val)
		if ok {
			*dst = s
		}
		return ok
	}
	switch key {
	case "Throughput":
		f, err := parseFinite(strings.TrimSuffix(val, " qps"), 64)
		if err != nil || !strings.HasSuffix(val, " qps") {
			return false
		}
		p.ThroughputQPS = f
		return true
	case "Latency":
		return stats(&p.Latency)
	case "Enqueue Time":
		return stats(&p.Enqueue)
	case "H2D Latency":
		return stats(&p.H2D)
	case "GPU Compute Time":
		return stats(&p.GPUCompute)
	case "D2H Latency":
		return stats(&p.D2H)
	case "Total Host Walltime":
		return seconds(&p.TotalHostWalltimeSec)
	case "Total GPU Compute Time":
		return seconds(&p.TotalGPUComputeSec)
	}
	return false
}

// parseFinite parses a float and refuses NaN and infinities, which have no
// JSON form and are no valid timing.
func parseFinite(s string, bitSize int) (float64, error) {
	f, err := strconv.ParseFloat(s, bitSize)
	if err != nil {
		return 0, err
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a finite number", s)
	}
	return f, nil
}

// parseStats reads "min = 0.04 ms, max = 0.14 ms, mean = ..., median = ...,
// percentile(90%) = ... ms, ...".
func parseStats(val string) (*Stats, bool) {
	s := &Stats{}
	seen := 0
	for _, item := range strings.Split(val, ", ") {
		m := statsRE.FindStringSubmatch(strings.TrimSpace(item))
		if m == nil {
			return nil, false
		}
		f, err := parseFinite(m[3], 64)
		if err != nil {
			return nil, false
		}
		switch m[1] {
		case "min":
			s.Min = f
		case "max":
			s.Max = f
		case "mean":
			s.Mean = f
		case "median":
			s.Median = f
		default:
			pct, err := parseFinite(m[2], 64)
			if err != nil {
				return nil, false
			}
			if s.Percentiles == nil {
				s.Percentiles = Percentiles{}
			}
			s.Percentiles[pct] = f
		}
		seen++
	}
	return s, seen > 0
}
