package convert

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/internal/trtexec/trtexectest"
	"github.com/kiln-ml/kiln/manifest"
)

// An implicitly quantized engine (int8 mode cache, TensorRT <= 10) from a
// calibration written without --trt-cache fails with ErrNoCalibrationCache,
// naming the directory; the Q/DQ path from the same calibration builds, and
// kiln.json records the calibration's scope.
func TestRunInt8CacheMissing(t *testing.T) {
	tx, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-01.log"})
	rec := manifest.Calibration{Method: "entropy", Samples: 32, Scope: "qdq"}
	cal := &manifest.CalibrationOutput{Dir: "calib-qdq", QDQModel: tinynet, Calibration: rec}

	cfg := Config{Source: tinynet, Repo: t.TempDir(), ToolVersion: "test", Variants: variants(t, "trt-int8-b4"),
		Int8: Int8Config{Calibration: cal, Mode: trtexec.Int8Cache}}
	res, err := Run(context.Background(), cfg, WithBuilder(tx))
	var rowErr error
	if res != nil && len(res.Rows) == 1 {
		rowErr = res.Rows[0].Err
	}
	if got := errors.Join(err, rowErr); !errors.Is(got, ErrNoCalibrationCache) || !strings.Contains(got.Error(), "calib-qdq holds no calibration.cache") {
		t.Errorf("Run(trt-int8, mode cache, no cache) = %v, want ErrNoCalibrationCache naming calib-qdq", got)
	}

	repo := t.TempDir()
	cfg = Config{Source: tinynet, Repo: repo, ToolVersion: "test", Variants: variants(t, "onnx-int8"), Int8: Int8Config{Calibration: cal}}
	res, err = Run(context.Background(), cfg, WithBuilder(tx))
	if err != nil || len(res.Failed()) != 0 {
		t.Fatalf("Run(onnx-int8) = %+v, %v", res, err)
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	if got := man.Model(res.Rows[0].Model); got == nil || got.Calibration == nil || got.Calibration.Scope != "qdq" {
		t.Errorf("kiln.json calibration of onnx-int8 = %+v, want scope qdq", got)
	}
}
