package calibrate

import (
	"runtime"
	"sync"
)

// defaultWorkers is the number of histogram workers when
// CollectOptions.Workers is 0: one per two CPUs (GOMAXPROCS), at least
// one. Measured on 2 CPUs with ONNX Runtime on both (BENCHMARKS.md,
// "Calibration threads"), one worker calibrated faster than two: two
// wait for each other at the end of every run, and the one that ONNX
// Runtime's threads keep from running holds up the run.
func defaultWorkers() int { return max(1, runtime.GOMAXPROCS(0)/2) }

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
			// Never unlocked: the thread, whose priority cannot be
			// raised again, exits with the goroutine.
			runtime.LockOSThread()
			lowerPriority()
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
