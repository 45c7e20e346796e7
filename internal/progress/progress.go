// Package progress is how long-running library code reports progress
// without knowing how it is drawn: a Reporter is a plain callback that must
// not block. The cmd package turns events into progress bars on a terminal,
// one line per state change in CI logs, or JSON lines.
package progress

import (
	"sync"
	"time"
)

// State is the phase of a task.
type State string

// States a task goes through.
const (
	Started  State = "started"
	Running  State = "running"
	Finished State = "finished"
	Failed   State = "failed"
	Skipped  State = "skipped"
)

// Event reports the progress of one task.
type Event struct {
	Task  string        // what is being done, e.g. "calibrate tinynet"
	State State         // phase
	Done  int64         // units done so far
	Total int64         // total units, 0 when unknown (a spinner)
	Unit  string        // "samples", "bytes", ...
	Msg   string        // optional detail
	Since time.Duration // time since the task started
}

// Reporter receives events. Implementations must return quickly; a nil
// Reporter is valid and drops everything (see Report).
type Reporter func(Event)

// Report calls r if it is not nil.
func (r Reporter) Report(e Event) {
	if r != nil {
		r(e)
	}
}

// Task tracks one task and emits events for it, throttling Running events
// so that hot loops can call Add freely.
type Task struct {
	mu       sync.Mutex
	r        Reporter
	name     string
	unit     string
	total    int64
	done     int64
	start    time.Time
	last     time.Time
	interval time.Duration
	now      func() time.Time
}

// Start begins a task with a known total (0 for unknown) and reports Started.
func Start(r Reporter, name string, total int64, unit string) *Task {
	t := &Task{r: r, name: name, unit: unit, total: total, interval: 100 * time.Millisecond, now: time.Now}
	t.start = t.now()
	t.emit(Started, "")
	return t
}

// Add records n more units done; a Running event is emitted at most every 100 ms
// and always when the total is reached.
func (t *Task) Add(n int64) {
	t.mu.Lock()
	t.done += n
	now := t.now()
	emit := now.Sub(t.last) >= t.interval || (t.total > 0 && t.done >= t.total)
	if emit {
		t.last = now
	}
	t.mu.Unlock()
	if emit {
		t.emit(Running, "")
	}
}

// Finish reports the end of the task: Finished when err is nil, else Failed.
func (t *Task) Finish(err error) {
	if err != nil {
		t.emit(Failed, err.Error())
		return
	}
	t.emit(Finished, "")
}

func (t *Task) emit(s State, msg string) {
	t.mu.Lock()
	e := Event{Task: t.name, State: s, Done: t.done, Total: t.total, Unit: t.unit, Msg: msg, Since: t.now().Sub(t.start)}
	t.mu.Unlock()
	t.r.Report(e)
}
