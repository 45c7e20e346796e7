// Package ortest holds what tests that run models share: loading the ONNX
// Runtime library that `make deps` provides and reading TensorProto files.
// It is imported by tests only (it links the cgo ort package); ort's own
// tests use it too, from package ort_test.
package ortest

import (
	"os"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"google.golang.org/protobuf/proto"
)

// Init loads ONNX Runtime from $KILN_ORT_LIB or the checkout's .cache/ort.
// Without it the test fails rather than skips: `make test` fetches the
// library before running the tests, so a missing one is a broken setup.
func Init(t testing.TB) {
	t.Helper()
	lib, err := ort.FindLibrary("", os.Getenv("KILN_ORT_LIB"), testutil.RepoRoot(t))
	if err != nil {
		t.Fatalf("ONNX Runtime library missing, run make deps: %v", err)
	}
	if err := ort.Init(lib); err != nil {
		t.Fatalf("ort.Init(%s) = %v", lib, err)
	}
}

// ReadTensor reads and decodes a serialized TensorProto file.
func ReadTensor(t testing.TB, path string) *onnx.Tensor {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &onnxpb.TensorProto{}
	if err := proto.Unmarshal(b, p); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	tn, err := onnx.Decode(p)
	if err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return tn
}

// ArangeInput is the input the onnx-light runner builds for a float input
// of shape S (unknown dimensions taken as 1): x = arange(n).reshape(S) / n.
func ArangeInput(v onnx.ValueInfo) *onnx.Tensor {
	dims := make([]int64, len(v.Shape.Dims))
	for i, d := range v.Shape.Dims {
		dims[i] = 1
		if d.Known {
			dims[i] = d.Value
		}
	}
	n, _ := onnx.NumElements(dims)
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(float64(i) / float64(n))
	}
	return &onnx.Tensor{Name: v.Name, Type: onnx.Float, Dims: dims, Data: x}
}
