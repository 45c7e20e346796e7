package calibrate

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// A model with nothing the Q/DQ model quantizes is refused before any
// sample is read, naming what it has instead.
func TestCheckQuantizable(t *testing.T) {
	b := testmodels.NewBuilder("relu", 1)
	x := b.Input("x", onnx.Float, 1, 4)
	b.Node("Relu", []string{x})
	b.Rename("y")
	b.Output("y", onnx.Float, 1, 4)
	err := checkQuantizable(&onnx.Model{Proto: b.Model(13, 8)})
	if !errors.Is(err, ErrNothingToQuantize) || !strings.Contains(err.Error(), "1 Relu") {
		t.Errorf("checkQuantizable(Relu only) = %v, want ErrNothingToQuantize naming 1 Relu", err)
	}
	if err := checkQuantizable(&onnx.Model{Proto: testmodels.TinyNet(1)}); err != nil {
		t.Errorf("checkQuantizable(TinyNet) = %v", err)
	}
}

// Silero VAD v5 computes inside If branches chosen by its sr input: the
// refusal counts the Convs there and names the input to fix.
func TestCheckQuantizableSilero(t *testing.T) {
	m, err := onnx.Load(testutil.NPMModel(t, "silero_vad_v5.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	err = checkQuantizable(m)
	if !errors.Is(err, ErrNothingToQuantize) || !strings.Contains(err.Error(), "Conv, all inside If bodies") ||
		!strings.Contains(err.Error(), "--fix sr=VALUE") {
		t.Errorf("checkQuantizable(silero) = %v, want the If-body Convs counted and --fix sr advised", err)
	}
}
