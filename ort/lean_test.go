package ort_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// resnetish returns ResNetish(8) serialized and a random batch of n images.
func resnetish(t *testing.T, n int) ([]byte, map[string]*onnx.Tensor) {
	t.Helper()
	m := &onnx.Model{Proto: testmodels.ResNetish(8, 3)}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	v := make([]float32, n*3*testmodels.ResNetishSize*testmodels.ResNetishSize)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	in, err := onnx.NewTensor("images", []int64{int64(n), 3, testmodels.ResNetishSize, testmodels.ResNetishSize}, v)
	if err != nil {
		t.Fatal(err)
	}
	return data, map[string]*onnx.Tensor{"images": in}
}

func runBytes(t *testing.T, data []byte, so ort.SessionOptions, in map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	s, err := ort.NewSessionFromBytes(data, so)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.Run(context.Background(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Without the CPU arena a session computes the same bits; without the
// NCHWc layout too at OptDisabled, where there is none, and to float32
// rounding at OptAll, where the blocked kernels sum in another order.
func TestLeanSessionOptions(t *testing.T) {
	ortest.Init(t)
	data, in := resnetish(t, 2)
	lean := ort.SessionOptions{NoCPUArena: true, DisabledOptimizers: []string{ort.NoNCHWc}}
	for _, level := range []ort.OptLevel{ort.OptAll, ort.OptDisabled} {
		want := runBytes(t, data, ort.SessionOptions{OptLevel: level}, in)
		noArena := runBytes(t, data, ort.SessionOptions{OptLevel: level, NoCPUArena: true}, in)
		lean.OptLevel = level
		got := runBytes(t, data, lean, in)
		for name, w := range want {
			if !sameBits(noArena[name], w) {
				t.Errorf("%s, no arena: output %q differs from the default session's", level, name)
			}
			if level == ort.OptDisabled && !sameBits(got[name], w) {
				t.Errorf("%s, no NCHWc: output %q differs from the default session's", level, name)
			}
			if msg := closeTo(got[name], w, 1e-4, 1e-5); msg != "" {
				t.Errorf("%s, no NCHWc: output %q: %s", level, name, msg)
			}
		}
	}
}

func TestDisabledOptimizersValidate(t *testing.T) {
	for _, bad := range []string{"", "NchwcTransformer,ConvActivationFusion", "Nchwc Transformer"} {
		err := ort.SessionOptions{DisabledOptimizers: []string{bad}}.Validate()
		if err == nil || !strings.Contains(err.Error(), "want one transformer name") {
			t.Errorf("DisabledOptimizers %q: Validate() = %v, want an error naming it", bad, err)
		}
	}
}

// OutputBytes, before any run, is what the run's outputs take.
func TestOutputBytes(t *testing.T) {
	ortest.Init(t)
	data, in := resnetish(t, 3)
	s, err := ort.NewSessionFromBytes(data, ort.SessionOptions{InferOutputShapes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	est := s.OutputBytes(in)
	out, err := s.Run(context.Background(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, o := range out {
		want += int64(len(onnx.RawBytes(o)))
	}
	if est != want || want == 0 {
		t.Errorf("OutputBytes = %d, the run's outputs take %d", est, want)
	}
	plain, err := ort.NewSessionFromBytes(data, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if got := plain.OutputBytes(in); got != 0 {
		t.Errorf("OutputBytes without InferOutputShapes = %d, want 0", got)
	}
}

// NoNCHWc keeps ONNX Runtime from rewriting Convs into its blocked layout,
// as the optimized model it writes shows.
func TestNoNCHWc(t *testing.T) {
	ortest.Init(t)
	data, _ := resnetish(t, 1)
	blocked := func(so ort.SessionOptions) int {
		so.OptimizedModelPath = filepath.Join(t.TempDir(), "opt.onnx")
		s, err := ort.NewSessionFromBytes(data, so)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		m, err := onnx.Load(so.OptimizedModelPath)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, node := range m.Graph().GetNode() {
			if node.GetDomain() == "com.microsoft.nchwc" {
				n++
			}
		}
		return n
	}
	if n := blocked(ort.SessionOptions{}); n == 0 {
		t.Fatal("the default session has no NCHWc nodes: the test model no longer shows the layout")
	}
	if n := blocked(ort.SessionOptions{DisabledOptimizers: []string{ort.NoNCHWc}}); n != 0 {
		t.Errorf("with NoNCHWc the optimized model has %d NCHWc nodes, want 0", n)
	}
}

// Unset, the lean options are not in the options' JSON, which calibrate's
// cache keys digest: keys of configs without them stay as they were.
func TestLeanOptionsJSON(t *testing.T) {
	for _, tc := range []struct {
		so   ort.SessionOptions
		want bool
	}{{ort.SessionOptions{IntraOpThreads: 2}, false}, {ort.SessionOptions{NoCPUArena: true, DisabledOptimizers: []string{ort.NoNCHWc}}, true}} {
		data, err := json.Marshal(tc.so)
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{"NoCPUArena", "DisabledOptimizers"} {
			if got := strings.Contains(string(data), field); got != tc.want {
				t.Errorf("%s: %s in JSON = %v, want %v", data, field, got, tc.want)
			}
		}
	}
}
