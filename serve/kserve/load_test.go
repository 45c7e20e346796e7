package kserve

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/prometheus/client_golang/prometheus"
)

// loadDuration is 20s, 2s with -short, or KILN_LOAD_DURATION.
func loadDuration(t *testing.T) time.Duration {
	if v := os.Getenv("KILN_LOAD_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KILN_LOAD_DURATION=%q: %v", v, err)
		}
		return d
	}
	if testing.Short() {
		return 2 * time.Second
	}
	return 20 * time.Second
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// stableGoroutines waits for the goroutine count to hold still (what
// earlier tests left winding down) and returns it.
func stableGoroutines() int {
	n, same := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(2 * time.Second); same < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
	return n
}

// settle waits for the goroutine count to come down to at most want.
func settle(want int) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); n > want && time.Now().Before(deadline); n = runtime.NumGoroutine() {
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// TestLoad runs 8 clients against a batching model and a plain one for
// a while: no request may fail, the heap must not grow from the first half
// to the second, and every goroutine must be gone once the server closes.
func TestLoad(t *testing.T) {
	dur := loadDuration(t)
	baseGoroutines := stableGoroutines()
	m := affineModel("batched", &affine{}, 8, time.Millisecond)
	m.Instances = 2
	s, err := NewServer([]Model{m, affineModel("plain", &affine{}, 8, 0)}, Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	c := NewClient(hs.URL, &http.Client{Transport: tr})
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := []string{"batched", "plain"}[w%2]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := loadOne(c, model, w, i); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	begin := time.Now()
	time.Sleep(dur / 2)
	heap1 := heapAfterGC()
	time.Sleep(dur / 2)
	heap2 := heapAfterGC()
	close(stop)
	wg.Wait()
	elapsed := time.Since(begin)
	peak := runtime.NumGoroutine()
	hs.Close()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	tr.CloseIdleConnections()
	after := settle(baseGoroutines + 2)
	n := ok.Load() + failed.Load()
	t.Logf("%d requests in %s (%.0f req/s), %d failed; goroutines %d before, %d under load, %d after; heap %.1f MiB at half time, %.1f MiB at the end",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), failed.Load(), baseGoroutines, peak, after,
		float64(heap1)/(1<<20), float64(heap2)/(1<<20))
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed, the first: %v", failed.Load(), n, firstErr.Load())
	}
	if after > baseGoroutines+2 {
		t.Errorf("%d goroutines after closing, %d before: a leak", after, baseGoroutines)
	}
	if heap2 > 2*heap1+16<<20 {
		t.Errorf("heap grew from %d to %d bytes between the halves", heap1, heap2)
	}
}

// loadOne sends one request of 1 to 3 rows, JSON or binary, and checks it.
func loadOne(c *Client, model string, w, i int) error {
	rows := 1 + (w+i)%3
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{int64(rows), 4}, Data: floats(rows*4, func(k int) float32 { return float32(w*1000 + k) })}
	got, err := c.Infer(context.Background(), model, "", map[string]*onnx.Tensor{"x": x}, nil, i%2 == 0)
	if err != nil {
		return err
	}
	want := &onnx.Tensor{Name: "y", Type: onnx.Float, Dims: x.Dims, Data: floats(rows*4, func(k int) float32 { return 2*float32(w*1000+k) + 1 })}
	return sameTensor(want, got["y"])
}

// Shutdown lets requests under way (running and queued in a batcher)
// finish, answers new ones 503 and turns readiness off.
func TestShutdownDrains(t *testing.T) {
	r := &affine{delay: 300 * time.Millisecond, started: make(chan struct{}, 16)}
	m := affineModel("slow", r, 2, 50*time.Millisecond)
	e := start(t, []Model{m}, Options{})
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, 4}, Data: floats(4, func(k int) float32 { return float32(i + k) })}
			_, err := e.c.Infer(context.Background(), "slow", "", map[string]*onnx.Tensor{"x": x}, nil, false)
			errs <- err
		}()
	}
	<-r.started // one batch is running; wait for the others to be queued
	pending := map[string]string{"model": "slow", "version": "1"}
	for deadline := time.Now().Add(5 * time.Second); e.scrape(t)["nv_inference_pending_request_count"].value(pending) < n; {
		if time.Now().After(deadline) {
			t.Fatal("the requests never all reached the server")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.srv.Shutdown(ctx) }()
	time.Sleep(20 * time.Millisecond)
	if ready, err := e.c.Ready(context.Background()); ready || err != nil {
		t.Errorf("Ready() during shutdown = %v, %v, want false", ready, err)
	}
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, 4}, Data: make([]float32, 4)}
	_, err := e.c.Infer(context.Background(), "slow", "", map[string]*onnx.Tensor{"x": x}, nil, false)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable {
		t.Errorf("Infer during shutdown = %v, want 503", err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("a request under way at shutdown: %v", err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// A Shutdown whose deadline passes cancels the runs still going.
func TestShutdownDeadline(t *testing.T) {
	r := &affine{delay: time.Hour, started: make(chan struct{}, 1)}
	e := start(t, []Model{affineModel("stuck", r, 0, 0)}, Options{})
	errc := make(chan error, 1)
	go func() {
		x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{4}, Data: make([]float32, 4)}
		_, err := e.c.Infer(context.Background(), "stuck", "", map[string]*onnx.Tensor{"x": x}, nil, false)
		errc <- err
	}()
	<-r.started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want the deadline", err)
	}
	if err := <-errc; err == nil {
		t.Error("the stuck request succeeded")
	}
}

// Beyond MaxConcurrency requests wait up to RequestTimeout, then get 503.
func TestConcurrencyLimit(t *testing.T) {
	r := &affine{delay: 400 * time.Millisecond, started: make(chan struct{}, 4)}
	e := start(t, []Model{affineModel("slow", r, 0, 0)}, Options{MaxConcurrency: 1, RequestTimeout: 100 * time.Millisecond})
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{4}, Data: make([]float32, 4)}
	first := make(chan error, 1)
	go func() {
		_, err := e.c.Infer(context.Background(), "slow", "", map[string]*onnx.Tensor{"x": x}, nil, false)
		first <- err
	}()
	<-r.started
	_, err := e.c.Infer(context.Background(), "slow", "", map[string]*onnx.Tensor{"x": x}, nil, false)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable {
		t.Errorf("a second request = %v, want 503 busy", err)
	}
	if err := <-first; err == nil || !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable {
		t.Errorf("a request running past RequestTimeout = %v, want 503", err)
	}
	l := map[string]string{"model": "slow", "version": "1", "reason": "REJECTED"}
	if v := e.scrape(t)["nv_inference_request_failure"].value(l); v != 2 {
		t.Errorf("nv_inference_request_failure{reason=REJECTED} = %v, want 2", v)
	}
}

// A model on another server, through ModelRunner, serves like a local one.
func TestModelRunner(t *testing.T) {
	backend := start(t, []Model{affineModel("affine", &affine{}, 8, 0)}, Options{})
	m := affineModel("proxied", ModelRunner(backend.c, "affine", "1"), 8, 0)
	front := start(t, []Model{m}, Options{})
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{2, 4}, Data: floats(8, func(i int) float32 { return float32(i) })}
	got, err := front.c.Infer(context.Background(), "proxied", "", map[string]*onnx.Tensor{"x": x}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	want := &onnx.Tensor{Name: "y", Type: onnx.Float, Dims: []int64{2, 4}, Data: floats(8, func(i int) float32 { return 2*float32(i) + 1 })}
	if err := sameTensor(want, got["y"]); err != nil {
		t.Error(err)
	}
	_, err = ModelRunner(backend.c, "missing", "").Run(context.Background(), map[string]*onnx.Tensor{"x": x})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound || he.URL != "/v2/models/missing/infer" {
		t.Errorf("Run on a missing model = %v, want a 404 *HTTPError for /v2/models/missing/infer", err)
	}
}
