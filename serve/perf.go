package serve

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/serve/report"
)

// PerfConfig says how to time an artifact, as Triton's perf_analyzer does:
// warm-up runs, then for every batch size and concurrency a measurement
// window in which Concurrency workers send requests back to back.
type PerfConfig struct {
	// Disabled skips timing.
	Disabled bool
	// Concurrency lists the numbers of concurrent requests (default 1,2,4,8).
	Concurrency []int
	// Batches lists the batch sizes (default 1 and the model's max batch);
	// sizes the model does not accept are skipped.
	Batches []int
	// Warmup is the number of runs before measuring (default 5).
	Warmup int
	// Window is the measurement window per point (default 1s).
	Window time.Duration
}

// Validate checks the sweep's values.
func (c PerfConfig) Validate() error {
	for _, n := range c.Concurrency {
		if n < 1 || n > 1024 {
			return fmt.Errorf("concurrency %d is not in 1..1024", n)
		}
	}
	for _, b := range c.Batches {
		if b < 1 {
			return fmt.Errorf("batch size %d is not positive", b)
		}
	}
	if c.Warmup < 0 || c.Window < 0 {
		return errors.New("warm-up runs and the measurement window must not be negative")
	}
	return nil
}

func (c PerfConfig) withDefaults() PerfConfig {
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 2, 4, 8}
	}
	if c.Warmup == 0 {
		c.Warmup = 5
	}
	if c.Window == 0 {
		c.Window = time.Second
	}
	return c
}

// batchesFor lists the batch sizes to time for an artifact.
func (c PerfConfig) batchesFor(maxBatch int, batched bool) []int {
	if !batched {
		return []int{1}
	}
	if len(c.Batches) == 0 {
		if maxBatch > 1 {
			return []int{1, maxBatch}
		}
		return []int{1}
	}
	var out []int
	for _, b := range c.Batches {
		if maxBatch == 0 || b <= maxBatch {
			out = append(out, b)
		}
	}
	return out
}

// Point is one measurement: a batch size at a concurrency.
type Point struct {
	Concurrency, Batch, Requests int
	Elapsed                      time.Duration
	// Latencies of every request, sorted.
	Latencies []time.Duration
}

// Throughput is inferences (samples) per second.
func (p Point) Throughput() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Requests*p.Batch) / p.Elapsed.Seconds()
}

// Percentile returns the q-th latency percentile (0 < q <= 100), nearest
// rank, as perf_analyzer reports it.
func (p Point) Percentile(q float64) time.Duration {
	n := len(p.Latencies)
	if n == 0 {
		return 0
	}
	i := int(q/100*float64(n)+0.999999) - 1
	return p.Latencies[min(max(i, 0), n-1)]
}

// Mean is the mean latency.
func (p Point) Mean() time.Duration {
	if len(p.Latencies) == 0 {
		return 0
	}
	var sum time.Duration
	for _, l := range p.Latencies {
		sum += l
	}
	return sum / time.Duration(len(p.Latencies))
}

// Sweep times r on feed at every batch size and concurrency of c.
func Sweep(ctx context.Context, r check.Runner, feed check.Feed, batches []int, c PerfConfig) ([]Point, error) {
	c = c.withDefaults()
	var points []Point
	for _, b := range batches {
		in, err := batchOf(feed, b)
		if err != nil {
			return nil, err
		}
		for range c.Warmup {
			if _, err := r.Run(ctx, in); err != nil {
				return nil, fmt.Errorf("warm-up at batch %d: %w", b, err)
			}
		}
		for _, n := range c.Concurrency {
			p, err := measure(ctx, r, in, n, c.Window)
			if err != nil {
				return nil, fmt.Errorf("timing batch %d at concurrency %d: %w", b, n, err)
			}
			p.Batch = b
			points = append(points, p)
		}
	}
	return points, nil
}

// measure runs n workers sending in back to back for window.
func measure(ctx context.Context, r check.Runner, in map[string]*onnx.Tensor, n int, window time.Duration) (Point, error) {
	var (
		mu   sync.Mutex
		all  []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(window)
	for range n {
		wg.Go(func() {
			var lat []time.Duration
			for ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				if _, err := r.Run(ctx, in); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		return Point{}, errs[0]
	}
	if err := ctx.Err(); err != nil {
		return Point{}, err
	}
	slices.Sort(all)
	return Point{Concurrency: n, Requests: len(all), Elapsed: elapsed, Latencies: all}, nil
}

// LoopOverhead measures what the timing loop itself costs per request: the
// same loop around a runner that does nothing.
func LoopOverhead(ctx context.Context, in map[string]*onnx.Tensor) time.Duration {
	p, err := measure(ctx, nopRunner{}, in, 1, 50*time.Millisecond)
	if err != nil || p.Requests == 0 {
		return 0
	}
	return p.Mean()
}

type nopRunner struct{}

func (nopRunner) Run(context.Context, map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	return nil, nil
}

// batchOf builds the inputs of one request of b samples from the first
// sample of feed (repeated), or feed itself for an unbatched model.
func batchOf(f check.Feed, b int) (map[string]*onnx.Tensor, error) {
	if !f.Batched {
		return f.Tensors, nil
	}
	out := make(map[string]*onnx.Tensor, len(f.Tensors))
	for name, t := range f.Tensors {
		r, err := repeatRow(t, b)
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
		out[name] = r
	}
	return out, nil
}

// repeatRow returns a tensor of b rows, each row 0 of t.
func repeatRow(t *onnx.Tensor, b int) (*onnx.Tensor, error) {
	if len(t.Dims) == 0 || t.Dims[0] < 1 {
		return nil, fmt.Errorf("shape %v has no batch dimension", t.Dims)
	}
	src := reflect.ValueOf(t.Data)
	row := src.Len() / int(t.Dims[0])
	dst := reflect.MakeSlice(src.Type(), row*b, row*b)
	for i := range b {
		reflect.Copy(dst.Slice(i*row, (i+1)*row), src.Slice(0, row))
	}
	dims := slices.Clone(t.Dims)
	dims[0] = int64(b)
	return &onnx.Tensor{Name: t.Name, Type: t.Type, Dims: dims, Data: dst.Interface()}, nil
}

// perf times an opened artifact over the sweep, or returns nil when timing
// is disabled or fails (the failure is noted in m.Reason: a model that
// answered every check but cannot be timed still passed its checks).
func (r *runner) perf(ctx context.Context, m *report.Model, a Artifact, s Session, feed check.Feed) *report.Perf {
	c := r.cfg.Perf.withDefaults()
	if r.cfg.Perf.Disabled {
		return nil
	}
	if t, ok := s.(timer); ok {
		var perfs []report.PerfPoint
		var out *report.Perf
		for _, b := range c.batchesFor(a.MaxBatch, feed.Batched) {
			in, err := batchOf(feed, b)
			if err == nil {
				out, err = t.time(ctx, in, b)
			}
			if err != nil {
				m.Reason = joinReason(m.Reason, "not timed: "+err.Error())
				return nil
			}
			perfs = append(perfs, out.Points...)
		}
		out.Points = perfs
		return out
	}
	points, err := Sweep(ctx, s, feed, c.batchesFor(a.MaxBatch, feed.Batched), c)
	if err != nil {
		m.Reason = joinReason(m.Reason, "not timed: "+err.Error())
		return nil
	}
	in, _ := batchOf(feed, 1)
	over := LoopOverhead(ctx, in)
	p := &report.Perf{Warmup: c.Warmup, MeasurementWindow: c.Window, Overhead: report.LoopOverhead{PerRequestUS: us(over)}}
	for _, pt := range points {
		p.Points = append(p.Points, report.PerfPoint{
			Concurrency: pt.Concurrency, Batch: pt.Batch, Requests: pt.Requests,
			ThroughputInferPerSec: pt.Throughput(), LatencyAvgUS: us(pt.Mean()),
			LatencyP50US: us(pt.Percentile(50)), LatencyP90US: us(pt.Percentile(90)),
			LatencyP95US: us(pt.Percentile(95)), LatencyP99US: us(pt.Percentile(99)),
			LatencyMinUS: us(pt.Percentile(0)), LatencyMaxUS: us(pt.Percentile(100)),
		})
	}
	if len(p.Points) > 0 && p.Points[0].LatencyAvgUS > 0 {
		p.Overhead.Share = p.Overhead.PerRequestUS / p.Points[0].LatencyAvgUS
	}
	return p
}

// timer is a session that times itself (trtexec's own measurement)
// rather than being timed by serve's loop.
type timer interface {
	time(ctx context.Context, in map[string]*onnx.Tensor, batch int) (*report.Perf, error)
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// joinReason appends b to a model's reason.
func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
