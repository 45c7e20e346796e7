package calibrate

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// A run that fetches largeRun or more goes to lean sessions before it runs,
// in collection and validation; a small one stays in ONNX Runtime's
// defaults. LargeActivations(16) fetches 16 branch features of 16 MiB per
// sample and its stem: over 256 MiB with one sample.
func TestLeanLargeRuns(t *testing.T) {
	initORT(t)
	large := &onnx.Model{Proto: testmodels.LargeActivations(16, 1)}
	small := &onnx.Model{Proto: testmodels.ResNetish(8, 1)}
	for _, tc := range []struct {
		name  string
		m     *onnx.Model
		dims  []int64
		input string
		lean  bool
	}{
		{"large", large, []int64{3, testmodels.LargeSize, testmodels.LargeSize}, "image", true},
		{"small", small, []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, "images", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := batchesOfSize(t, memSource{input: tc.input, dims: tc.dims, seed: 1, n: 1}, tc.m.Inputs(), 1)[0]
			c, _, err := newCollector(tc.m, CollectOptions{Scope: ScopeQDQ})
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if err := c.leanIfLarge(b.Tensors); err != nil {
				t.Fatal(err)
			}
			if got := isLean(c.opts.Session); got != tc.lean {
				t.Errorf("collection: lean sessions %v, want %v", got, tc.lean)
			}
			q, err := Quantize(tc.m, fakeRanges(t, tc.m), QuantizeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			e := newEvaluation(tc.m, []*Quantized{q}, fakeRanges(t, tc.m))
			defer e.close()
			if err := e.open(tc.m, ort.SessionOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := e.leanIfLarge(tc.m, b.Tensors); err != nil {
				t.Fatal(err)
			}
			if got := isLean(e.so); got != tc.lean {
				t.Errorf("validation: lean sessions %v, want %v", got, tc.lean)
			}
		})
	}
}

// fakeRanges is a range of 1 for every tensor the Q/DQ scope observes.
func fakeRanges(t *testing.T, m *onnx.Model) Ranges {
	t.Helper()
	names, err := observedIn(m, ScopeQDQ)
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges{Version: RangesVersion, Method: MinMax}
	for _, n := range names {
		r.Tensors = append(r.Tensors, TensorRange{Tensor: n, Method: MinMax, Amax: 1, Scale: 1.0 / 127, Min: -1, Max: 1})
	}
	return r
}

// A large model split into one run per tensor by the memory budget, each
// group a lean session of its own, gives the ranges of unsplit runs.
func TestLeanRangesIdentical(t *testing.T) {
	initORT(t)
	m := &onnx.Model{Proto: testmodels.LargeActivations(16, 2)}
	batches := batchesOfSize(t, memSource{input: "image", dims: []int64{3, testmodels.LargeSize, testmodels.LargeSize}, seed: 3, n: 2}, m.Inputs(), 1)
	ranges := func(budget int64, so ort.SessionOptions) string {
		return collectedRanges(t, m, batches, CollectOptions{MemoryBudget: budget, Scope: ScopeQDQ, Session: so})
	}
	off := ort.SessionOptions{OptLevel: ort.OptDisabled}
	whole := ranges(0, off)
	if got := ranges(1, off); got != whole {
		t.Error("budget 1: ranges differ from unsplit runs")
	}
}
