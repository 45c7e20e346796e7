package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// WriteJSON writes r as indented JSON, fields in the order of the Go types
// and map keys sorted, so the same report always gives the same bytes. JSON
// has no NaN or Inf: a non-finite float is an error (check's metrics are
// always finite; it counts non-finite outputs instead).
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Reasons and paths hold '<' and '&'; the file is not HTML.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encoding report of %s: %w", r.Subject, err)
	}
	return nil
}

// ReadJSON reads a report that WriteJSON wrote. It is strict: an unknown
// field, a schema_version other than SchemaVersion, an unknown verdict or
// data kind, or anything after the report is an error.
func ReadJSON(r io.Reader) (*Report, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var rep Report
	if err := dec.Decode(&rep); err != nil {
		return nil, fmt.Errorf("decoding report: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("decoding report: data after the report object")
	}
	if err := rep.validate(); err != nil {
		return nil, fmt.Errorf("decoding report: %w", err)
	}
	return &rep, nil
}

func (r *Report) validate() error {
	if r.SchemaVersion != SchemaVersion {
		return fmt.Errorf("schema_version %d, want %d", r.SchemaVersion, SchemaVersion)
	}
	switch r.Data.Kind {
	case KindDataset, KindValidationSplit, KindInputs, KindRandom:
	default:
		return fmt.Errorf("data.kind %q, want dataset, validation-split, inputs or random", r.Data.Kind)
	}
	if !r.Verdict.Valid() {
		return fmt.Errorf("verdict %q, want pass, fail, not-checked, not-judged or error", r.Verdict)
	}
	for i, m := range r.Models {
		if !m.Verdict.Valid() {
			return fmt.Errorf("models[%d] (%s): verdict %q, want pass, fail, not-checked, not-judged or error", i, m.Name, m.Verdict)
		}
	}
	return nil
}

// perfJSON is Perf as JSON holds it: the window in whole milliseconds, the
// unit perf_analyzer's --measurement-interval uses.
type perfJSON struct {
	Warmup              int          `json:"warmup_requests"`
	MeasurementWindowMS int64        `json:"measurement_window_ms"`
	Overhead            LoopOverhead `json:"overhead"`
	Points              []PerfPoint  `json:"points"`
}

// MarshalJSON writes the measurement window in whole milliseconds.
func (p Perf) MarshalJSON() ([]byte, error) {
	return json.Marshal(perfJSON{
		Warmup:              p.Warmup,
		MeasurementWindowMS: p.MeasurementWindow.Milliseconds(),
		Overhead:            p.Overhead,
		Points:              p.Points,
	})
}

// UnmarshalJSON reads the measurement window in whole milliseconds, and
// rejects unknown fields as ReadJSON does for the rest of the report.
func (p *Perf) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j perfJSON
	if err := dec.Decode(&j); err != nil {
		return err
	}
	const maxMS = math.MaxInt64 / int64(time.Millisecond)
	if j.MeasurementWindowMS < 0 || j.MeasurementWindowMS > maxMS {
		return fmt.Errorf("perf.measurement_window_ms %d out of range [0, %d]", j.MeasurementWindowMS, maxMS)
	}
	*p = Perf{
		Warmup:            j.Warmup,
		MeasurementWindow: time.Duration(j.MeasurementWindowMS) * time.Millisecond,
		Overhead:          j.Overhead,
		Points:            j.Points,
	}
	return nil
}
