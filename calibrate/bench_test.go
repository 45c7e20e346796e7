package calibrate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// memSource serves generated samples from memory, so benchmarks time the
// model and the statistics, not image decoding.
type memSource struct {
	input string
	dims  []int64
	seed  uint64
	n     int
}

func (s memSource) Len() int { return s.n }

func (s memSource) Sample(_ context.Context, i int) (dataset.Sample, error) {
	rng := rand.New(rand.NewPCG(s.seed, uint64(i)))
	per := 1
	for _, d := range s.dims {
		per *= int(d)
	}
	v := make([]float32, per)
	base := float32(rng.NormFloat64())
	for j := range v {
		v[j] = base + float32(rng.NormFloat64())*0.5
	}
	t, err := onnx.NewTensor(s.input, s.dims, v)
	return dataset.Sample{ID: fmt.Sprintf("mem#%d", i), Tensors: map[string]*onnx.Tensor{s.input: t}, Label: -1}, err
}

// BenchmarkCalibrate times, side by side in one run, plain ONNX Runtime
// inference of N samples (the baseline) and calibration of the same N
// samples (Collect with every tensor fetched, plus computing the ranges).
// The ratio calibrate/infer is the overhead of collecting statistics.
func BenchmarkCalibrate(b *testing.B) {
	initORT(b)
	m := &onnx.Model{Proto: testmodels.Classifier(1)}
	sig := m.Inputs()
	data, err := m.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	const batch = 32
	for _, n := range []int{256, 1024} {
		src := memSource{input: "images", dims: []int64{3, 32, 32}, seed: 1, n: n}
		opts := dataset.BatchOptions{Size: batch, Inputs: sig}
		b.Run(fmt.Sprintf("infer/N=%d", n), func(b *testing.B) {
			sess, err := ort.NewSessionFromBytes(data, ort.SessionOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer sess.Close()
			for b.Loop() {
				for bt, err := range dataset.Batches(context.Background(), src, nil, opts) {
					if err != nil {
						b.Fatal(err)
					}
					if _, err := sess.Run(context.Background(), bt.Tensors, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/sample")
		})
		b.Run(fmt.Sprintf("fetch/N=%d", n), func(b *testing.B) {
			// The augmented model alone: what fetching every tensor costs
			// ONNX Runtime before any statistics.
			names, _ := Observed(m)
			aug, _ := Augment(m, names)
			adata, _ := aug.Marshal()
			sess, err := ort.NewSessionFromBytes(adata, ort.SessionOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer sess.Close()
			for b.Loop() {
				for bt, err := range dataset.Batches(context.Background(), src, nil, opts) {
					if err != nil {
						b.Fatal(err)
					}
					if _, err := sess.Run(context.Background(), bt.Tensors, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/sample")
		})
		b.Run(fmt.Sprintf("calibrate/N=%d", n), func(b *testing.B) {
			var peak uint64
			for b.Loop() {
				st, err := Collect(context.Background(), m, dataset.Batches(context.Background(), src, nil, opts), CollectOptions{
					Progress: func(int) {
						var ms runtime.MemStats
						runtime.ReadMemStats(&ms)
						peak = max(peak, ms.HeapInuse)
					},
				})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := st.Ranges(Entropy, MethodOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/sample")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}
