package calibrate

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// initORT loads the library `make deps` provides; without it the test
// fails, because `make test` runs `make deps` first.
func initORT(t testing.TB) { ortest.Init(t) }

// writeModel saves p under dir and returns the path.
func writeModel(t testing.TB, dir, name string, p *onnxpb.ModelProto) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := (&onnx.Model{Proto: p}).Save(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeImages writes n generated PNG images of size w×h into dir.
func writeImages(t testing.TB, dir string, n, w, h int, seed uint64) {
	t.Helper()
	if err := testmodels.WriteImages(dir, n, w, h, seed); err != nil {
		t.Fatal(err)
	}
}

// writeNpy writes n samples of shape dims (without the batch dimension) as
// one stacked .npy file of smooth values in [-1, 1], and returns its path.
func writeNpy(t testing.TB, dir, input string, n int, dims []int64, seed uint64) string {
	t.Helper()
	per := 1
	for _, d := range dims {
		per *= int(d)
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	data := make([]float32, n*per)
	for s := range n {
		a, b, c := rng.Float64()*4, rng.Float64()*2*math.Pi, rng.Float64()
		for i := range per {
			data[s*per+i] = float32(0.8*math.Sin(a*float64(i)/float64(per)*6+b) + 0.2*(2*c-1))
		}
	}
	return saveNpy(t, filepath.Join(dir, input+".npy"), input, append([]int64{int64(n)}, dims...), data)
}

// saveNpy writes a tensor of the given shape and data (any slice type
// onnx.NewTensor takes) as a .npy file and returns its path.
func saveNpy(t testing.TB, path, name string, dims []int64, data any) string {
	t.Helper()
	tn, err := onnx.NewTensor(name, dims, data)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(dataset.WriteNpy(f, tn), f.Close()); err != nil {
		t.Fatal(err)
	}
	return path
}

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

// batchesOf makes the batches of src once, so that timing covers the model
// and the statistics, and inference and calibration read the same memory.
func batchesOf(b testing.TB, src memSource, sig []onnx.ValueInfo) []*dataset.Batch {
	return batchesOfSize(b, src, sig, benchBatch)
}

func batchesOfSize(b testing.TB, src memSource, sig []onnx.ValueInfo, size int) []*dataset.Batch {
	var out []*dataset.Batch
	for bt, err := range dataset.Batches(context.Background(), src, nil, dataset.BatchOptions{Size: size, Inputs: sig}) {
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, bt)
	}
	return out
}

func replay(batches []*dataset.Batch) iter.Seq2[*dataset.Batch, error] {
	return func(yield func(*dataset.Batch, error) bool) {
		for _, bt := range batches {
			if !yield(bt, nil) {
				return
			}
		}
	}
}

// Distributions with known answers. Each is deterministic (fixed seed).
func gaussian(n int, sigma float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * sigma)
	}
	return v
}

func uniform(n int, a float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 2))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((2*r.Float64() - 1) * a)
	}
	return v
}

func laplace(n int, b float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	v := make([]float32, n)
	for i := range v {
		x := r.ExpFloat64() * b
		if r.IntN(2) == 0 {
			x = -x
		}
		v[i] = float32(x)
	}
	return v
}

func histOf(t testing.TB, batches ...[]float32) *Histogram {
	t.Helper()
	h := NewHistogram()
	for _, b := range batches {
		if err := h.Add(b); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	return h
}

// sameHist reports how got differs from want, bit for bit, or "".
func sameHist(want, got *Histogram) string {
	switch {
	case want.Count() != got.Count():
		return "count"
	case math.Float64bits(want.Min()) != math.Float64bits(got.Min()):
		return "min"
	case math.Float64bits(want.Max()) != math.Float64bits(got.Max()):
		return "max"
	case math.Float64bits(want.BinWidth()) != math.Float64bits(got.BinWidth()):
		return "bin width"
	case !slices.Equal(want.Counts(), got.Counts()):
		return "counts"
	case want.zeros != got.zeros:
		return "zeros"
	}
	return ""
}

// tile repeats each batch 37 times, so that batches are long enough for the
// vector kernels (see useSIMD) and end in a scalar tail.
func tile(batches [][]float32) [][]float32 {
	long := make([][]float32, len(batches))
	for i, b := range batches {
		for range 37 {
			long[i] = append(long[i], b...)
		}
	}
	return long
}

// mapsEqual tells whether two maps hold the same keys and values.
func mapsEqual[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
