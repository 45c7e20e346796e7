package pbtxt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// A TensorRT plan cannot be opened here, so LintPath checks its config
// against the signature kiln.json recorded when the engine was built.
func TestLintPathPlanFromManifest(t *testing.T) {
	sig := Signature{
		Inputs:  []TensorSig{{Name: "x", DataType: configpb.DataType_TYPE_FP32, Shape: []int64{-1, 4}}},
		Outputs: []TensorSig{{Name: "y", DataType: configpb.DataType_TYPE_FP32, Shape: []int64{-1, 2}}},
	}
	repo := t.TempDir()
	plan := filepath.Join(t.TempDir(), "model.plan")
	os.WriteFile(plan, []byte("engine bytes"), 0o644)
	c, err := Generate(sig, GenerateOptions{Name: "m_trt_fp32", Platform: PlatformTensorRT})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteModel(repo, WriteSpec{Config: c, ModelPath: plan}); err != nil {
		t.Fatal(err)
	}
	writeManifest := func(outputName string) {
		t.Helper()
		rec := &manifest.Model{Name: "m_trt_fp32", Variant: manifest.Variant{Runtime: manifest.RuntimeTRT, Precision: manifest.FP32},
			Source: manifest.DigestBytes([]byte("src")), Version: 1, Status: manifest.StatusOK,
			Inputs: ManifestTensors(sig.Inputs), Outputs: ManifestTensors(sig.Outputs)}
		rec.Outputs[0].Name = outputName
		m := manifest.New("kiln test")
		m.Put(rec)
		data, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(repo, manifest.FileName), data, 0o644)
	}
	writeManifest("y")
	for _, path := range []string{repo, filepath.Join(repo, "m_trt_fp32"), filepath.Join(repo, "m_trt_fp32", ConfigFile)} {
		plans, err := PlanSignatures(path)
		if err != nil || len(plans) != 1 || plans["m_trt_fp32"].Outputs[0].Name != "y" || plans["m_trt_fp32"].Inputs[0].DataType != configpb.DataType_TYPE_FP32 {
			t.Errorf("PlanSignatures(%s) = %+v, %v, want the recorded signature of m_trt_fp32", path, plans, err)
		}
	}
	if ps, err := LintPath(repo, LintOptions{}); err != nil || ps.HasErrors() {
		t.Errorf("LintPath(repo, recorded signature matches) = %v, %v, want no errors", ps, err)
	}
	writeManifest("scores")
	ps, err := LintPath(repo, LintOptions{})
	if err != nil || !ps.HasErrors() || !strings.Contains(ps.Errors()[0].String(), "unexpected inference output 'y', allowed outputs are: scores") {
		t.Errorf("LintPath(repo, recorded output is scores, config says y) = %v, %v, want an error naming output y and scores", ps, err)
	}
	if plans, err := PlanSignatures(t.TempDir()); plans != nil || err != nil {
		t.Errorf("PlanSignatures(no kiln.json) = %v, %v, want nil, nil", plans, err)
	}
}
