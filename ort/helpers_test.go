package ort_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
	"github.com/x448/float16"
)

// closeTo compares got with want elementwise: |got-want| <= atol+rtol*|want|
// for floating-point types (NaN matches NaN), exact equality otherwise.
// It returns a description of the first mismatch, or "".
func closeTo(got, want *onnx.Tensor, rtol, atol float64) string {
	if got.Type != want.Type {
		return "element type " + got.Type.String() + ", want " + want.Type.String()
	}
	if got.Len() != want.Len() {
		return fmt.Sprintf("%d elements (shape %v), want %d (shape %v)", got.Len(), got.Dims, want.Len(), want.Dims)
	}
	if s, ok := want.Data.([]string); ok {
		g := got.Data.([]string)
		for i := range s {
			if g[i] != s[i] {
				return fmt.Sprintf("element %d = %q, want %q", i, g[i], s[i])
			}
		}
		return ""
	}
	if !want.Type.IsFloat() && sameBits(got, want) {
		return ""
	}
	g, err := got.Float64s()
	if err != nil {
		return err.Error()
	}
	w, err := want.Float64s()
	if err != nil {
		return err.Error()
	}
	exact := !want.Type.IsFloat()
	bad, worst := 0, -1
	for i := range w {
		ok := false
		switch {
		case exact:
			ok = g[i] == w[i]
		case math.IsNaN(w[i]) || math.IsNaN(g[i]):
			ok = math.IsNaN(w[i]) && math.IsNaN(g[i])
		case math.IsInf(w[i], 0):
			ok = g[i] == w[i]
		default:
			ok = math.Abs(g[i]-w[i]) <= atol+rtol*math.Abs(w[i])
		}
		if !ok {
			bad++
			if worst < 0 {
				worst = i
			}
		}
	}
	if bad > 0 {
		return fmt.Sprintf("%d of %d elements differ; first at %d: got %v, want %v", bad, len(w), worst, g[worst], w[worst])
	}
	return ""
}

// sameBits compares two tensors bit for bit.
// runMatches runs s on in and checks that every output in want comes back
// bit for bit.
func runMatches(t *testing.T, s *ort.Session, in map[string]*onnx.Tensor, want map[string]*onnx.Tensor) {
	t.Helper()
	got, err := s.Run(context.Background(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		if !sameBits(got[name], w) {
			t.Errorf("output %q = %v, want %v", name, got[name].Data, w.Data)
		}
	}
}

func sameBits(a, b *onnx.Tensor) bool {
	if a.Type != b.Type || a.Len() != b.Len() {
		return false
	}
	if s, ok := a.Data.([]string); ok {
		o := b.Data.([]string)
		for i := range s {
			if s[i] != o[i] {
				return false
			}
		}
		return true
	}
	return string(onnx.RawBytes(a)) == string(onnx.RawBytes(b))
}

func f16s(v ...float32) []float16.Float16 {
	out := make([]float16.Float16, len(v))
	for i, x := range v {
		out[i] = float16.Fromfloat32(x)
	}
	return out
}
