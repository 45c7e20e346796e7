package dataset

import (
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

func TestBatched(t *testing.T) {
	scalar := onnx.ValueInfo{Name: "sr", Type: onnx.Int64, Shape: onnx.Shape{Ranked: true}}
	for _, tc := range []struct {
		name string
		sig  []onnx.ValueInfo
		want bool
	}{
		{"free batch", []onnx.ValueInfo{floatInput("x", -1, 3, 224, 224), floatInput("m", -1, 10)}, true},
		{"fixed batch everywhere", []onnx.ValueInfo{floatInput("x", 1, 3), floatInput("y", 1, 5)}, true},
		{"fixed batches differ", []onnx.ValueInfo{floatInput("x", 1, 3), floatInput("y", 2, 5)}, false},
		// Silero VAD: input [?,?] beside state [2,?,128], whose 2 is the
		// LSTM's layers, not a batch.
		{"free beside fixed", []onnx.ValueInfo{floatInput("input", -1, -1), floatInput("state", 2, -1, 128)}, false},
		{"scalar input", []onnx.ValueInfo{floatInput("x", -1, 3), scalar}, false},
		{"empty", nil, true},
	} {
		if got := Batched(tc.sig); got != tc.want {
			t.Errorf("%s: Batched = %v, want %v", tc.name, got, tc.want)
		}
	}
}
