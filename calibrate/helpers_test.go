package calibrate

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
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
