package serve

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/serve/report"
)

// Trtexec runs TensorRT plans with NVIDIA's trtexec: correctness by
// --loadEngine with --loadInputs and --exportOutput, one run per feed, and
// timing from trtexec's own performance summary (its GPU-side measurement,
// which a loop of trtexec processes could not give).
type Trtexec struct {
	Tool *trtexec.Tool
	// Device is the CUDA device (--device).
	Device int
	// Duration is the timing run's --duration (default 3s, trtexec's).
	Duration time.Duration
}

// Open checks that the plan exists; trtexec loads it on every run.
func (t Trtexec) Open(_ context.Context, a Artifact) (Session, error) {
	if _, err := os.Stat(a.Path); err != nil {
		return nil, &LoadError{Artifact: a.Name, Err: err}
	}
	outs := map[string]onnx.DataType{}
	for _, o := range a.Outputs {
		outs[o.Name] = o.Type
	}
	if len(outs) == 0 {
		return nil, &LoadError{Artifact: a.Name, Err: fmt.Errorf("kiln.json records no outputs for the plan, so trtexec's exported values cannot be typed")}
	}
	return &trtexecSession{t: t, a: a, outputs: outs}, nil
}

// trtexecSession is a plan run by trtexec.
type trtexecSession struct {
	t       Trtexec
	a       Artifact
	outputs map[string]onnx.DataType
}

// Run runs the engine once on in and returns its exported outputs.
func (s *trtexecSession) Run(ctx context.Context, in map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	zero := time.Duration(0)
	res, err := s.t.Tool.Infer(ctx, trtexec.InferSpec{Engine: s.a.Path, Inputs: in, Shapes: shapesOf(in),
		Outputs: s.outputs, Duration: &zero, Iterations: 1, WarmUp: &zero, Device: s.t.Device})
	if err != nil {
		return nil, err
	}
	return res.Outputs, nil
}

// time runs trtexec's own timing on in and converts its summary into one
// point at concurrency 1 (trtexec runs one stream by default).
func (s *trtexecSession) time(ctx context.Context, in map[string]*onnx.Tensor, batch int) (*report.Perf, error) {
	d := s.t.Duration
	if d == 0 {
		d = 3 * time.Second
	}
	res, err := s.t.Tool.Infer(ctx, trtexec.InferSpec{Engine: s.a.Path, Inputs: in, Shapes: shapesOf(in), Duration: &d, Device: s.t.Device})
	if err != nil {
		return nil, err
	}
	p := res.Perf
	if p == nil || p.Latency == nil {
		return nil, fmt.Errorf("trtexec printed no performance summary for %s", s.a.Name)
	}
	ms := func(v float64) float64 { return v * 1e3 }
	l := p.Latency
	pt := report.PerfPoint{Concurrency: 1, Batch: batch, Requests: int(p.ThroughputQPS * p.TotalHostWalltimeSec),
		ThroughputInferPerSec: p.ThroughputQPS * float64(batch), LatencyAvgUS: ms(l.Mean), LatencyP50US: ms(l.Median),
		LatencyP90US: ms(l.Percentiles[90]), LatencyP95US: ms(l.Percentiles[95]), LatencyP99US: ms(l.Percentiles[99]),
		LatencyMinUS: ms(l.Min), LatencyMaxUS: ms(l.Max)}
	return &report.Perf{MeasurementWindow: d, Points: []report.PerfPoint{pt}}, nil
}

func (s *trtexecSession) Close() error { return nil }

// shapesOf gives every input's shape for --shapes.
func shapesOf(in map[string]*onnx.Tensor) map[string][]int64 {
	out := make(map[string][]int64, len(in))
	for name, t := range in {
		out[name] = slices.Clone(t.Dims)
	}
	return out
}
