package calibrate

import "github.com/kiln-ml/kiln/onnx"

// runBudget is the memory the activations of one run may take when Collect
// picks the samples per run: on the order of a last-level cache.
const runBudget = 32 << 20

// runSizer decides how many samples of a batch each ONNX Runtime run of
// Collect takes. Where the model's batch dimension is free (see splittable),
// the first run takes one sample and later ones as many as fit runBudget by
// that run's activations: every activation fetched is fresh memory until the
// sets are reused, and a smaller set is touched sooner and still in cache
// when the histograms read it.
type runSizer struct {
	// split is set when runs may take part of a batch.
	split bool
	// chunk is the most samples a run takes when split.
	chunk int
	// auto is set until the first run has measured chunk.
	auto bool
}

// newRunSizer sizes runs for m as CollectOptions.RunSamples asks: 0 picks
// the size by the first run's activations, -1 runs whole batches, more caps
// the samples per run.
func newRunSizer(m *onnx.Model, runSamples int) runSizer {
	s := runSizer{split: splittable(m) && runSamples >= 0, chunk: 1}
	if runSamples > 0 {
		s.chunk = runSamples
	}
	s.auto = s.split && runSamples == 0
	return s
}

// passes are the passes over a batch: false for the counted runs, preceded
// by true for a scan when the first batch is split into several runs, so
// that it still fixes the bin widths as one batch (see Stats.scan).
func (s runSizer) passes(firstBatch bool, samples int) []bool {
	if firstBatch && s.split && samples > 1 {
		return []bool{true, false}
	}
	return []bool{false}
}

// size is the number of samples of the next run of a batch with left
// samples still to run.
func (s runSizer) size(left int) int {
	if s.split {
		return min(left, s.chunk)
	}
	return left
}

// measured takes the outputs of a run of n samples; the first run fixes the
// samples per run when they are picked by memory.
func (s *runSizer) measured(outs map[string]*onnx.Tensor, n int) {
	if s.auto {
		s.chunk = max(1, runBudget/max(1, outputBytes(outs)/n))
		s.auto = false
	}
}

// splittable tells whether every input of m has a free first dimension, so
// that a batch can run a few samples at a time.
func splittable(m *onnx.Model) bool {
	ins := m.Inputs()
	for _, in := range ins {
		if !in.Shape.Ranked || len(in.Shape.Dims) == 0 || in.Shape.Dims[0].Known {
			return false
		}
	}
	return len(ins) > 0
}

// outputBytes is the memory of a run's outputs.
func outputBytes(outs map[string]*onnx.Tensor) int {
	total := 0
	for _, t := range outs {
		if n, err := onnx.NumElements(t.Dims); err == nil {
			total += n * t.Type.Size()
		}
	}
	return total
}
