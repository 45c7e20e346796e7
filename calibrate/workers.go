package calibrate

import (
	"runtime"
	"sync"
)

// idleWorkers runs the histogram workers at the lowest CPU priority (see
// workerPool); tests turn it off to compare.
var idleWorkers = true

// workerPool runs the histogram work of Collect on goroutines of its own,
// each locked to an OS thread that asks the kernel to run it only when a
// CPU has nothing else of this process to run (SCHED_IDLE on Linux, see
// lowerPriority). ONNX Runtime's threads, computing the next run
// meanwhile, then take a CPU from a histogram worker as soon as they wake,
// instead of waiting for its time slice to end while their partners in a
// parallel loop spin on them: the histograms fill the gaps ONNX Runtime
// leaves (its single-threaded operators, its threads between parallel
// sections) rather than compete with it. The threads end with the pool.
type workerPool struct {
	work chan func()
}

// newWorkerPool starts n workers.
func newWorkerPool(n int) *workerPool {
	p := &workerPool{work: make(chan func())}
	for range n {
		go func() {
			if idleWorkers {
				// Never unlocked: the thread, whose priority cannot
				// be raised again, exits with the goroutine.
				runtime.LockOSThread()
				lowerPriority()
			}
			for f := range p.work {
				f()
			}
		}()
	}
	return p
}

// run runs f on n workers at once and waits for all of them.
func (p *workerPool) run(n int, f func()) {
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		p.work <- func() {
			defer wg.Done()
			f()
		}
	}
	wg.Wait()
}

// close stops the workers.
func (p *workerPool) close() { close(p.work) }
