package serve

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/serve/kserve"
)

// The benchmarks below measure ratios, each side run alternately in the
// same process (the machine is noisy): BENCHMARKS.md records them.

const benchWindow = 500 * time.Millisecond

// benchFeed is one random sample for the tinynet model.
func benchFeed(b *testing.B, s *ort.Session) check.Feed {
	b.Helper()
	feeds, _, err := check.Feeds(context.Background(), check.FeedSpec{Inputs: ort.ValueInfos(s.Inputs()), Samples: 1})
	if err != nil {
		b.Fatal(err)
	}
	return feeds[0]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// serve's measured mean latency at concurrency 1 against a bare loop of
// ort.Session.Run over the same inputs: the cost of serve's timing loop.
func BenchmarkSweepVsBareLoop(b *testing.B) {
	dir, src := testRepo(b, false)
	_ = dir
	s, err := ort.NewSession(src, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	feed := benchFeed(b, s)
	ctx := context.Background()
	var ratios []float64
	for range b.N {
		for range 5 {
			bare := bareLoop(b, s, feed, benchWindow)
			pts, err := Sweep(ctx, ort.Runner{Session: s}, feed, []int{1}, PerfConfig{Concurrency: []int{1}, Window: benchWindow})
			if err != nil {
				b.Fatal(err)
			}
			ratios = append(ratios, float64(pts[0].Mean())/float64(bare))
		}
	}
	b.ReportMetric(median(ratios), "serve/bare")
}

// bareLoop is the baseline: Run back to back, mean latency.
func bareLoop(b *testing.B, s *ort.Session, feed check.Feed, window time.Duration) time.Duration {
	var n int
	start := time.Now()
	for time.Since(start) < window {
		if _, err := s.Run(context.Background(), feed.Tensors, nil); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return time.Since(start) / time.Duration(n)
}

// The endpoint's throughput over loopback HTTP (binary tensors) against
// the same model run in-process, both at concurrency 4.
func BenchmarkEndpointVsInProcess(b *testing.B) {
	for _, bm := range benchModels() {
		b.Run(bm.name, func(b *testing.B) { endpointVsInProcess(b, bm.model) })
	}
}

type benchModel struct {
	name  string
	model *onnxpb.ModelProto
}

// benchModels are a tiny model (about 60 us per inference here), where
// HTTP's own cost shows most, and a CNN of a few milliseconds.
func benchModels() []benchModel {
	return []benchModel{{"tinynet", testmodels.TinyNet(1)}, {"resnetish64", testmodels.ResNetish(64, 1)}}
}

func endpointVsInProcess(b *testing.B, model *onnxpb.ModelProto) {
	dir, _ := testRepoOf(b, model, false)
	e, err := NewEndpoint(dir, nil, ort.SessionOptions{}, kserve.Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()
	local, err := ort.NewSession(repoModelPath(b, dir), ort.SessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer local.Close()
	feed := benchFeed(b, local)
	remote := kserve.ModelRunner(kserve.NewClient(srv.URL, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}), "tinynet_onnx_fp32_b4", "1")
	var ratios []float64
	for range b.N {
		for range 5 {
			in := throughput(b, ort.Runner{Session: local}, feed, 4)
			over := throughput(b, remote, feed, 4)
			ratios = append(ratios, over/in)
		}
	}
	b.ReportMetric(median(ratios), "http/in-process")
}

// Throughput at concurrency 8 through the endpoint with dynamic batching
// (max_queue_delay 200us, preferred batch 4) against without.
func BenchmarkDynamicBatching(b *testing.B) {
	for _, bm := range benchModels() {
		b.Run(bm.name, func(b *testing.B) { dynamicBatching(b, bm.model) })
	}
}

func dynamicBatching(b *testing.B, model *onnxpb.ModelProto) {
	dir, _ := testRepoOf(b, model, false)
	start := func(delay time.Duration) (check.Runner, func()) {
		a, _ := readRepository(dir, nil)
		art := a.artifacts[0]
		art.MaxQueueDelay, art.PreferredBatch = delay, nil
		if delay > 0 {
			art.PreferredBatch = []int{4}
		}
		m, closeFn, err := kserveModel(art, ort.SessionOptions{})
		if err != nil {
			b.Fatal(err)
		}
		srv, err := kserve.NewServer([]kserve.Model{m}, kserve.Options{})
		if err != nil {
			b.Fatal(err)
		}
		hs := httptest.NewServer(srv.Handler())
		r := kserve.ModelRunner(kserve.NewClient(hs.URL, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}), m.Name, m.Version)
		return r, func() { hs.Close(); srv.Close(); closeFn() }
	}
	s, err := ort.NewSession(repoModelPath(b, dir), ort.SessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	feed := benchFeed(b, s)
	batched, stop1 := start(200 * time.Microsecond)
	defer stop1()
	plain, stop2 := start(0)
	defer stop2()
	var ratios []float64
	for range b.N {
		for range 5 {
			without := throughput(b, plain, feed, 8)
			with := throughput(b, batched, feed, 8)
			ratios = append(ratios, with/without)
		}
	}
	b.ReportMetric(median(ratios), "batched/unbatched")
}

// throughput runs n workers for benchWindow and returns requests/second.
func throughput(b *testing.B, r check.Runner, feed check.Feed, n int) float64 {
	var mu sync.Mutex
	total := 0
	deadline := time.Now().Add(benchWindow)
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			c := 0
			for time.Now().Before(deadline) {
				if _, err := r.Run(context.Background(), feed.Tensors); err != nil {
					b.Error(err)
					return
				}
				c++
			}
			mu.Lock()
			total += c
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds()
}

func repoModelPath(b *testing.B, dir string) string {
	a, err := readRepository(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	return a.artifacts[0].Path
}
