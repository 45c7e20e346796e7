package kserve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/x448/float16"
)

// affine computes y = 2x + 1 on a float32 input "x", so that every
// answer can be checked; it sleeps delay per call, counts its calls and
// remembers the largest batch it saw.
type affine struct {
	delay    time.Duration
	calls    atomic.Int64
	rows     atomic.Int64
	maxBatch atomic.Int64
	started  chan struct{} // when set, gets a value per call
}

func (a *affine) Run(ctx context.Context, in map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	a.calls.Add(1)
	if a.started != nil {
		a.started <- struct{}{}
	}
	x := in["x"]
	if x == nil {
		return nil, errors.New("no input x")
	}
	if len(x.Dims) > 0 {
		a.rows.Add(x.Dims[0])
		for b := a.maxBatch.Load(); x.Dims[0] > b && !a.maxBatch.CompareAndSwap(b, x.Dims[0]); b = a.maxBatch.Load() {
		}
	}
	if a.delay > 0 {
		select {
		case <-time.After(a.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	xs := x.Data.([]float32)
	ys := make([]float32, len(xs))
	for i, v := range xs {
		ys[i] = 2*v + 1
	}
	return map[string]*onnx.Tensor{"y": {Name: "y", Type: onnx.Float, Dims: slices.Clone(x.Dims), Data: ys}}, nil
}

// affineModel serves an affine runner on x, y of shape [4] (after the
// batch dimension when maxBatch > 0).
func affineModel(name string, r Runner, maxBatch int, delay time.Duration) Model {
	return Model{Name: name, Platform: "kiln_test", MaxBatchSize: maxBatch, MaxQueueDelay: delay, Runner: r,
		Inputs:  []TensorMeta{{Name: "x", Datatype: "FP32", Shape: []int64{4}}},
		Outputs: []TensorMeta{{Name: "y", Datatype: "FP32", Shape: []int64{4}}}}
}

// echo returns each input x as output x_out.
type echo struct{}

func (echo) Run(_ context.Context, in map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	out := map[string]*onnx.Tensor{}
	for n, t := range in {
		c := *t
		c.Name = n + "_out"
		out[c.Name] = &c
	}
	return out, nil
}

// echoTypes are the inputs of the echo model: one per datatype tested.
var echoTypes = []TensorMeta{
	{Name: "f32", Datatype: "FP32", Shape: []int64{-1}},
	{Name: "f16", Datatype: "FP16", Shape: []int64{-1}},
	{Name: "i64", Datatype: "INT64", Shape: []int64{-1}},
	{Name: "b", Datatype: "BOOL", Shape: []int64{-1}},
	{Name: "s", Datatype: "BYTES", Shape: []int64{-1}},
}

func echoModel() Model {
	m := Model{Name: "echo", Version: "3", Runner: echo{}, Inputs: echoTypes}
	for _, t := range echoTypes {
		t.Name += "_out"
		m.Outputs = append(m.Outputs, t)
	}
	return m
}

// failing always fails.
type failing struct{}

func (failing) Run(context.Context, map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	return nil, errors.New("the accelerator caught fire")
}

// echoInputs are tensors of every echo type, values JSON can hold.
func echoInputs() map[string]*onnx.Tensor {
	return map[string]*onnx.Tensor{
		"f32": {Type: onnx.Float, Dims: []int64{3}, Data: []float32{1.5, -2.25, 1e-7}},
		"f16": {Type: onnx.Float16, Dims: []int64{2}, Data: []float16.Float16{float16.Fromfloat32(0.1), float16.Fromfloat32(-65504)}},
		"i64": {Type: onnx.Int64, Dims: []int64{2}, Data: []int64{-9223372036854775808, 9223372036854775807}},
		"b":   {Type: onnx.Bool, Dims: []int64{3}, Data: []bool{true, false, true}},
		"s":   {Type: onnx.String, Dims: []int64{3}, Data: []string{"", "héllo \"quoted\"\n", "\x00\x01"}},
	}
}

// env is a Server on a loopback listener, with its metrics on another.
type env struct {
	srv     *Server
	hs, ms  *httptest.Server
	c       *Client
	metrics *prometheus.Registry
}

func start(t testing.TB, models []Model, opts Options) *env {
	t.Helper()
	reg := prometheus.NewRegistry()
	if opts.Registerer == nil {
		opts.Registerer = reg
	}
	s, err := NewServer(models, opts)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	e := &env{srv: s, hs: httptest.NewServer(s.Handler()), ms: httptest.NewServer(s.MetricsHandler()), metrics: reg}
	e.c = NewClient(e.hs.URL, e.hs.Client())
	t.Cleanup(func() {
		e.hs.Close()
		e.ms.Close()
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// scrape reads the metrics endpoint.
func (e *env) scrape(t testing.TB) map[string]*metricFamily {
	t.Helper()
	resp, err := http.Get(e.ms.URL)
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	out := map[string]*metricFamily{}
	for name, f := range fams {
		mf := &metricFamily{}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetCounter().GetValue()
			if m.Gauge != nil {
				v = m.GetGauge().GetValue()
			}
			mf.samples = append(mf.samples, sample{labels, v})
		}
		out[name] = mf
	}
	return out
}

type sample struct {
	labels map[string]string
	value  float64
}

type metricFamily struct{ samples []sample }

// value returns the sample whose labels include want, or -1.
func (f *metricFamily) value(want map[string]string) float64 {
	if f == nil {
		return -1
	}
	for _, s := range f.samples {
		ok := true
		for k, v := range want {
			ok = ok && s.labels[k] == v
		}
		if ok {
			return s.value
		}
	}
	return -1
}

// sameTensor compares two tensors bit for bit, a nil shape equal to [].
func sameTensor(a, b *onnx.Tensor) error {
	switch {
	case a.Name != b.Name:
		return fmt.Errorf("name %q, want %q", b.Name, a.Name)
	case a.Type != b.Type:
		return fmt.Errorf("tensor %q: type %s, want %s", a.Name, b.Type, a.Type)
	case !slices.Equal(a.Dims, b.Dims):
		return fmt.Errorf("tensor %q: dims %v, want %v", a.Name, b.Dims, a.Dims)
	case checkTensor(a) != nil || checkTensor(b) != nil:
		return fmt.Errorf("tensor %q: %v / %v", a.Name, checkTensor(a), checkTensor(b))
	case !bytes.Equal(encodeBinary(a), encodeBinary(b)):
		return fmt.Errorf("tensor %q: data %v, want %v", a.Name, b.Data, a.Data)
	}
	return nil
}

func floats(n int, f func(i int) float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}
