package check

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/kiln-ml/kiln/onnx"
)

// RunError says that a model did not run on a feed: the artifact failed to
// produce outputs, which is a failed check, not a tool failure.
type RunError struct {
	Samples []string
	Err     error
}

func (e *RunError) Error() string {
	return fmt.Sprintf("running on %s: %v", sampleRange(e.Samples), e.Err)
}

// Unwrap returns the runtime's error.
func (e *RunError) Unwrap() error { return e.Err }

// Reference holds the reference model's outputs on a set of feeds, so that
// every candidate is compared with one run of the reference.
type Reference struct {
	Feeds   []Feed
	Outputs []string
	// Peaks are the outputs to read as KindPeaks (PeakOutputs of the
	// reference model); callers set it before Compare.
	Peaks   map[string]Peak
	results []map[string]*onnx.Tensor
}

// RunReference runs ref on every feed and keeps the named outputs (every
// output ref returns when outputs is nil).
func RunReference(ctx context.Context, ref Runner, feeds []Feed, outputs []string) (*Reference, error) {
	r := &Reference{Feeds: feeds, Outputs: outputs}
	for _, f := range feeds {
		res, err := ref.Run(ctx, f.Tensors)
		if err != nil {
			return nil, &RunError{Samples: f.IDs, Err: err}
		}
		if r.Outputs == nil {
			r.Outputs = slices.Sorted(maps.Keys(res))
		}
		for _, o := range r.Outputs {
			if res[o] == nil {
				return nil, fmt.Errorf("the reference gave no output %q", o)
			}
		}
		r.results = append(r.results, res)
	}
	return r, nil
}

// Result is the comparison of one candidate with the reference.
type Result struct {
	Samples    int                   `json:"samples"`
	Outputs    []Metrics             `json:"outputs"`
	Thresholds map[string]Thresholds `json:"thresholds"`
	Failures   []Failure             `json:"failures,omitempty"`
}

// Passed reports whether every output met its thresholds.
func (r *Result) Passed() bool { return len(r.Failures) == 0 }

// Compare runs cand on the reference's feeds and compares every output
// the reference kept, judging output o against thresholds(o). A feed cand
// cannot run on is a *RunError; an output cand does not give, or gives
// with another shape or type, is an error naming it.
func (r *Reference) Compare(ctx context.Context, cand Runner, thresholds func(output string) Thresholds) (*Result, error) {
	res := &Result{Thresholds: map[string]Thresholds{}}
	accs := make([]*Accumulator, len(r.Outputs))
	for i, f := range r.Feeds {
		got, err := cand.Run(ctx, f.Tensors)
		if err != nil {
			return nil, &RunError{Samples: f.IDs, Err: err}
		}
		for j, o := range r.Outputs {
			want := r.results[i][o]
			if got[o] == nil {
				return nil, fmt.Errorf("output %q: the model gave no such output", o)
			}
			// An output whose first dimension is not the feed's samples
			// (recurrent state [2,N,128] of a model batched on its other
			// inputs) is one sample of the feed as a whole.
			batched, ids := f.Batched, f.IDs
			if batched && (len(want.Dims) == 0 || want.Dims[0] != int64(len(f.IDs))) {
				batched, ids = false, []string{sampleRange(f.IDs)}
			}
			if accs[j] == nil {
				th := thresholds(o)
				res.Thresholds[o] = th
				accs[j] = OutputAccumulator(o, want.Dims, batched, f.Tensors, r.Peaks, th)
			}
			if err := accs[j].Add(want, got[o], ids, batched); err != nil {
				return nil, err
			}
		}
		res.Samples += len(f.IDs)
	}
	for j, a := range accs {
		if a == nil {
			continue
		}
		m := a.Metrics()
		res.Outputs = append(res.Outputs, m)
		res.Failures = append(res.Failures, Judge(m, res.Thresholds[r.Outputs[j]])...)
	}
	return res, nil
}

// OutputAccumulator starts the comparison of output o of a run on inputs,
// read as its shape says (KindOf; an output shaped like one of the inputs
// is recurrent state, KindOther) or, when peaks names it, as a peak map.
func OutputAccumulator(o string, dims []int64, batched bool, inputs map[string]*onnx.Tensor, peaks map[string]Peak, th Thresholds) *Accumulator {
	if p, ok := peaks[o]; ok {
		return NewPeakAccumulator(o, p, th)
	}
	kind := KindOf(dims, batched)
	if isState(dims, inputs) {
		kind = KindOther
	}
	return NewAccumulator(o, kind, th)
}

// isState reports whether an output has the shape of one of the inputs
// of rank 2 or more: recurrent state fed back (Silero's state -> stateN,
// an LSTM's h/c), whose values are not a map to take the argmax or a mask
// of; the elementwise metrics and cosine judge it.
func isState(dims []int64, inputs map[string]*onnx.Tensor) bool {
	if len(dims) < 2 {
		return false
	}
	for _, t := range inputs {
		if slices.Equal(t.Dims, dims) {
			return true
		}
	}
	return false
}

// sampleRange names the samples of a feed for messages.
func sampleRange(ids []string) string {
	switch len(ids) {
	case 0:
		return "no samples"
	case 1:
		return "sample " + ids[0]
	}
	return fmt.Sprintf("samples %s..%s", ids[0], ids[len(ids)-1])
}
