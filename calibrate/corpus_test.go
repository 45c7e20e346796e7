package calibrate

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testutil"
)

// TestRunNodeCorpus calibrates every model of the onnx-node corpus on its
// own test data, as a user pointing kiln at an unfamiliar graph would. Each
// either calibrates, writing every file, or fails with the error its kind
// of model calls for; none crashes or fails for another reason.
func TestRunNodeCorpus(t *testing.T) {
	initORT(t)
	root := testutil.Corpus(t, "onnx-node")
	models, err := filepath.Glob(filepath.Join(root, "*", "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	nested, err := filepath.Glob(filepath.Join(root, "*", "*", "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	models = append(models, nested...)
	// Models that cannot calibrate, and why.
	fails := map[string]func(error) bool{
		// (test_cast_FLOAT_to_FLOAT16's data holds NaN, but the model has
		// nothing to quantize, which is refused before any data is read.)
		"test_cast_FLOAT16_to_FLOAT": func(err error) bool { return strings.Contains(err.Error(), `input "input" is float16`) },
		// The opset-6 models ONNX Runtime 1.24 has no kernels for
		// (AveragePool-1, BatchNormalization-6, Gemm-6) calibrate now: the
		// normalizer upgrades them to opset 13 first.
	}
	var ok, nothing int
	for _, model := range models {
		name := filepath.Base(filepath.Dir(model))
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			rep, err := Run(context.Background(), Config{
				Model: model, Data: dataset.Spec{Path: filepath.Dir(model), Format: dataset.ProtoPB},
				CalibShare: 0.9999, Validation: -1,
			}, out)
			switch want := fails[name]; {
			case want != nil:
				if err == nil || !want(err) {
					t.Errorf("Run = %v, want this model's known error", err)
				}
			case errors.Is(err, ErrNothingToQuantize):
				nothing++
			case err != nil:
				t.Errorf("Run: %v", err)
			default:
				ok++
				checkOutputs(t, out, rep)
			}
		})
	}
	t.Logf("%d models: %d calibrated, %d with nothing to quantize, %d with known errors", len(models), ok, nothing, len(fails))
	if ok < 10 {
		t.Errorf("%d models calibrated, want at least 10 (the Conv, Gemm and MatMul tests)", ok)
	}
}
