package kserve

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/onnx"
)

// scheduler runs requests on a model's Runner: one at a time per instance
// (direct) or stacked into batches (batcher).
type scheduler interface {
	// submit runs one request of batch size batch (1 for models that do
	// not batch) and returns its outputs.
	submit(ctx context.Context, inputs map[string]*onnx.Tensor, batch int) (map[string]*onnx.Tensor, error)
	// drain runs what is queued, refuses new requests and waits for the
	// runs under way.
	drain()
}

// errShuttingDown is returned for requests that arrive after Shutdown.
var errShuttingDown = errors.New("server is shutting down")

// runError is a failure of the Runner, as opposed to one of the request.
type runError struct{ err error }

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

// runSafe calls the runner, turning a panic into an error: a runner is
// code the server does not control, and one bad request must not take it down.
func runSafe(ctx context.Context, r Runner, inputs map[string]*onnx.Tensor) (outs map[string]*onnx.Tensor, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &runError{fmt.Errorf("runner panicked: %v", p)}
		}
	}()
	outs, err = r.Run(ctx, inputs)
	if err != nil {
		return nil, &runError{err}
	}
	return outs, nil
}

// direct runs each request alone, at most len(slots) at a time.
type direct struct {
	runner Runner
	slots  chan struct{}
	mm     *modelMetrics
}

func (d *direct) submit(ctx context.Context, inputs map[string]*onnx.Tensor, batch int) (map[string]*onnx.Tensor, error) {
	start := time.Now()
	d.mm.pending.Inc()
	defer d.mm.pending.Dec()
	select {
	case d.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-d.slots }()
	run := time.Now()
	addUS(d.mm.queueUS, run.Sub(start))
	outs, err := runSafe(ctx, d.runner, inputs)
	addUS(d.mm.inferUS, time.Since(run))
	if err != nil {
		return nil, err
	}
	d.mm.execs.Inc()
	d.mm.inferences.Add(float64(batch))
	return outs, nil
}

// drain has nothing to do: direct requests run in their handlers, which
// the Server waits for.
func (d *direct) drain() {}

// job is one request waiting in a batcher's queue.
type job struct {
	ctx    context.Context
	inputs map[string]*onnx.Tensor
	batch  int
	key    string
	queued time.Time
	done   chan result
}

type result struct {
	outs map[string]*onnx.Tensor
	err  error
}

// batcher is Triton's dynamic batcher: requests whose inputs have the
// same shapes but for the batch dimension are stacked along it, up to
// max, and run once. A batch goes when it is full (or reaches the largest
// preferred size), or when its oldest request has waited delay, and only
// when an instance is free, so batches grow while the runner is busy.
type batcher struct {
	runner    Runner
	max       int
	preferred int
	delay     time.Duration
	mm        *modelMetrics
	base      context.Context
	slots     chan struct{}

	mu     sync.Mutex
	queue  []*job
	closed bool
	wake   chan struct{}

	running sync.WaitGroup
	stopped chan struct{}
}

func newBatcher(base context.Context, m *Model, mm *modelMetrics) *batcher {
	b := &batcher{runner: m.Runner, max: m.MaxBatchSize, delay: m.MaxQueueDelay, mm: mm, base: base,
		slots: make(chan struct{}, max(m.Instances, 1)), wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	if len(m.PreferredBatchSizes) > 0 {
		b.preferred = slices.Max(m.PreferredBatchSizes)
	}
	go b.loop()
	return b
}

func (b *batcher) submit(ctx context.Context, inputs map[string]*onnx.Tensor, batch int) (map[string]*onnx.Tensor, error) {
	j := &job{ctx: ctx, inputs: inputs, batch: batch, key: shapeKey(inputs), queued: time.Now(), done: make(chan result, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errShuttingDown
	}
	b.queue = append(b.queue, j)
	b.mu.Unlock()
	b.mm.pending.Inc()
	defer b.mm.pending.Dec()
	b.signal()
	select {
	case r := <-j.done:
		return r.outs, r.err
	case <-ctx.Done():
		// The dispatcher drops the job when it gets to it.
		return nil, ctx.Err()
	}
}

func (b *batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *batcher) drain() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.signal()
	<-b.stopped
}

// loop takes a free instance, then the next batch, and runs it.
func (b *batcher) loop() {
	defer close(b.stopped)
	for {
		b.slots <- struct{}{}
		jobs := b.next()
		if jobs == nil {
			break
		}
		b.running.Add(1)
		go func() {
			defer b.running.Done()
			defer func() { <-b.slots }()
			b.execute(jobs)
		}()
	}
	b.running.Wait()
}

// next waits for a batch to be due and takes it from the queue; it
// returns nil once the batcher is closed and the queue is empty.
func (b *batcher) next() []*job {
	for {
		b.mu.Lock()
		b.dropCanceled()
		if len(b.queue) == 0 {
			closed := b.closed
			b.mu.Unlock()
			if closed {
				return nil
			}
			<-b.wake
			continue
		}
		picked, size := b.pick()
		wait := time.Until(b.queue[0].queued.Add(b.delay))
		if size >= b.max || (b.preferred > 0 && size >= b.preferred) || wait <= 0 || b.closed {
			jobs := b.take(picked)
			b.mu.Unlock()
			return jobs
		}
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-b.wake:
		}
		t.Stop()
	}
}

// dropCanceled answers and removes the queued jobs whose callers gave up.
func (b *batcher) dropCanceled() {
	b.queue = slices.DeleteFunc(b.queue, func(j *job) bool {
		if err := j.ctx.Err(); err != nil {
			j.done <- result{err: err}
			return true
		}
		return false
	})
}

// pick chooses, oldest first, the queued jobs that stack with the oldest
// one and fit in a batch.
func (b *batcher) pick() ([]int, int) {
	first := b.queue[0]
	picked, size := []int{0}, first.batch
	for i := 1; i < len(b.queue) && size < b.max; i++ {
		if j := b.queue[i]; j.key == first.key && size+j.batch <= b.max {
			picked = append(picked, i)
			size += j.batch
		}
	}
	return picked, size
}

func (b *batcher) take(picked []int) []*job {
	jobs := make([]*job, len(picked))
	for k, i := range picked {
		jobs[k] = b.queue[i]
		b.queue[i] = nil
	}
	b.queue = slices.DeleteFunc(b.queue, func(j *job) bool { return j == nil })
	return jobs
}

// execute runs one batch and answers each of its jobs.
func (b *batcher) execute(jobs []*job) {
	start := time.Now()
	for _, j := range jobs {
		addUS(b.mm.queueUS, start.Sub(j.queued))
	}
	fail := func(err error) {
		for _, j := range jobs {
			j.done <- result{err: err}
		}
	}
	inputs, total := jobs[0].inputs, jobs[0].batch
	ctx := jobs[0].ctx
	if len(jobs) > 1 {
		// A batch serves several callers: none of them may cancel it.
		ctx = b.base
		var err error
		if inputs, total, err = stack(jobs); err != nil {
			fail(err)
			return
		}
	}
	run := time.Now()
	outs, err := runSafe(ctx, b.runner, inputs)
	done := time.Now()
	if err != nil {
		fail(err)
		return
	}
	b.mm.execs.Inc()
	parts, err := split(outs, jobs, total)
	if err != nil {
		fail(err)
		return
	}
	end := time.Now()
	for i, j := range jobs {
		addUS(b.mm.inputUS, run.Sub(start))
		addUS(b.mm.inferUS, done.Sub(run))
		addUS(b.mm.outputUS, end.Sub(done))
		b.mm.inferences.Add(float64(j.batch))
		j.done <- result{outs: parts[i]}
	}
}

// shapeKey says which requests can share a batch: the same inputs with the
// same element types and the same dimensions after the first.
func shapeKey(inputs map[string]*onnx.Tensor) string {
	names := make([]string, 0, len(inputs))
	for n := range inputs {
		names = append(names, n)
	}
	slices.Sort(names)
	var sb strings.Builder
	for _, n := range names {
		t := inputs[n]
		fmt.Fprintf(&sb, "%s:%d%v;", n, t.Type, t.Dims[1:])
	}
	return sb.String()
}

// stack concatenates the jobs' inputs along the batch dimension.
func stack(jobs []*job) (map[string]*onnx.Tensor, int, error) {
	total := 0
	for _, j := range jobs {
		total += j.batch
	}
	out := make(map[string]*onnx.Tensor, len(jobs[0].inputs))
	for name, first := range jobs[0].inputs {
		typ := reflect.TypeOf(first.Data)
		n := 0
		for _, j := range jobs {
			n += j.inputs[name].Len()
		}
		data := reflect.MakeSlice(typ, 0, n)
		for _, j := range jobs {
			t := j.inputs[name]
			if reflect.TypeOf(t.Data) != typ {
				return nil, 0, fmt.Errorf("input %q holds %T and %T in one batch", name, first.Data, t.Data)
			}
			data = reflect.AppendSlice(data, reflect.ValueOf(t.Data))
		}
		dims := append([]int64{int64(total)}, first.Dims[1:]...)
		out[name] = &onnx.Tensor{Name: name, Type: first.Type, Dims: dims, Data: data.Interface()}
	}
	return out, total, nil
}

// split cuts the outputs of a batch of total back into each job's rows.
func split(outs map[string]*onnx.Tensor, jobs []*job, total int) ([]map[string]*onnx.Tensor, error) {
	parts := make([]map[string]*onnx.Tensor, len(jobs))
	for i := range parts {
		parts[i] = make(map[string]*onnx.Tensor, len(outs))
	}
	for name, t := range outs {
		if t == nil {
			return nil, &runError{fmt.Errorf("runner returned a nil tensor for output %q", name)}
		}
		if len(jobs) == 1 {
			parts[0][name] = t
			continue
		}
		v := reflect.ValueOf(t.Data)
		if v.Kind() != reflect.Slice {
			return nil, &runError{fmt.Errorf("runner returned output %q holding %T, not a slice", name, t.Data)}
		}
		if len(t.Dims) == 0 || t.Dims[0] != int64(total) || t.Len()%total != 0 {
			return nil, &runError{fmt.Errorf("runner returned output %q with shape %v and %d elements for a batch of %d", name, t.Dims, t.Len(), total)}
		}
		row := t.Len() / total
		off := 0
		for i, j := range jobs {
			lo, hi := off*row, (off+j.batch)*row
			dims := append([]int64{int64(j.batch)}, t.Dims[1:]...)
			parts[i][name] = &onnx.Tensor{Name: name, Type: t.Type, Dims: dims, Data: v.Slice3(lo, hi, hi).Interface()}
			off += j.batch
		}
	}
	return parts, nil
}
