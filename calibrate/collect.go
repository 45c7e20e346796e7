package calibrate

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// ErrNoFloatTensors is returned for a model that has no float32 tensor to
// calibrate (no float32 graph input and no float32 node output).
var ErrNoFloatTensors = errors.New("the model has no float32 tensors to calibrate")

// ActivationError is a value calibration cannot use: a NaN or infinite
// activation of one tensor for one sample.
type ActivationError struct {
	Tensor string
	Sample string // the sample's ID
	Err    error  // a *NonFiniteError
}

func (e *ActivationError) Error() string {
	return fmt.Sprintf("sample %s: tensor %q: %v", e.Sample, e.Tensor, e.Err)
}

// Unwrap returns the underlying error.
func (e *ActivationError) Unwrap() error { return e.Err }

// CollectOptions configure Collect.
type CollectOptions struct {
	// Session configures ONNX Runtime.
	Session ort.SessionOptions
	// Scope says which tensors are observed: "" and ScopeAll every tensor
	// Observed lists, ScopeQDQ those the Q/DQ model quantizes.
	Scope Scope
	// Progress is called with the number of samples after each batch's
	// statistics are in (it must not block); nil ignores progress.
	Progress func(samples int)
	// RunSamples caps the samples of one ONNX Runtime run for models with
	// a free batch dimension: 0 picks it by the memory one sample's
	// activations take (see runBudget), -1 runs whole batches.
	RunSamples int
	// MemoryBudget caps, in bytes, the activations one run fetches: when
	// one sample's observed tensors take more, they are split into groups
	// that each fit, run one after the other (see fetchGroups). 0 means
	// no cap. The statistics are the same either way.
	MemoryBudget int64
	// Workers adding to histograms; 0 means one per two CPUs, at least
	// one (see defaultWorkers). They share the CPUs with ONNX Runtime's
	// threads, which run the next batch meanwhile, at the lowest priority
	// (see workerPool): they run on the CPU time ONNX Runtime's threads
	// leave, which sleep rather than spin while they wait (see
	// openAugmented).
	Workers int
}

// Collect runs batches through the model with every observed tensor (see
// Observed, and CollectOptions.Scope) as an extra output and keeps, per tensor, the running min/max and
// a histogram of |x|; the first batch fixes the bin widths. Tensors whose
// statistics follow exactly from another tensor's values (a ReLU output, a
// reshaped copy; see derive) are not fetched but derived, and tensors that
// do not depend on the inputs (see inputFree) are fetched with the first
// run only. Where the model's batch dimension is free, a batch runs a few
// samples at a time (see CollectOptions.RunSamples; the statistics are the
// same; a split first batch runs twice, first for its range). Work is
// pipelined: reading a batch, running ONNX Runtime and adding to the
// histograms overlap, and the activations of at most two runs are alive at a
// time (one for runs over largeRun), in memory that is reused from run to
// run, so memory does not grow with the number of samples; the first run
// writes into Go memory too (ort.SessionOptions.InferOutputShapes). A run
// over CollectOptions.MemoryBudget is split into groups of tensors. A NaN or infinite activation stops the run
// with an *ActivationError.
func Collect(ctx context.Context, m *onnx.Model, batches iter.Seq2[*dataset.Batch, error], opts CollectOptions) (*Stats, error) {
	c, st, err := newCollector(m, opts)
	if err != nil {
		return nil, err
	}
	defer c.close()
	parent := ctx
	ctx, c.cancel = context.WithCancelCause(ctx)
	defer c.cancel(nil)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // decoding images overlaps with inference
		defer wg.Done()
		c.readBatches(ctx, batches)
	}()
	go func() {
		defer wg.Done()
		c.runBatches(ctx)
	}()
	c.addRuns(st)
	c.cancel(nil) // stop the pipeline if the loop broke early
	for range c.ran {
	}
	wg.Wait()
	if err := pipelineErr(parent, ctx); err != nil {
		return nil, err
	}
	if st.Samples == 0 {
		return nil, dataset.ErrNoSamples
	}
	st.finish()
	st.dropUnseen()
	return st, nil
}

// collector holds what the three stages of Collect's pipeline share, connected
// by channels: reading batches and running ONNX Runtime, each on a goroutine
// of its own, and adding to the histograms on Collect's.
type collector struct {
	m    *onnx.Model
	opts CollectOptions
	// names are the observed tensors; fetch those the first run fetches
	// and rest those of later runs (fetch without the input-free tensors).
	names, fetch, rest []string
	// sess runs fetch until the first run is done, then rest; only the
	// ONNX Runtime stage touches it, and switched says it has switched.
	sess      *ort.Session
	switched  bool
	sizer     runSizer
	firstDone bool // the first run is done
	// parts, after the switch, are the sessions of the fetch groups when
	// the memory budget splits a run (see fetchGroups); nil when it does
	// not. perSample is each tensor's memory per sample in the first run.
	parts     []*ort.Session
	groups    [][]string
	perSample map[string]int
	// serial is set when one run's activations are large (see largeRun):
	// ONNX Runtime then waits for the histograms to hand back each set,
	// in spare, before it runs the next.
	serial bool
	spare  map[string]*onnx.Tensor
	// cancel stops every stage, with the first error as its cause.
	cancel context.CancelCauseFunc

	read chan *dataset.Batch
	// ran is unbuffered: ONNX Runtime runs one run ahead of the
	// histograms, so two sets of activations are alive at a time.
	ran chan runResult
	// spent takes back the activations the histograms are done with, for
	// ONNX Runtime to write the next batch into (ort.Session.RunReuse): no
	// new memory per batch, and no third set since a set is only made when
	// none is spare.
	spent chan map[string]*onnx.Tensor
}

// runResult is one run's samples and activations. When the first batch is
// split into several runs, they run twice: a scan (min and max only, see
// Stats.scan), after whose last run the histograms begin the batch as one,
// and then the runs that are counted. The first batch thus fixes the bin
// widths as a whole batch does, with no more than two runs' activations in
// memory.
type runResult struct {
	ids        []string
	outs       map[string]*onnx.Tensor
	scan, last bool
	// final is false for a part of a run that more parts follow.
	final bool
}

// newCollector decides what to fetch and opens the first run's session
// before anything runs, so that a model ONNX Runtime cannot load fails
// before the dataset is read. Tensors derived from others (see derive) are
// not fetched, and tensors that do not depend on the inputs (see
// inputFree) are fetched with the first run only: later runs use a second
// session without them.
func newCollector(m *onnx.Model, opts CollectOptions) (*collector, *Stats, error) {
	names, err := observedIn(m, opts.Scope)
	if err != nil {
		return nil, nil, err
	}
	d := derive(m, names)
	fetch := d.fetched(names)
	free := map[string]bool{}
	if fetchFreeOnce {
		free = inputFree(m, fetch)
	}
	var rest []string
	for _, n := range fetch {
		if !free[n] {
			rest = append(rest, n)
		}
	}
	sess, err := openAugmented(m, fetch, opts.Session)
	if err != nil {
		return nil, nil, err
	}
	st := &Stats{Hist: map[string]*Histogram{}, Seen: map[string]int{}, d: d, free: free}
	for _, n := range names {
		st.Hist[n] = NewHistogram()
	}
	c := &collector{
		m: m, opts: opts, names: names, fetch: fetch, rest: rest, sess: sess,
		sizer: newRunSizer(m, opts.RunSamples),
		read:  make(chan *dataset.Batch, 1),
		ran:   make(chan runResult),
		spent: make(chan map[string]*onnx.Tensor, 2),
	}
	return c, st, nil
}

// close closes the session in use; it is nil when opening the second
// session failed.
func (c *collector) close() {
	if c.sess != nil {
		c.sess.Close()
	}
	for _, s := range c.parts {
		s.Close()
	}
}

// readBatches is the first stage: it reads batches ahead of ONNX Runtime,
// so that decoding overlaps with inference.
func (c *collector) readBatches(ctx context.Context, batches iter.Seq2[*dataset.Batch, error]) {
	defer close(c.read)
	for b, err := range batches {
		if err != nil {
			c.cancel(err)
			return
		}
		select {
		case c.read <- b:
		case <-ctx.Done():
			return
		}
	}
}

// runBatches is the second stage: it runs every batch read through ONNX
// Runtime, run by run, and hands the activations to the histograms.
func (c *collector) runBatches(ctx context.Context) {
	defer close(c.ran)
	firstBatch := true
	for b := range c.read {
		if !c.runBatch(ctx, b, firstBatch) {
			return
		}
		firstBatch = false
	}
}

// runBatch runs one batch in runs of the sizes c.sizer picks, twice for a
// split first batch (see runSizer.passes), and reports whether the
// pipeline goes on. The counted runs repeat the scan's runs exactly: a
// tensor that is not one slice per sample (a mean over the batch) must show
// the same values in both. A run split into parts by the memory budget
// (see fetchGroups) hands on each part's tensors as they come.
func (c *collector) runBatch(ctx context.Context, b *dataset.Batch, firstBatch bool) bool {
	var sizes []int
	for _, scan := range c.sizer.passes(firstBatch, len(b.IDs)) {
		for run, off := 0, 0; off < len(b.IDs); run++ {
			n := c.sizer.size(len(b.IDs) - off)
			if !scan && len(sizes) > 0 {
				n = sizes[run]
			}
			for part := 0; ; part++ {
				sub, outs, more, err := c.run(ctx, b, off, n, part)
				if err != nil {
					c.cancel(err)
					return false
				}
				end := off + len(sub.IDs)
				r := runResult{ids: sub.IDs, outs: outs, scan: scan, last: end == len(b.IDs) && !more, final: !more}
				if !c.send(ctx, r) {
					return false
				}
				if !more {
					off = end
					if scan {
						sizes = append(sizes, len(sub.IDs))
					}
					break
				}
			}
		}
	}
	return true
}

// send hands a run to the histograms. Runs of large sets (see largeRun)
// then wait for the set to come back, so that one set is alive at a time.
func (c *collector) send(ctx context.Context, r runResult) bool {
	select {
	case c.ran <- r:
	case <-ctx.Done():
		return false
	}
	if !c.serial {
		return true
	}
	select {
	case c.spare = <-c.spent:
		return true
	case <-ctx.Done():
		return false
	}
}

// run runs samples [off, off+n) of b, fetching the tensors of the given
// part (see fetchGroups), into a set of activations the histograms handed
// back when one is spare; more says parts of the run are left. A batch
// whose tensors are not stacked by sample runs whole. After the first run,
// which fetched everything and the input-free tensors, it switches to the
// sessions without them.
func (c *collector) run(ctx context.Context, b *dataset.Batch, off, n, part int) (sub *dataset.Batch, outs map[string]*onnx.Tensor, more bool, err error) {
	if c.firstDone && !c.switched {
		if err := c.switchSessions(); err != nil {
			return nil, nil, false, err
		}
	}
	old := c.spare
	c.spare = nil
	if old == nil {
		select {
		case old = <-c.spent:
		default:
		}
	}
	if sub = b.Slice(off, off+n); sub == nil { // not stacked by sample: run it whole
		sub, n = b, len(b.IDs)
	}
	if !c.firstDone {
		if err := c.leanIfLarge(sub.Tensors); err != nil {
			return nil, nil, false, err
		}
	}
	sess, want := c.sess, []string(nil)
	if c.parts != nil {
		// Every part computes the graph outputs; each tensor counts
		// with its own group only.
		sess, want = c.parts[part], c.groups[part]
	}
	if outs, err = sess.RunReuse(ctx, sub.Tensors, want, old); err != nil {
		return nil, nil, false, fmt.Errorf("batch of samples %s: %w", idRange(sub.IDs), err)
	}
	if !c.firstDone {
		c.sizer.measured(outs, n)
		c.serial = outputBytes(outs) >= largeRun
		c.perSample = tensorBytes(outs, n)
		c.firstDone = true
	}
	return sub, outs, c.parts != nil && part < len(c.parts)-1, nil
}

// addRuns is the last stage, on Collect's goroutine: it adds every run to
// the histograms (tensors spread over opts.Workers) and hands the
// activations back for reuse. The first run decides which observed tensors
// are float32 (see keepFloat).
func (c *collector) addRuns(st *Stats) {
	workers := c.opts.Workers
	if workers <= 0 {
		workers = defaultWorkers()
	}
	st.pool = newWorkerPool(workers)
	defer func() {
		st.pool.close()
		st.pool = nil
	}()
	first := true
	for r := range c.ran {
		if first {
			st.Tensors = keepFloat(c.names, r.outs, st.d)
			if len(st.Tensors) == 0 {
				c.cancel(ErrNoFloatTensors)
				return
			}
			first = false
		}
		var err error
		switch {
		case r.scan:
			err = st.scan(r.ids, r.outs, r.last, r.final)
		default:
			err = st.add(r.ids, r.outs, workers, r.final)
		}
		if err != nil {
			c.cancel(err)
			return
		}
		select {
		case c.spent <- r.outs:
		default:
		}
		if !r.scan && r.final && c.opts.Progress != nil {
			c.opts.Progress(len(r.ids))
		}
	}
}

// pipelineErr is the error that stopped Collect's pipeline, if any: the
// caller's cancellation first, then the first error of any stage (a stage
// cancels with its error as the cause; the plain cancel that stops the
// other stages is none).
func pipelineErr(parent, ctx context.Context) error {
	if err := parent.Err(); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
