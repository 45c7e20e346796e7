package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/kiln-ml/kiln/internal/progress"
)

// isTerminal reports whether w is a terminal (stderr of an interactive run).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newProgress returns a reporter that draws events on w in the given mode,
// and a function that ends any bar still drawn. The reporter is safe for
// concurrent use and never blocks on anything but writing to w.
func newProgress(w io.Writer, mode string) (progress.Reporter, func()) {
	if mode == progressAuto {
		mode = progressPlain
		if isTerminal(w) {
			mode = progressBar
		}
	}
	var mu sync.Mutex
	switch mode {
	case progressNone:
		return nil, func() {}
	case progressJSON:
		enc := json.NewEncoder(w)
		return func(e progress.Event) {
			mu.Lock()
			defer mu.Unlock()
			enc.Encode(jsonEvent{Task: e.Task, State: string(e.State), Done: e.Done, Total: e.Total, Unit: e.Unit, Msg: e.Msg, Seconds: e.Since.Seconds()})
		}, func() {}
	case progressBar:
		bars := map[string]*progressbar.ProgressBar{}
		return func(e progress.Event) {
				mu.Lock()
				defer mu.Unlock()
				b := bars[e.Task]
				if b == nil {
					b = newBar(w, e)
					bars[e.Task] = b
				}
				switch e.State {
				case progress.Running, progress.Started:
					b.Set64(e.Done)
				case progress.Finished:
					b.Set64(e.Done)
					b.Finish()
					fmt.Fprintln(w)
					delete(bars, e.Task)
				case progress.Failed, progress.Skipped:
					b.Exit()
					fmt.Fprintf(w, "\n%s: %s %s\n", e.Task, e.State, e.Msg)
					delete(bars, e.Task)
				}
			}, func() {
				mu.Lock()
				defer mu.Unlock()
				for name, b := range bars {
					b.Exit()
					delete(bars, name)
				}
			}
	}
	last := map[string]int64{} // tenth of the total last printed
	return func(e progress.Event) {
		mu.Lock()
		defer mu.Unlock()
		if line, ok := plainLine(e, last); ok {
			fmt.Fprintln(w, line)
		}
	}, func() {}
}

type jsonEvent struct {
	Task    string  `json:"task"`
	State   string  `json:"state"`
	Done    int64   `json:"done"`
	Total   int64   `json:"total,omitempty"`
	Unit    string  `json:"unit,omitempty"`
	Msg     string  `json:"msg,omitempty"`
	Seconds float64 `json:"seconds"`
}

func newBar(w io.Writer, e progress.Event) *progressbar.ProgressBar {
	total := e.Total
	if total <= 0 {
		total = -1 // a spinner with elapsed time
	}
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(e.Task),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString(e.Unit),
		progressbar.OptionShowIts(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetWidth(30),
	)
}

// plainLine renders an event as one log line: every state change, and a
// Running event only when it crosses the next tenth of the total (never
// for an unknown total). last remembers the tenth printed per task.
func plainLine(e progress.Event, last map[string]int64) (string, bool) {
	count := fmt.Sprintf("%d", e.Done)
	if e.Total > 0 {
		count = fmt.Sprintf("%d/%d", e.Done, e.Total)
	}
	if e.Unit != "" {
		count += " " + e.Unit
	}
	took := e.Since.Round(time.Millisecond)
	switch e.State {
	case progress.Started:
		last[e.Task] = 0
		return fmt.Sprintf("%s: started (%s)", e.Task, count), true
	case progress.Running:
		if e.Total <= 0 {
			return "", false
		}
		tenth := e.Done * 10 / e.Total
		if tenth <= last[e.Task] || tenth >= 10 {
			return "", false
		}
		last[e.Task] = tenth
		return fmt.Sprintf("%s: %s (%d%%) %s", e.Task, count, e.Done*100/e.Total, took), true
	case progress.Finished:
		delete(last, e.Task)
		return fmt.Sprintf("%s: finished, %s in %s", e.Task, count, took), true
	case progress.Failed:
		delete(last, e.Task)
		return fmt.Sprintf("%s: failed after %s: %s", e.Task, took, e.Msg), true
	}
	delete(last, e.Task)
	return fmt.Sprintf("%s: %s %s", e.Task, e.State, e.Msg), true
}
