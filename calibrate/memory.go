package calibrate

import (
	"context"
	"fmt"
	"iter"
	"slices"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// A run that fetches large activations (largeRun or more, as ONNX Runtime
// infers their shapes before the first run) runs in lean sessions: without
// ONNX Runtime's NCHWc layout and without its CPU memory arena. At OptAll
// the NCHWc transformer rewrites float32 Convs into a blocked layout, so
// that every fetched Conv output a later Conv reads is alive twice during
// the run, the blocked tensor the next node reads and the copy ONNX Runtime
// writes into the output kiln pre-allocated: for a model whose activations
// plain inference mostly holds at once (a U-Net's skips) that doubled the
// peak. Without the transformer ONNX Runtime writes such tensors straight
// into kiln's outputs. The arena keeps the largest run's intermediate
// tensors for the life of each session, one arena per session (fetch
// groups, validation's models); without it they are freed run by run.
// Below largeRun, where memory does not matter, sessions are ONNX Runtime's
// defaults, which run faster: the statistics of small models are those of
// plain inference at OptAll, bit for bit. Either layout computes the same
// convolution, to float32 rounding: a model over largeRun sees activations
// that differ from the default sessions' in the last bits, which can move
// an entropy range by a histogram bin.

// leanOptions are so for a large run: no NCHWc layout, no CPU arena.
func leanOptions(so ort.SessionOptions) ort.SessionOptions {
	so.NoCPUArena = true
	if !slices.Contains(so.DisabledOptimizers, ort.NoNCHWc) {
		so.DisabledOptimizers = append(slices.Clip(so.DisabledOptimizers), ort.NoNCHWc)
	}
	return so
}

// isLean tells whether so are leanOptions already.
func isLean(so ort.SessionOptions) bool {
	return so.NoCPUArena && slices.Contains(so.DisabledOptimizers, ort.NoNCHWc)
}

// largeFetch tells whether a run of sess over inputs fetches at least
// largeRun bytes, by the shapes ONNX Runtime inferred (ort.Session.
// OutputBytes), before it runs.
func largeFetch(sess *ort.Session, inputs map[string]*onnx.Tensor) bool {
	return sess.OutputBytes(inputs) >= largeRun
}

// leanIfLarge is called before the first run, over the first run's inputs:
// when that run is large (see largeFetch) it reopens the first session with
// leanOptions, which every later session of the collector (the one without
// the input-free tensors, the fetch groups) then uses too, so that one
// calibration runs in one kind of session throughout.
func (c *collector) leanIfLarge(inputs map[string]*onnx.Tensor) error {
	if isLean(c.opts.Session) || !largeFetch(c.sess, inputs) {
		return nil
	}
	c.opts.Session = leanOptions(c.opts.Session)
	c.sess.Close()
	var err error
	c.sess, err = openAugmented(c.m, c.fetch, c.opts.Session)
	return err
}

// leanIfLarge is the collector's leanIfLarge for an evaluation: when the
// fp32 model's run over the first batch is large, every model's session is
// reopened with leanOptions.
func (e *evaluation) leanIfLarge(ref *onnx.Model, inputs map[string]*onnx.Tensor) error {
	if isLean(e.so) || !largeFetch(e.refSess, inputs) {
		return nil
	}
	e.close()
	e.refSess = nil
	for _, p := range e.plans {
		p.sess = nil
	}
	return e.open(ref, leanOptions(e.so))
}

// check runs every Q/DQ model as it is, its graph outputs only, on the
// first calibration batch: no comparison, nothing fetched, so that it costs
// what plain inference of the Q/DQ model does.
func (rn *runner) check(ctx context.Context, j *job, models []*Quantized) error {
	order := j.calib[:min(len(j.calib), j.batch)]
	task := progress.Start(rn.progress, "check "+j.name, int64(len(order)), "samples")
	err := runModels(ctx, models, counted(dataset.Batches(ctx, j.src, order, j.bopts), task), j.cfg.Session)
	task.Finish(err)
	return err
}

// runModels runs each of models on each of batches (check runs one), and
// keeps nothing: the check that they load and run in ONNX Runtime. One
// session is open at a time.
func runModels(ctx context.Context, models []*Quantized, batches iter.Seq2[*dataset.Batch, error], so ort.SessionOptions) error {
	for b, err := range batches {
		if err != nil {
			return err
		}
		for _, q := range models {
			if err := runModel(ctx, q.Model, b, so); err != nil {
				return err
			}
		}
	}
	return nil
}

// runModel opens a session on m, runs b through it and closes it.
func runModel(ctx context.Context, m *onnx.Model, b *dataset.Batch, so ort.SessionOptions) error {
	data, err := m.Marshal()
	if err != nil {
		return err
	}
	s, err := ort.NewSessionFromBytes(data, so)
	if err != nil {
		return fmt.Errorf("opening the Q/DQ model: %w", err)
	}
	defer s.Close()
	if _, err := s.Run(ctx, b.Tensors, nil); err != nil {
		return fmt.Errorf("running the Q/DQ model on samples %s: %w", idRange(b.IDs), err)
	}
	return nil
}
