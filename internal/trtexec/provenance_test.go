package trtexec

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/trtexec/trtexectest"
	"github.com/kiln-ml/kiln/manifest"
)

func TestNewProvenance(t *testing.T) {
	tx, _ := newDouble(t, trtexectest.Double{Log: "trt10.16_result-02.log"})
	spec := Spec{ONNX: "model.onnx", Plan: filepath.Join(t.TempDir(), "model.plan"), Precision: manifest.FP16,
		HardwareCompat: HardwareCompatAmperePlus}
	res, err := tx.Build(context.Background(), spec)
	if err != nil {
		t.Fatalf("Build error %v", err)
	}
	p := NewProvenance(spec, res)
	if p.TensorRT != "10.16.1" || p.TensorRTBuild != "11" || p.GPU != "NVIDIA H100 PCIe" || p.ComputeCapability != "9.0" ||
		p.PrecisionPath != PathFP16Flag || p.HardwareCompat != "ampere+" || p.EngineBuildSeconds != 24.4854 ||
		p.PlanDigest != res.PlanDigest || p.Size != res.Size {
		t.Errorf("NewProvenance = %+v", p)
	}
	want := "--onnx=model.onnx --saveEngine=model.plan --fp16 --hardwareCompatibilityLevel=ampere+"
	if got := strings.Join(p.Command[1:], " "); got != want {
		t.Errorf("NewProvenance.Command = %q, want %q", got, want)
	}
}
