package calibrate

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kiln-ml/kiln/onnx"
)

// Stats are the activation statistics of a calibration run.
type Stats struct {
	// Tensors are the float32 tensors observed, in graph order.
	Tensors []string
	// Hist holds each tensor's running min/max and histogram of |x|.
	Hist map[string]*Histogram
	// Samples is the number of samples run; Seen counts per tensor the
	// samples in which it was produced.
	Samples int
	Seen    map[string]int
	// IDs are the samples' IDs in the order they ran.
	IDs []string

	// d says which tensors are derived from others, not fetched.
	d derivation
	// free holds the fetched tensors that do not depend on the inputs,
	// fetched with the first run only.
	free map[string]bool
	// scans and begun carry the first batch from its scan to its counted
	// runs (see Stats.scan); scanned counts the samples scanned.
	scans   map[string]*batchScan
	begun   map[string]begun
	scanned int
	// pool runs the histogram workers; nil runs them on goroutines of
	// their own.
	pool *workerPool
}

// run runs f on n workers and waits for them.
func (st *Stats) run(n int, f func()) {
	if st.pool != nil {
		st.pool.run(n, f)
		return
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(f)
	}
	wg.Wait()
}

// keepFloat drops the observed tensors that ONNX Runtime returned with
// another element type than float32. A tensor d derives goes with the
// tensor it is derived from.
func keepFloat(names []string, outs map[string]*onnx.Tensor, d derivation) []string {
	var keep []string
	for _, n := range names {
		if t, ok := outs[d.source(n)]; ok && t.Type == onnx.Float {
			keep = append(keep, n)
		}
	}
	return keep
}

// add adds one run's outputs to the histograms, tensors spread over
// workers (each histogram is touched by one worker only). A run of the first
// batch after its scan is counted into the bins Stats.scan began. A part
// of a run (see fetchGroups) counts its samples with the final part.
func (st *Stats) add(ids []string, outs map[string]*onnx.Tensor, workers int, final bool) error {
	if err := st.addTensors(ids, outs, workers); err != nil {
		return err
	}
	if !final {
		return nil
	}
	st.Samples += len(ids)
	st.IDs = append(st.IDs, ids...)
	if st.Samples == st.scanned {
		st.begun = nil // the first batch is in
	}
	return nil
}

// addTensors adds a run's outputs to the histograms and counts the run's
// samples as seen by each tensor it produced.
func (st *Stats) addTensors(ids []string, outs map[string]*onnx.Tensor, workers int) error {
	var next atomic.Int64
	errs := make([]error, len(st.Tensors))
	st.run(min(workers, len(st.Tensors)), func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(st.Tensors) {
				return
			}
			name := st.Tensors[i]
			t := outs[name]
			if t == nil {
				continue // derived (see finish) or not produced
			}
			v, _ := t.Data.([]float32)
			out, relu := st.d.relu[name]
			if b, ok := st.begun[name]; ok {
				if relu {
					countBoth(st.Hist[name], st.Hist[out], v, b.h, b.r)
				} else if b.h {
					count(st.Hist[name].counts, v, 1/st.Hist[name].width)
				}
				continue
			}
			var err error
			if relu {
				err = addRelu(st.Hist[name], st.Hist[out], v)
			} else {
				err = st.Hist[name].Add(v)
			}
			if err != nil {
				errs[i] = &ActivationError{Tensor: name, Sample: sampleOf(err, v, ids), Err: err}
			}
		}
	})
	for _, e := range errs {
		if e != nil {
			return e // the first in graph order
		}
	}
	for _, name := range st.Tensors {
		if outs[name] != nil {
			st.Seen[name] += len(ids)
			if out, ok := st.d.relu[name]; ok {
				st.Seen[out] += len(ids)
			}
		}
	}
	return nil
}

// scan takes one run of the first batch's scan: it keeps each tensor's
// batchScan and, after the last run, begins the batch in every histogram as
// Add would the whole batch (Histogram.begin), so that the batch's runs are
// then counted into bins that already cover it. Tensors that do not depend
// on the inputs come with the first run only, so they are added whole. A
// part of a run (see fetchGroups) counts its samples with the final part.
func (st *Stats) scan(ids []string, outs map[string]*onnx.Tensor, last, final bool) error {
	if st.scans == nil {
		st.scans = map[string]*batchScan{}
	}
	free := map[string]*onnx.Tensor{}
	for _, name := range st.Tensors {
		t := outs[name]
		if t == nil {
			continue
		}
		if st.free[name] {
			free[name] = t
			continue
		}
		v, _ := t.Data.([]float32)
		s := st.scans[name]
		if s == nil {
			s = &batchScan{}
			st.scans[name] = s
		}
		if err := s.add(v); err != nil {
			// The index counts from the batch's start; name the sample
			// within this run.
			var nf *NonFiniteError
			if errors.As(err, &nf) {
				nf.Index -= s.n
			}
			return &ActivationError{Tensor: name, Sample: sampleOf(err, v, ids), Err: err}
		}
	}
	if len(free) > 0 {
		// The samples themselves count with the batch's counted runs.
		if err := st.addTensors(ids, free, 1); err != nil {
			return err
		}
	}
	if final {
		st.scanned += len(ids)
	}
	if !last {
		return nil
	}
	st.begun = map[string]begun{}
	for name, s := range st.scans {
		if out, ok := st.d.relu[name]; ok {
			h, r := beginRelu(st.Hist[name], st.Hist[out], *s)
			st.begun[name] = begun{h, r}
		} else {
			st.begun[name] = begun{h: st.Hist[name].begin(s.lo, s.hi, s.n)}
		}
	}
	st.scans = nil
	return nil
}

// begun says, for a tensor whose first batch was scanned, whether its runs
// are to be counted (h) and its derived ReLU's (r).
type begun struct{ h, r bool }

// sampleOf names the sample of ids that a NonFiniteError's index into v,
// one run's values, falls in; the samples' range when it cannot tell.
func sampleOf(err error, v []float32, ids []string) string {
	var nf *NonFiniteError
	if errors.As(err, &nf) && len(ids) > 0 && len(v) >= len(ids) {
		if k := nf.Index / (len(v) / len(ids)); k < len(ids) {
			return ids[k]
		}
	}
	return idRange(ids)
}

// finish counts every sample as seen by the tensors fetched with the first
// batch only (see inputFree), and gives each tensor that hands on another's
// values in the same order (see derivation.alias) a copy of that tensor's
// statistics: the same values in the same order make the same histogram,
// min and max.
func (st *Stats) finish() {
	for _, name := range st.Tensors {
		if st.free[st.d.source(name)] && st.Seen[name] > 0 {
			st.Seen[name] = st.Samples // the same values in every run
		}
	}
	for _, name := range st.Tensors {
		root, ok := st.d.alias[name]
		if !ok {
			continue
		}
		h := *st.Hist[root]
		h.counts = slices.Clone(h.counts)
		st.Hist[name] = &h
		st.Seen[name] = st.Seen[root]
	}
}

// dropUnseen removes the histograms of tensors no run produced: an
// observed tensor that is never computed (an unused branch) has no range.
func (st *Stats) dropUnseen() {
	for n := range st.Hist {
		if st.Seen[n] == 0 {
			delete(st.Hist, n)
		}
	}
}

// idRange names the samples of a batch for errors.
func idRange(ids []string) string {
	switch len(ids) {
	case 0:
		return "(none)"
	case 1:
		return ids[0]
	}
	return ids[0] + " .. " + ids[len(ids)-1]
}

// Ranges computes every observed tensor's range with method.
func (st *Stats) Ranges(method Method, opts MethodOptions) (Ranges, error) {
	r := Ranges{Version: RangesVersion, Method: method, Samples: st.Samples}
	// Entropy and MSE scan every candidate cut of every histogram
	// (milliseconds each); the tensors are independent, so every CPU
	// takes some.
	rgs := make([]Range, len(st.Tensors))
	errs := make([]error, len(st.Tensors))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(st.Tensors)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(st.Tensors); i = int(next.Add(1) - 1) {
				if h, ok := st.Hist[st.Tensors[i]]; ok {
					rgs[i], errs[i] = Compute(method, h, opts)
				} else {
					errs[i] = ErrNoValues
				}
			}
		})
	}
	wg.Wait()
	for i, name := range st.Tensors {
		if errors.Is(errs[i], ErrNoValues) {
			continue // not collected, or empty tensors, e.g. a [0,4] box list
		}
		if errs[i] != nil {
			return Ranges{}, fmt.Errorf("tensor %q: %w", name, errs[i])
		}
		r.Tensors = append(r.Tensors, NewTensorRange(name, st.Seen[name], st.Hist[name], rgs[i]))
	}
	if len(r.Tensors) == 0 {
		return Ranges{}, ErrNoFloatTensors
	}
	return r, nil
}
