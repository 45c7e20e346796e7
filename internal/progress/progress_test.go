package progress

import (
	"errors"
	"testing"
	"time"
)

func TestTaskThrottlesAndFinishes(t *testing.T) {
	var events []Event
	clock := time.Unix(0, 0)
	task := Start(func(e Event) { events = append(events, e) }, "calibrate", 1000, "samples")
	task.now = func() time.Time { return clock }
	for i := 0; i < 1000; i++ {
		task.Add(1)
		clock = clock.Add(time.Millisecond)
	}
	task.Finish(nil)
	var running int
	for _, e := range events {
		if e.State == Running {
			running++
		}
	}
	// 1000 ms of work at one event per 100 ms, plus the event at the total.
	if running < 9 || running > 12 {
		t.Errorf("Running events = %d, want about 10", running)
	}
	last := events[len(events)-1]
	if last.State != Finished || last.Done != 1000 {
		t.Errorf("last event = %+v, want Finished with Done 1000", last)
	}
	if events[0].State != Started {
		t.Errorf("first event = %+v, want Started", events[0])
	}
}

func TestNilReporterAndFailure(t *testing.T) {
	task := Start(nil, "x", 0, "")
	task.Add(5)
	task.Finish(errors.New("boom")) // must not panic with a nil Reporter
	var got Event
	Start(func(e Event) { got = e }, "y", 0, "").Finish(errors.New("boom"))
	if got.State != Failed || got.Msg != "boom" {
		t.Errorf("Finish(err) event = %+v, want Failed boom", got)
	}
}
