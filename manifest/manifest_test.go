package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVariantNames(t *testing.T) {
	cases := []struct {
		v        Variant
		id, name string
	}{
		{Variant{Runtime: RuntimeTRT, Precision: INT8, MaxBatch: 16, Instances: 4}, "trt-int8-b16-x4", "resnet50_trt_int8_b16_x4"},
		{Variant{Runtime: RuntimeONNX, Precision: FP32}, "onnx-fp32", "resnet50_onnx_fp32"},
		{Variant{Runtime: RuntimeONNX, Precision: FP16, Instances: 1}, "onnx-fp16", "resnet50_onnx_fp16"},
		{Variant{Runtime: RuntimeTRT, Precision: FP16, MaxBatch: 8, Target: "8.6"}, "trt-fp16-b8-sm86", "resnet50_trt_fp16_b8_sm86"},
	}
	for _, c := range cases {
		if got := c.v.ID(); got != c.id {
			t.Errorf("%+v.ID() = %q, want %q", c.v, got, c.id)
		}
		if got := c.v.ModelName("resnet50"); got != c.name {
			t.Errorf("%+v.ModelName() = %q, want %q", c.v, got, c.name)
		}
		if err := ValidateName(c.v.ModelName("resnet50")); err != nil {
			t.Errorf("ValidateName(%q) = %v", c.name, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, bad := range []string{"", "..", "a/b", `a\b`, "Upper", "_lead", "sp ace", strings.Repeat("a", 129)} {
		if ValidateName(bad) == nil {
			t.Errorf("ValidateName(%q) = nil, want an error", bad)
		}
	}
	if got := SanitizeName("ResNet-50 v2"); got != "resnet-50_v2" {
		t.Errorf("SanitizeName = %q, want resnet-50_v2", got)
	}
}

func TestParse(t *testing.T) {
	if _, err := ParsePrecision("int4"); err == nil || !strings.Contains(err.Error(), "int4") {
		t.Errorf("ParsePrecision(int4) = %v, want an error naming it", err)
	}
	if r, err := ParseRuntime("TensorRT"); err != nil || r != RuntimeTRT {
		t.Errorf("ParseRuntime(TensorRT) = %v, %v", r, err)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	d := DigestBytes([]byte("model"))
	m := New("kiln test")
	m.Put(&Model{Name: "b_onnx_fp32", Variant: Variant{Runtime: RuntimeONNX, Precision: FP32}, Source: d, Version: 1,
		Files: []File{{Path: "1/model.onnx", Size: 5, Digest: d}}, Status: "ok"})
	m.Put(&Model{Name: "a_trt_fp16", Variant: Variant{Runtime: RuntimeTRT, Precision: FP16}, Source: d, Version: 1, Status: "needs-gpu"})
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Models) != 2 || got.Models[0].Name != "a_trt_fp16" || got.Model("b_onnx_fp32").Files[0].Digest != d {
		t.Errorf("Read(Write(m)) = %+v", got.Models)
	}
	// Corrupt manifests are rejected with the file named.
	bad := filepath.Join(dir, FileName)
	os.WriteFile(bad, []byte(`{"schema_version":1,"models":[{"name":"x","files":[{"path":"../../etc/passwd","digest":"`+string(d)+`"}]}]}`), 0o644)
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), "escapes") || !strings.Contains(err.Error(), FileName) {
		t.Errorf("Read(escaping path) = %v", err)
	}
}

func TestDigest(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("abc"), 0o644)
	d, n, err := DigestFile(p)
	if err != nil || n != 3 || d.Hex() != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("DigestFile = %s %d %v", d, n, err)
	}
	if Digest("sha256:xyz").Validate() == nil {
		t.Error("Validate(bad digest) = nil")
	}
}

func TestParseVariant(t *testing.T) {
	v, err := ParseVariant("trt-int8-b16-x4")
	if err != nil || v.Runtime != RuntimeTRT || v.Precision != INT8 || v.MaxBatch != 16 || v.Instances != 4 {
		t.Errorf("ParseVariant = %+v, %v", v, err)
	}
	for _, bad := range []string{"trt", "gpu-fp16", "onnx-int4", "onnx-fp32-q3", "trt-fp16-smx6"} {
		if _, err := ParseVariant(bad); err == nil {
			t.Errorf("ParseVariant(%q) = nil error", bad)
		}
	}
	for id, want := range map[string]Variant{
		"onnx_fp16_b4_x1":     {Runtime: RuntimeONNX, Precision: FP16, MaxBatch: 4},
		"trt-fp16-sm86":       {Runtime: RuntimeTRT, Precision: FP16, Target: "8.6"},
		"tensorrt-fp32-sm120": {Runtime: RuntimeTRT, Precision: FP32, Target: "12.0"},
	} {
		got, err := ParseVariant(id)
		if err != nil || got != want {
			t.Errorf("ParseVariant(%q) = %+v, %v, want %+v", id, got, err, want)
		}
		if back, err := ParseVariant(got.ID()); err != nil || back != got {
			t.Errorf("ParseVariant(%q) = %+v, %v, want %+v back", got.ID(), back, err, got)
		}
	}
}

func TestParseComputeCapability(t *testing.T) {
	for in, want := range map[string]string{"8.6": "8.6", "86": "8.6", "sm86": "8.6", "sm_90": "9.0", "SM120": "12.0", "12.0": "12.0", " 7.5 ": "7.5"} {
		if got, err := ParseComputeCapability(in); err != nil || got != want {
			t.Errorf("ParseComputeCapability(%q) = %q, %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "8", "a100", "8.x", "8.10", "0.5", "sm", "-8.6", "8.-6"} {
		if got, err := ParseComputeCapability(bad); err == nil {
			t.Errorf("ParseComputeCapability(%q) = %q, want an error", bad, got)
		}
	}
}

// A record's status is one of the four states; anything else in kiln.json
// (such as a run outcome like "cached") is refused with the record named.
func TestStatusValidate(t *testing.T) {
	d := DigestBytes([]byte("model"))
	for _, s := range []Status{StatusOK, StatusPerfOnly, StatusNeedsGPU, StatusFailed} {
		m := New("kiln test")
		m.Put(&Model{Name: "m", Source: d, Version: 1, Status: s})
		if err := m.Validate(); err != nil {
			t.Errorf("Validate(status %s) = %v", s, err)
		}
	}
	for _, s := range []Status{"", "cached", "needs-tensorrt", "OK"} {
		m := New("kiln test")
		m.Put(&Model{Name: "m", Source: d, Version: 1, Status: s})
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "models[0]") {
			t.Errorf("Validate(status %q) = %v, want an error naming models[0]", s, err)
		}
	}
}

func TestNewVariant(t *testing.T) {
	v, err := NewVariant("tensorrt", "FP16", 8, 1, "sm86")
	if want := (Variant{Runtime: RuntimeTRT, Precision: FP16, MaxBatch: 8, Target: "8.6"}); err != nil || v != want {
		t.Errorf("NewVariant(tensorrt, FP16, 8, 1, sm86) = %+v, %v, want %+v", v, err, want)
	}
	if id := v.ID(); id != "trt-fp16-b8-sm86" {
		t.Errorf("ID() = %q, want trt-fp16-b8-sm86", id)
	}
	for _, bad := range [][]any{{"gpu", "fp16", 0, 0, ""}, {"onnx", "int4", 0, 0, ""}, {"onnx", "fp32", -1, 0, ""}, {"onnx", "fp32", 0, -2, ""}, {"trt", "fp32", 0, 0, "a100"}} {
		if _, err := NewVariant(bad[0].(string), bad[1].(string), bad[2].(int), bad[3].(int), bad[4].(string)); err == nil {
			t.Errorf("NewVariant%v = nil error", bad)
		}
	}
}
