package cmd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/progress"
)

func TestPlainProgress(t *testing.T) {
	var b bytes.Buffer
	r, done := newProgress(&b, progressAuto) // a buffer is not a terminal: plain lines
	r(progress.Event{Task: "calibrate m", State: progress.Started, Total: 200, Unit: "samples"})
	for d := int64(1); d <= 200; d += 3 {
		r(progress.Event{Task: "calibrate m", State: progress.Running, Done: d, Total: 200, Unit: "samples", Since: time.Second})
	}
	r(progress.Event{Task: "calibrate m", State: progress.Finished, Done: 200, Total: 200, Unit: "samples", Since: 2 * time.Second})
	r(progress.Event{Task: "validate m", State: progress.Failed, Msg: "boom", Since: time.Millisecond})
	done()
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []string{
		"calibrate m: started (0/200 samples)",
		"calibrate m: 22/200 samples (11%) 1s",
	}
	if len(lines) != 12 || lines[0] != want[0] || lines[1] != want[1] {
		t.Fatalf("plain progress = %d lines %q, want 12 lines starting %q", len(lines), lines, want)
	}
	if got := lines[10]; got != "calibrate m: finished, 200/200 samples in 2s" {
		t.Errorf("finish line = %q", got)
	}
	if got := lines[11]; got != "validate m: failed after 1ms: boom" {
		t.Errorf("failure line = %q", got)
	}
}

func TestJSONProgress(t *testing.T) {
	var b bytes.Buffer
	r, _ := newProgress(&b, progressJSON)
	r(progress.Event{Task: "t", State: progress.Running, Done: 5, Total: 10, Unit: "samples", Since: 1500 * time.Millisecond})
	var e jsonEvent
	if err := json.Unmarshal(b.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	if want := (jsonEvent{Task: "t", State: "running", Done: 5, Total: 10, Unit: "samples", Seconds: 1.5}); e != want {
		t.Errorf("json progress = %+v, want %+v", e, want)
	}
}

func TestBarProgress(t *testing.T) {
	var b bytes.Buffer
	r, done := newProgress(&b, progressBar)
	r(progress.Event{Task: "calibrate m", State: progress.Started, Total: 4, Unit: "samples"})
	r(progress.Event{Task: "calibrate m", State: progress.Finished, Done: 4, Total: 4, Unit: "samples"})
	r(progress.Event{Task: "spin", State: progress.Started})
	done()
	if !strings.Contains(b.String(), "calibrate m") || !strings.Contains(b.String(), "4/4") {
		t.Errorf("bar output = %q, want the task and 4/4", b.String())
	}
	if r, _ := newProgress(&b, progressNone); r != nil {
		t.Errorf("newProgress(none) = a reporter, want nil")
	}
}
