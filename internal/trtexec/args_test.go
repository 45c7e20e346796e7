package trtexec

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
)

var (
	trt82  = manifest.TRTVersion{Major: 8, Minor: 2, Patch: 3}
	trt84  = manifest.TRTVersion{Major: 8, Minor: 4, Patch: 1}
	trt86  = manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1}
	trt103 = manifest.TRTVersion{Major: 10, Minor: 3, Patch: 0}
	trt11  = manifest.TRTVersion{Major: 11, Minor: 0, Patch: 0}
)

func intp(i int) *int { return &i }

// dynamicImage is a model with one dynamic-batch image input.
func dynamicImage(s Spec) Spec {
	s.ONNX, s.Plan = "m.onnx", "m.plan"
	s.Inputs = []InputShape{{Name: "images", Dims: []int64{-1, 3, 224, 224}}}
	s.MaxBatch = 16
	return s
}

const dynShapes = "--minShapes=images:1x3x224x224 --optShapes=images:16x3x224x224 --maxShapes=images:16x3x224x224"

func TestArgs(t *testing.T) {
	fp32 := dynamicImage(Spec{Precision: manifest.FP32})
	fp16 := dynamicImage(Spec{Precision: manifest.FP16})
	fp16onnx := dynamicImage(Spec{Precision: manifest.FP16, ONNXIsFP16: true})
	qdq := dynamicImage(Spec{Precision: manifest.INT8, Int8Mode: Int8QDQ, ONNXIsQDQ: true})
	cache := dynamicImage(Spec{Precision: manifest.INT8, Int8Mode: Int8Cache, CalibCache: "m.cache"})
	static := Spec{ONNX: "m.onnx", Plan: "m.plan", Precision: manifest.FP16,
		Inputs: []InputShape{{Name: "x", Dims: []int64{1, 10}}}}
	const base = "--onnx=m.onnx --saveEngine=m.plan "
	tests := []struct {
		name     string
		spec     Spec
		v        manifest.TRTVersion
		want     string
		wantPath PrecisionPath
	}{
		// TensorRT 8: weakly typed, precision by flags.
		{"8.6 fp32", fp32, trt86, base + dynShapes, PathFP32},
		{"8.6 fp16", fp16, trt86, base + dynShapes + " --fp16", PathFP16Flag},
		{"8.6 fp16 from fp16 onnx", fp16onnx, trt86, base + dynShapes + " --fp16", PathFP16Flag},
		{"8.6 int8 qdq", qdq, trt86, base + dynShapes + " --int8 --fp16", PathQDQFlags},
		{"8.6 int8 cache", cache, trt86, base + dynShapes + " --int8 --fp16 --calib=m.cache", PathCalibCache},
		{"8.4 int8 cache", cache, trt84, base + dynShapes + " --int8 --fp16 --calib=m.cache", PathCalibCache},
		// TensorRT 10: strongly typed when the model carries the types.
		{"10.3 fp32", fp32, trt103, base + dynShapes, PathFP32},
		{"10.3 fp16", fp16, trt103, base + dynShapes + " --fp16", PathFP16Flag},
		{"10.3 fp16 from fp16 onnx", fp16onnx, trt103, base + dynShapes + " --stronglyTyped", PathStronglyTyped},
		{"10.3 int8 qdq", qdq, trt103, base + dynShapes + " --stronglyTyped", PathStronglyTyped},
		{"10.3 int8 cache", cache, trt103, base + dynShapes + " --int8 --fp16 --calib=m.cache", PathCalibCache},
		// TensorRT 11: strongly typed only, no precision flags at all.
		{"11 fp32", fp32, trt11, base + dynShapes, PathFP32},
		{"11 fp16 from fp16 onnx", fp16onnx, trt11, base + dynShapes, PathStronglyTyped},
		{"11 int8 qdq", qdq, trt11, base + dynShapes, PathStronglyTyped},
		// Static shapes: no profile.
		{"10.3 static fp16", static, trt103, base + "--fp16", PathFP16Flag},
		{"int8 auto picks qdq", dynamicImage(Spec{Precision: manifest.INT8, ONNXIsQDQ: true}), trt103,
			base + dynShapes + " --stronglyTyped", PathStronglyTyped},
		{"int8 auto picks cache", dynamicImage(Spec{Precision: manifest.INT8, CalibCache: "c"}), trt86,
			base + dynShapes + " --int8 --fp16 --calib=c", PathCalibCache},
		{"opt batch", func() Spec { s := fp32; s.OptBatch = 4; return s }(), trt103,
			base + "--minShapes=images:1x3x224x224 --optShapes=images:4x3x224x224 --maxShapes=images:16x3x224x224", PathFP32},
		{"two inputs, one static, quoted name", Spec{ONNX: "m.onnx", Plan: "m.plan", Precision: manifest.FP32, MaxBatch: 8,
			Inputs: []InputShape{{Name: "input_1:0", Dims: []int64{-1, 3}}, {Name: "scale", Dims: []int64{1}}, {Name: "mask", Dims: []int64{-1, 7}}}},
			trt103, base + "--minShapes='input_1:0':1x3,mask:1x7 --optShapes='input_1:0':8x3,mask:8x7 --maxShapes='input_1:0':8x3,mask:8x7", PathFP32},
		// Build options and their per-version spelling.
		{"10.3 all options", func() Spec {
			s := fp16
			s.WorkspaceMiB, s.OptimizationLevel, s.TimingCache = 1024, intp(5), "t.cache"
			s.HardwareCompat, s.VersionCompatible, s.SkipInference = HardwareCompatAmperePlus, true, true
			s.LayerInfo, s.ExtraArgs = "layers.json", []string{"--noTF32"}
			return s
		}(), trt103, base + dynShapes + " --fp16 --memPoolSize=workspace:1024M --builderOptimizationLevel=5" +
			" --timingCacheFile=t.cache --hardwareCompatibilityLevel=ampere+ --versionCompatible" +
			" --profilingVerbosity=detailed --exportLayerInfo=layers.json --skipInference --noTF32", PathFP16Flag},
		{"8.4 workspace and build only", func() Spec {
			s := fp32
			s.WorkspaceMiB, s.SkipInference = 512, true
			return s
		}(), trt84, base + dynShapes + " --memPoolSize=workspace:512M --buildOnly", PathFP32},
		{"8.2 workspace and build only", func() Spec {
			s := fp32
			s.WorkspaceMiB, s.SkipInference = 512, true
			return s
		}(), trt82, base + dynShapes + " --workspace=512 --buildOnly", PathFP32},
		{"8.6 skipInference", func() Spec { s := fp32; s.SkipInference = true; return s }(), trt86,
			base + dynShapes + " --skipInference", PathFP32},
		{"hardware compat none is the default", func() Spec { s := fp32; s.HardwareCompat = HardwareCompatNone; return s }(),
			trt86, base + dynShapes, PathFP32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Args(tt.spec, tt.v)
			if err != nil {
				t.Fatalf("Args(%s, %v) error %v", tt.name, tt.v, err)
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("Args(%s, %v) =\n  %s\nwant\n  %s", tt.name, tt.v, g, tt.want)
			}
			path, err := PrecisionPathFor(tt.spec, tt.v)
			if err != nil || path != tt.wantPath {
				t.Errorf("PrecisionPathFor(%s, %v) = %q, %v, want %q", tt.name, tt.v, path, err, tt.wantPath)
			}
		})
	}
}

func TestArgsUnsupported(t *testing.T) {
	fp16 := dynamicImage(Spec{Precision: manifest.FP16})
	cache := dynamicImage(Spec{Precision: manifest.INT8, Int8Mode: Int8Cache, CalibCache: "m.cache"})
	tests := []struct {
		name string
		spec Spec
		v    manifest.TRTVersion
		want string
	}{
		{"11 fp16 from fp32 onnx", fp16, trt11,
			"TensorRT 11.0.0: TensorRT 11 builds fp16 only from an fp16 ONNX model; run the fp16 rewrite first"},
		{"11 int8 cache", cache, trt11,
			"TensorRT 11.0.0: TensorRT 11 has no calibration caches (--calib was removed); build int8 from a Q/DQ ONNX model"},
		{"7.1", fp16, manifest.TRTVersion{Major: 7, Minor: 1, Patch: 3}, "TensorRT 7.1.3: kiln drives trtexec from TensorRT 8.0 on"},
		{"opt level on 8.4", func() Spec { s := fp16; s.OptimizationLevel = intp(3); return s }(), trt84,
			"TensorRT 8.4.1: --builderOptimizationLevel needs TensorRT 8.6 or later"},
		{"version compatible on 8.4", func() Spec { s := fp16; s.VersionCompatible = true; return s }(), trt84,
			"TensorRT 8.4.1: --versionCompatible needs TensorRT 8.6 or later"},
		{"sameComputeCapability on 8.6", func() Spec { s := fp16; s.HardwareCompat = HardwareCompatSameCompute; return s }(), trt86,
			"TensorRT 8.6.1: --hardwareCompatibilityLevel=sameComputeCapability is not available in this release"},
	}
	for _, tt := range tests {
		_, err := Args(tt.spec, tt.v)
		var ue *UnsupportedError
		if !errors.As(err, &ue) {
			t.Errorf("Args(%s) error = %v, want *UnsupportedError", tt.name, err)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("Args(%s) error = %q, want %q", tt.name, err.Error(), tt.want)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	ok := dynamicImage(Spec{Precision: manifest.FP32})
	tests := []struct {
		name string
		edit func(*Spec)
		want string // substring of the error; "" for valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"no onnx", func(s *Spec) { s.ONNX = "" }, "no ONNX model given"},
		{"no plan", func(s *Spec) { s.Plan = "" }, "no plan output path given"},
		{"no precision", func(s *Spec) { s.Precision = "" }, "no precision given"},
		{"bad precision", func(s *Spec) { s.Precision = "bf16" }, `unknown precision "bf16"`},
		{"fp32 from fp16", func(s *Spec) { s.ONNXIsFP16 = true }, "fp32 engine requested from an fp16 or Q/DQ ONNX model"},
		{"qdq without qdq onnx", func(s *Spec) { s.Precision, s.Int8Mode = manifest.INT8, Int8QDQ },
			"int8 mode qdq needs a Q/DQ ONNX model"},
		{"cache without cache", func(s *Spec) { s.Precision, s.Int8Mode = manifest.INT8, Int8Cache },
			"int8 mode cache needs a calibration cache"},
		{"cache with qdq onnx", func(s *Spec) {
			s.Precision, s.Int8Mode, s.ONNXIsQDQ, s.CalibCache = manifest.INT8, Int8Cache, true, "c"
		},
			"int8 mode cache needs the fp32 ONNX model"},
		{"bad int8 mode", func(s *Spec) { s.Precision, s.Int8Mode = manifest.INT8, "minmax" }, `unknown int8 mode "minmax"`},
		{"dynamic without max batch", func(s *Spec) { s.MaxBatch = 0 },
			`input "images" has a dynamic batch dimension; set a max batch size`},
		{"opt above max", func(s *Spec) { s.OptBatch = 32 }, "opt batch 32 out of range 1..16"},
		{"dynamic inner dim", func(s *Spec) { s.Inputs[0].Dims = []int64{-1, 3, -1, 224} },
			`input "images": dimension 2 is -1; kiln makes only the first (batch) dimension dynamic`},
		{"max batch on static model", func(s *Spec) { s.Inputs[0].Dims = []int64{1, 3} },
			"max batch 16 needs an input with a dynamic first dimension"},
		{"comma in name", func(s *Spec) { s.Inputs[0].Name = "a,b" }, "cannot take shapes for names containing"},
		{"duplicate input", func(s *Spec) { s.Inputs = append(s.Inputs, s.Inputs[0]) }, `input "images" listed twice`},
		{"opt level", func(s *Spec) { s.OptimizationLevel = intp(7) }, "builder optimization level 7 out of range 0-5"},
		{"hardware compat", func(s *Spec) { s.HardwareCompat = "turing+" }, `unknown hardware compatibility level "turing+"`},
		{"extra sets saveEngine", func(s *Spec) { s.ExtraArgs = []string{"--saveEngine=x"} },
			`extra trtexec argument "--saveEngine=x": kiln sets --saveEngine itself`},
		{"extra not a flag", func(s *Spec) { s.ExtraArgs = []string{"fp16"} }, `extra trtexec argument "fp16" is not a flag`},
	}
	for _, tt := range tests {
		s := ok
		s.Inputs = append([]InputShape(nil), ok.Inputs...)
		s.Inputs[0].Dims = append([]int64(nil), ok.Inputs[0].Dims...)
		tt.edit(&s)
		err := s.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Validate(%s) = %v, want nil", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("Validate(%s) = %v, want error containing %q", tt.name, err, tt.want)
		}
	}
}
