package kserve

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

// benchWorkers is the parallelism of both benchmarks: exactly this many
// callers, whatever GOMAXPROCS is, so that the two compare.
const benchWorkers = 4

// parallel runs b.N calls of f spread over benchWorkers goroutines.
func parallel(b *testing.B, f func() error) {
	b.Helper()
	work := make(chan struct{}, benchWorkers)
	var wg sync.WaitGroup
	var once sync.Once
	b.ResetTimer()
	for range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if err := f(); err != nil {
					once.Do(func() { b.Error(err) })
				}
			}
		}()
	}
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
}

// benchModel is the small runner both benchmarks call: 2x+1 on 1x4
// float32, with as many instances as callers so that none waits for it.
func benchModel() Model {
	m := affineModel("bench", &affine{}, 8, 0)
	m.Instances = benchWorkers
	return m
}

func benchInputs() map[string]*onnx.Tensor {
	return map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{1, 4}, Data: []float32{1, 2, 3, 4}}}
}

// BenchmarkInferInProcess is the whole inference path without HTTP:
// encode the request, decode it, validate, run, encode the response and
// decode it, as Client.Infer and the handler do.
func BenchmarkInferInProcess(b *testing.B) {
	s, err := NewServer([]Model{benchModel()}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	sv, err := s.lookup("bench", "")
	if err != nil {
		b.Fatal(err)
	}
	x := benchInputs()["x"]
	x.Name = "x"
	req := &Request{Inputs: []*onnx.Tensor{x}}
	b.ReportAllocs()
	parallel(b, func() error {
		body, n, err := EncodeRequest(req, false)
		if err != nil {
			return err
		}
		out, n, err := s.infer(context.Background(), sv, body, n)
		if err != nil {
			return err
		}
		_, err = DecodeResponse(out, n)
		return err
	})
}

// BenchmarkInferHTTP is the same through Client.Infer and the handler on
// a loopback listener.
func BenchmarkInferHTTP(b *testing.B) {
	s, err := NewServer([]Model{benchModel()}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	c := NewClient(hs.URL, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchWorkers}})
	in := benchInputs()
	b.ReportAllocs()
	parallel(b, func() error {
		_, err := c.Infer(context.Background(), "bench", "", in, nil, false)
		return err
	})
}
