package savedmodel_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/savedmodel"
)

// importRun converts the SavedModel at dir and runs the ONNX in ONNX
// Runtime.
func importRun(t *testing.T, dir string, o savedmodel.ConvertOptions, in map[string]*onnx.Tensor) (*savedmodel.Conversion, map[string]*onnx.Tensor) {
	t.Helper()
	m, err := savedmodel.Open(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := savedmodel.Convert(context.Background(), m, o)
	if err != nil {
		t.Fatalf("Convert(%s) = %v", dir, err)
	}
	return c, runModel(t, c.Model, in)
}

func runModel(t *testing.T, m *onnx.Model, in map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	ortest.Init(t)
	path := filepath.Join(t.TempDir(), "model.onnx")
	if err := m.Save(path); err != nil {
		t.Fatal(err)
	}
	s, err := ort.NewSession(path, ort.SessionOptions{})
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer s.Close()
	out, err := s.Run(context.Background(), in, nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out
}

func floats(t *testing.T, x *onnx.Tensor) []float64 {
	t.Helper()
	f, err := x.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// compare checks cosine similarity and max abs difference.
func compare(t *testing.T, name string, got, want []float64, atol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	var dot, ng, nw, maxAbs float64
	for i := range got {
		dot += got[i] * want[i]
		ng += got[i] * got[i]
		nw += want[i] * want[i]
		maxAbs = max(maxAbs, math.Abs(got[i]-want[i]))
	}
	scale := 0.0
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	cos := 1.0
	if ng > 0 || nw > 0 {
		cos = dot / math.Sqrt(ng*nw)
	}
	t.Logf("%s: %d values, cosine %.9f, max abs %.3g (max |want| %.3g)", name, len(got), cos, maxAbs, scale)
	if cos < 0.99999 || maxAbs > atol*max(1, scale) {
		t.Errorf("%s: cosine %.9f, max abs %.3g (atol %g)", name, cos, maxAbs, atol)
	}
}

func TestCorpusHalfPlus(t *testing.T) {
	x := []float32{0, 1, 2, 5}
	for _, tc := range []struct {
		dir     string
		dims    []int64
		add     float64
		version int64
	}{
		{"tf-serving/saved_model_half_plus_two_cpu", []int64{4, 1}, 2, 123},
		{"tf-serving/saved_model_half_plus_two_gpu_trt", []int64{4, 1}, 2, 123},
		{"tf-serving/saved_model_half_plus_two_tf2_cpu", []int64{1}, 2, 123},
		{"tf-serving/saved_model_half_plus_three", nil, 3, 123},
		{"tf-serving/saved_model_half_plus_two_2_versions", []int64{4, 1}, 2, 124},
	} {
		t.Run(filepath.Base(tc.dir), func(t *testing.T) {
			dir := testutil.Corpus(t, "savedmodel", tc.dir)
			n, _ := onnx.NumElements(tc.dims)
			x := x[:n]
			in := map[string]*onnx.Tensor{"x": {Name: "x", Type: onnx.Float, Dims: tc.dims, Data: x}}
			m, err := savedmodel.Open(context.Background(), dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if m.Version != tc.version {
				t.Errorf("Open(%s).Version = %d, want %d", tc.dir, m.Version, tc.version)
			}
			_, out := importRun(t, dir, savedmodel.ConvertOptions{}, in)
			want := make([]float64, len(x))
			for i, v := range x {
				want[i] = 0.5*float64(v) + tc.add
			}
			compare(t, "y", floats(t, out["y"]), want, 1e-6)
		})
	}
}

func TestCorpusMatrixHalfPlusTwo(t *testing.T) {
	dir := testutil.Corpus(t, "savedmodel", "tf-serving/matrix_half_plus_two")
	x := make([]float32, 18)
	want := make([]float64, 18)
	for i := range x {
		x[i] = float32(i)
		want[i] = 0.5*float64(i) + 2
	}
	_, out := importRun(t, dir, savedmodel.ConvertOptions{}, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{2, 3, 3}, Data: x}})
	compare(t, "y", floats(t, out["y"]), want, 1e-6)
}

func TestCorpusBadHalfPlusTwo(t *testing.T) {
	dir := testutil.Corpus(t, "savedmodel", "tf-serving/bad_half_plus_two")
	_, err := savedmodel.Open(context.Background(), dir, nil)
	if !errors.Is(err, savedmodel.ErrNoSavedModel) {
		t.Fatalf("Open(bad_half_plus_two) = %v, want ErrNoSavedModel", err)
	}
}

func readNpz(t *testing.T, path string) map[string]*onnx.Tensor {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	m, err := dataset.ReadNpz(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCorpusModelNavigator(t *testing.T) {
	for _, tc := range []struct{ name, sample string }{
		{"tensorflow_identity", "0"}, {"tensorflow_identity", "1"}, {"jax_linear", "00"}, {"jax_linear", "01"},
	} {
		t.Run(tc.name+"/"+tc.sample, func(t *testing.T) {
			base := testutil.Corpus(t, "savedmodel", "model-navigator", tc.name)
			in := readNpz(t, filepath.Join(base, "model_input/correctness", tc.sample+".npz"))
			want := readNpz(t, filepath.Join(base, "model_output/correctness", tc.sample+".npz"))
			if tc.name == "tensorflow_identity" {
				for _, x := range in { // samples are stored without the batch dimension
					x.Dims = append([]int64{1}, x.Dims...)
				}
			}
			_, out := importRun(t, filepath.Join(base, "tf-savedmodel/model.savedmodel"), savedmodel.ConvertOptions{}, in)
			for k, w := range want {
				g, ok := out[k]
				if !ok {
					t.Fatalf("output %s missing (have %v)", k, keys(out))
				}
				// The stored jax_linear outputs were made with TF32 matmul
				// operands (TestJaxLinearStoredOutputsAreTF32 shows it), so
				// they are ~8e-4 off any fp32 result.
				compare(t, k, floats(t, g), floats(t, w), 1e-3)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
