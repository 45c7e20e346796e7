package check

import (
	"encoding/json"
	"fmt"
	"time"
)

// Verdict is the outcome of checking one artifact.
type Verdict string

// Verdicts. Only VerdictPass lets an artifact ship.
const (
	VerdictPass       Verdict = "pass"
	VerdictFail       Verdict = "fail"        // missed a threshold
	VerdictError      Verdict = "error"       // did not load or run
	VerdictNotChecked Verdict = "not-checked" // its runtime is missing here (needs GPU/TensorRT)
	VerdictNotJudged  Verdict = "not-judged"  // ran, but the data cannot judge it (int8 on random data)
)

// Record is what kiln.json keeps of a model's latest check (manifest.Model
// Checks), written by convert when it builds a variant and by serve when it
// checks a repository: enough for pack to refuse a model whose last
// verdict failed, and for a reader to see why without the report.
type Record struct {
	Verdict Verdict   `json:"verdict"`
	Reason  string    `json:"reason,omitempty"`
	By      string    `json:"by"` // "convert" or "serve"
	Checked time.Time `json:"checked"`
	Data    Data      `json:"data"`
	Device  string    `json:"device,omitempty"`
	// Worst is the failure with the largest miss, if any.
	Worst   *Failure  `json:"worst,omitempty"`
	Outputs []Metrics `json:"outputs,omitempty"`
	// LatencyP50US is the median latency at concurrency 1 and the smallest
	// batch, when serve timed the model.
	LatencyP50US float64 `json:"latency_p50_us,omitempty"`
}

// ReadRecord decodes a kiln.json check record; nil when there is none.
func ReadRecord(raw json.RawMessage) (*Record, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var rec Record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("reading a check record: %w", err)
	}
	return &rec, nil
}

// String says what was missed: `output "probs": cosine 0.9812 < 0.99 (worst sample cat.jpg)`.
func (f Failure) String() string {
	op := "<"
	switch f.Metric {
	case "tolerance", "norm_deviation", "nan", "inf":
		op = ">"
	}
	s := fmt.Sprintf("output %q: %s %.6g %s %.6g", f.Output, f.Metric, f.Value, op, f.Threshold)
	if f.Sample != "" {
		s += " (worst sample " + f.Sample + ")"
	}
	return s
}
