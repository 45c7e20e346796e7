package kserve

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/onnx"
)

// inferAll sends n concurrent requests of batch rows each, request i
// holding values i*100+k, and checks that each caller gets its own 2x+1.
func inferAll(t *testing.T, c *Client, model string, n, rows int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{int64(rows), 4}, Data: floats(rows*4, func(k int) float32 { return float32(i*100 + k) })}
			got, err := c.Infer(context.Background(), model, "", map[string]*onnx.Tensor{"x": x}, nil, i%2 == 0)
			if err != nil {
				errs <- fmt.Errorf("request %d: %w", i, err)
				return
			}
			want := &onnx.Tensor{Name: "y", Type: onnx.Float, Dims: []int64{int64(rows), 4}, Data: floats(rows*4, func(k int) float32 { return 2*float32(i*100+k) + 1 })}
			if err := sameTensor(want, got["y"]); err != nil {
				errs <- fmt.Errorf("request %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestDynamicBatching(t *testing.T) {
	r := &affine{delay: 20 * time.Millisecond}
	m := affineModel("batched", r, 8, 100*time.Millisecond)
	e := start(t, []Model{m}, Options{})
	const n = 24
	inferAll(t, e.c, "batched", n, 1)
	mf := e.scrape(t)
	l := map[string]string{"model": "batched", "version": "1"}
	requests, inferences := mf["nv_inference_request_success"].value(l), mf["nv_inference_count"].value(l)
	execs := mf["nv_inference_exec_count"].value(l)
	t.Logf("%v requests, %v inferences, %v executions, largest batch %d", requests, inferences, execs, r.maxBatch.Load())
	if requests != n || inferences != n {
		t.Errorf("nv_inference_request_success = %v, nv_inference_count = %v, want %d", requests, inferences, n)
	}
	if execs >= n || execs < n/8 || float64(r.calls.Load()) != execs {
		t.Errorf("nv_inference_exec_count = %v (runner calls %d), want fewer than %d requests and at least %d", execs, r.calls.Load(), n, n/8)
	}
	if r.maxBatch.Load() < 2 || r.maxBatch.Load() > 8 {
		t.Errorf("largest batch %d, want 2 to 8", r.maxBatch.Load())
	}
}

// Requests of several rows fill a batch to MaxBatchSize and no further;
// a full batch goes without waiting for the queue delay.
func TestBatchingFillsToMax(t *testing.T) {
	r := &affine{}
	e := start(t, []Model{affineModel("batched", r, 8, 2*time.Second)}, Options{})
	begin := time.Now()
	inferAll(t, e.c, "batched", 4, 4)
	if d := time.Since(begin); d > time.Second {
		t.Errorf("4 requests of 4 rows took %s: full batches of 8 should not wait for the 2s delay", d)
	}
	if r.maxBatch.Load() != 8 || r.calls.Load() != 2 {
		t.Errorf("%d runs, largest batch %d, want 2 runs of 8", r.calls.Load(), r.maxBatch.Load())
	}
}

// Requests whose shapes differ after the batch dimension never share a batch.
func TestBatchingKeepsShapesApart(t *testing.T) {
	r := &affine{}
	m := affineModel("dyn", r, 8, 50*time.Millisecond)
	m.Inputs[0].Shape, m.Outputs[0].Shape = []int64{-1}, []int64{-1}
	e := start(t, []Model{m}, Options{})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			width := 2 + i%2
			x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, int64(width)}, Data: floats(width, func(k int) float32 { return float32(k) })}
			got, err := e.c.Infer(context.Background(), "dyn", "", map[string]*onnx.Tensor{"x": x}, nil, false)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			if ys := got["y"].Data.([]float32); !slices.Equal(got["y"].Dims, []int64{1, int64(width)}) || ys[width-1] != float32(2*(width-1)+1) {
				t.Errorf("request %d: y = %v %v", i, got["y"].Dims, ys)
			}
		}()
	}
	wg.Wait()
	if r.calls.Load() < 2 {
		t.Errorf("%d runs for two shapes", r.calls.Load())
	}
}

// A batch whose runner fails fails every request in it, and the batcher
// goes on; preferred sizes with no delay dispatch at once.
func TestBatchingFailure(t *testing.T) {
	m := affineModel("broken", failing{}, 4, 0)
	m.PreferredBatchSizes = []int{2, 4}
	e := start(t, []Model{m}, Options{})
	for range 2 {
		x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, 4}, Data: make([]float32, 4)}
		if _, err := e.c.Infer(context.Background(), "broken", "", map[string]*onnx.Tensor{"x": x}, nil, false); err == nil {
			t.Error("Infer on a failing runner succeeded")
		}
	}
	l := map[string]string{"model": "broken", "version": "1", "reason": "BACKEND"}
	if v := e.scrape(t)["nv_inference_request_failure"].value(l); v != 2 {
		t.Errorf("nv_inference_request_failure{reason=BACKEND} = %v, want 2", v)
	}
}

func TestMetrics(t *testing.T) {
	r := &affine{delay: 2 * time.Millisecond}
	e := start(t, []Model{affineModel("affine", r, 4, 0), affineModel("broken", failing{}, 0, 0)}, Options{})
	ctx := context.Background()
	for i := range 3 {
		x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{int64(i + 1), 4}, Data: make([]float32, 4*(i+1))}
		if _, err := e.c.Infer(ctx, "affine", "1", map[string]*onnx.Tensor{"x": x}, nil, false); err != nil {
			t.Fatal(err)
		}
	}
	bad := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, 3}, Data: make([]float32, 3)}
	_, _ = e.c.Infer(ctx, "affine", "", map[string]*onnx.Tensor{"x": bad}, nil, false)
	_, _ = e.c.Infer(ctx, "broken", "", map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{4}, Data: make([]float32, 4)}}, nil, false)
	mf := e.scrape(t)
	affine := map[string]string{"model": "affine", "version": "1"}
	exact := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"nv_inference_request_success", affine, 3},
		{"nv_inference_count", affine, 1 + 2 + 3},
		{"nv_inference_exec_count", affine, 3},
		{"nv_inference_request_failure", map[string]string{"model": "affine", "version": "1", "reason": "OTHER"}, 1},
		{"nv_inference_request_failure", map[string]string{"model": "affine", "version": "1", "reason": "BACKEND"}, 0},
		{"nv_inference_request_failure", map[string]string{"model": "affine", "version": "1", "reason": "REJECTED"}, 0},
		{"nv_inference_request_failure", map[string]string{"model": "affine", "version": "1", "reason": "CANCELED"}, 0},
		{"nv_inference_request_failure", map[string]string{"model": "broken", "version": "1", "reason": "BACKEND"}, 1},
		{"nv_inference_request_success", map[string]string{"model": "broken", "version": "1"}, 0},
		{"nv_inference_pending_request_count", affine, 0},
	}
	for _, x := range exact {
		if got := mf[x.name].value(x.labels); got != x.want {
			t.Errorf("%s%v = %v, want %v", x.name, x.labels, got, x.want)
		}
	}
	// Three runs of at least 2ms each: the counters are in microseconds.
	for _, name := range []string{"nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"} {
		if got := mf[name].value(affine); got < 6000 || got > 30e6 {
			t.Errorf("%s = %v, want at least 6000 (µs)", name, got)
		}
	}
	if got := mf["nv_inference_queue_duration_us"].value(affine); got < 0 {
		t.Errorf("nv_inference_queue_duration_us missing")
	}
}
