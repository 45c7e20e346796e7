package ort

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/kiln-ml/kiln/onnx"
)

// SmokeReport is the result of running a model on synthetic inputs.
type SmokeReport struct {
	Provider   Provider       `json:"provider"`
	ORTVersion string         `json:"onnxruntime_version"`
	Batch      int            `json:"batch"`
	Iterations int            `json:"iterations"`
	Outputs    []OutputReport `json:"outputs"`
	// Latency of one Run in milliseconds, over Iterations runs after one warm-up.
	LatencyMeanMS float64 `json:"latency_mean_ms"`
	LatencyP50MS  float64 `json:"latency_p50_ms"`
	LatencyMaxMS  float64 `json:"latency_max_ms"`
}

// OutputReport describes one output of a smoke run.
type OutputReport struct {
	Name   string  `json:"name"`
	Type   string  `json:"type"`
	Shape  []int64 `json:"shape"`
	Finite bool    `json:"finite"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
}

// Smoke opens the model, feeds it inputs (SyntheticInputs of batch when
// inputs is nil; else what inputs builds from the session's inputs, so a
// caller can feed real tensors by name) and times iterations runs. It
// proves the model loads and runs in this ONNX Runtime and reports what
// comes out; it says nothing about accuracy. Errors do not repeat the
// path: the caller knows which model it ran.
func Smoke(ctx context.Context, path string, opts SessionOptions, batch, iterations int, inputs func([]IOInfo) (map[string]*onnx.Tensor, error)) (*SmokeReport, error) {
	if iterations < 1 {
		iterations = 1
	}
	s, err := NewSession(path, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if inputs == nil {
		inputs = func(infos []IOInfo) (map[string]*onnx.Tensor, error) { return SyntheticInputs(infos, batch, 1) }
	}
	in, err := inputs(s.Inputs())
	if err != nil {
		return nil, fmt.Errorf("preparing inputs: %w", err)
	}
	rep := &SmokeReport{Provider: opts.Provider.orDefault(), ORTVersion: Version(), Batch: batch, Iterations: iterations}
	outs, err := s.Run(ctx, in, nil) // warm-up, and the outputs we report
	if err != nil {
		return nil, err
	}
	for _, info := range s.Outputs() {
		t, ok := outs[info.Name]
		if !ok {
			continue
		}
		o := OutputReport{Name: info.Name, Type: t.Type.String(), Shape: t.Dims, Finite: true}
		if vals, err := t.Float64s(); err == nil && len(vals) > 0 {
			o.Min, o.Max = math.Inf(1), math.Inf(-1)
			var sum float64
			for _, v := range vals {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					o.Finite = false
					continue
				}
				o.Min, o.Max = math.Min(o.Min, v), math.Max(o.Max, v)
				sum += v
			}
			o.Mean = sum / float64(len(vals))
			if !o.Finite || math.IsInf(o.Min, 0) {
				o.Min, o.Max, o.Mean = 0, 0, 0
			}
		}
		rep.Outputs = append(rep.Outputs, o)
	}
	lat := make([]float64, 0, iterations)
	for i := 0; i < iterations; i++ {
		start := time.Now()
		if _, err := s.Run(ctx, in, nil); err != nil {
			return nil, err
		}
		lat = append(lat, float64(time.Since(start).Microseconds())/1000)
	}
	sort.Float64s(lat)
	var sum float64
	for _, v := range lat {
		sum += v
	}
	rep.LatencyMeanMS = sum / float64(len(lat))
	rep.LatencyP50MS = lat[len(lat)/2]
	rep.LatencyMaxMS = lat[len(lat)-1]
	return rep, nil
}
