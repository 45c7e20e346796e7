package calibrate

import (
	"sync/atomic"
	"testing"
)

func TestWorkerPoolRunsConcurrently(t *testing.T) {
	p := newWorkerPool(3)
	defer p.close()
	for round := range 4 { // the workers outlive a run
		var started, calls atomic.Int64
		release := make(chan struct{})
		done := make(chan struct{})
		go func() {
			p.run(3, func() {
				// All three are in f at once: none returns before
				// the last has started.
				if started.Add(1) == 3 {
					close(release)
				}
				<-release
				calls.Add(1)
			})
			close(done)
		}()
		<-done
		if got := calls.Load(); got != 3 {
			t.Fatalf("round %d: f ran %d times, want 3", round, got)
		}
	}
}
