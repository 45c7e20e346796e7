package trtexec

import (
	"fmt"
	"strconv"

	"github.com/kiln-ml/kiln/manifest"
)

// PrecisionPath records how an engine got its precision, for provenance.
type PrecisionPath string

// The ways kiln asks trtexec for a precision.
const (
	// PathFP32 is a plain build: no precision flags (TF32 stays on, as is
	// trtexec's default).
	PathFP32 PrecisionPath = "fp32"
	// PathFP16Flag is --fp16 on the fp32 model (weakly typed; TensorRT <= 10).
	PathFP16Flag PrecisionPath = "fp16-flag"
	// PathStronglyTyped takes every type from the ONNX model (an fp16 or
	// Q/DQ model): --stronglyTyped on TensorRT 10, the default on 11.
	PathStronglyTyped PrecisionPath = "strongly-typed"
	// PathQDQFlags is a Q/DQ model built with --int8 --fp16 (TensorRT 8-9).
	PathQDQFlags PrecisionPath = "int8-qdq-flags"
	// PathCalibCache is implicit quantization from a calibration cache:
	// --int8 --fp16 --calib (TensorRT 8-10).
	PathCalibCache PrecisionPath = "int8-calib-cache"
	// PathRandomRanges is --int8 --fp16 without a cache: trtexec's
	// placeholder ranges, for performance-only engines (TensorRT 8-10).
	PathRandomRanges PrecisionPath = "int8-random-ranges"
)

// UnsupportedError reports a build the TensorRT release cannot do.
type UnsupportedError struct {
	Version manifest.TRTVersion
	// Reason says what is missing and what to do instead.
	Reason string
}

// Error names the release and the reason.
func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("TensorRT %s: %s", e.Version, e.Reason)
}

// MinTRT is the oldest TensorRT release kiln drives: older trtexec lacks
// the shape and timing-cache flags kiln uses, and calibration caches and
// plans from 7.x are not worth supporting.
var MinTRT = manifest.TRTVersion{Major: 8}

// Args returns the trtexec arguments (without the program name) that build
// spec with TensorRT v; PrecisionPathFor says which path they take. A build
// the release cannot do gives an *UnsupportedError. The choices, with their
// sources:
//
//	                 8.x / 9.x                10.x                      11+
//	fp32             (none)                   (none)                    (none)
//	fp16, fp32 ONNX  --fp16                   --fp16                    refused: needs an fp16 ONNX
//	fp16, fp16 ONNX  --fp16                   --stronglyTyped           (none: strongly typed)
//	int8 qdq         --int8 --fp16            --stronglyTyped           (none: strongly typed)
//	int8 cache       --int8 --fp16 --calib=C  --int8 --fp16 --calib=C   refused: no --calib
//	int8 random      --int8 --fp16            --int8 --fp16             refused: no --int8
//
// --fp16 with int8 lets layers without scales run in fp16 instead of fp32
// (reference/formats.md §3.2, §7.4). TensorRT 10 says of Q/DQ models "use
// explicit quantization with Strong Typing; precision-control build flags
// are not required and should not be specified" (formats.md §3.2), and its
// --help marks --fp16/--int8/--best deprecated and superseded by strong
// typing (corpus trt10.16_trtexec_help.txt). TensorRT 11 removed
// --fp16, --int8, --calib and --best (DESIGN.md); networks are strongly
// typed, so the ONNX model must carry the precision.
//
// Version-dependent spellings, from the corpus and the trtexec sources
// (NVIDIA/TensorRT samples/common/sampleOptions.cpp):
//   - workspace: --workspace=N (MiB) before 8.4; --memPoolSize=workspace:NM
//     from 8.4 (8.4 reads the number with stod, so "M" is ignored there;
//     10.x reads the suffix: the corpus log trt10.16_result-02 shows
//     "workspace:1024MiB" taken as 1024 bytes, so kiln writes "M", never "MiB").
//   - skipping the benchmark: --buildOnly up to 8.5 (8.0-8.4 sources parse
//     only --buildOnly; trt8.4_result logs print "Build only:"); --skipInference
//     from 8.6 (a 2023 source accepts both, --buildOnly deprecated; the 10.16
//     --help lists only --skipInference).
//   - --builderOptimizationLevel, --hardwareCompatibilityLevel and
//     --versionCompatible: TensorRT 8.6+; sameComputeCapability is listed in
//     the 10.16 --help, so kiln asks for 10+ (not verified for 10.0-10.15).
//   - --exportLayerInfo and --profilingVerbosity=detailed: present in the
//     8.2-era source; kiln asks for 8.2+.
func Args(spec Spec, v manifest.TRTVersion) ([]string, error) {
	args, _, err := buildArgs(spec, v)
	return args, err
}

// PrecisionPathFor returns how Args(spec, v) asks for the precision.
func PrecisionPathFor(spec Spec, v manifest.TRTVersion) (PrecisionPath, error) {
	_, path, err := buildArgs(spec, v)
	return path, err
}

func buildArgs(spec Spec, v manifest.TRTVersion) ([]string, PrecisionPath, error) {
	if err := spec.Validate(); err != nil {
		return nil, "", err
	}
	if v.Less(MinTRT) {
		return nil, "", unsupported(v, "kiln drives trtexec from TensorRT %d.0 on", MinTRT.Major)
	}
	args := []string{"--onnx=" + spec.ONNX, "--saveEngine=" + spec.Plan}
	prof, _ := spec.profile() // checked by Validate
	if prof.min != "" {
		args = append(args, "--minShapes="+prof.min, "--optShapes="+prof.opt, "--maxShapes="+prof.max)
	}
	path, flags, err := precisionArgs(spec, v)
	if err != nil {
		return nil, "", err
	}
	args = append(args, flags...)
	opts, err := builderFlags(spec, v)
	if err != nil {
		return nil, "", err
	}
	args = append(args, opts...)
	args = append(args, spec.ExtraArgs...)
	return args, path, nil
}

func unsupported(v manifest.TRTVersion, format string, a ...any) error {
	return &UnsupportedError{Version: v, Reason: fmt.Sprintf(format, a...)}
}

// precisionArgs chooses the precision path and its flags (the table of Args).
func precisionArgs(spec Spec, v manifest.TRTVersion) (PrecisionPath, []string, error) {
	switch {
	case spec.Precision == manifest.FP32:
		return PathFP32, nil, nil
	case v.Major >= 11:
		switch {
		case spec.Precision == manifest.FP16 && !spec.ONNXIsFP16:
			return "", nil, unsupported(v, "TensorRT 11 builds fp16 only from an fp16 ONNX model; run the fp16 rewrite first")
		case spec.Precision == manifest.INT8 && spec.int8Mode() == Int8Cache:
			return "", nil, unsupported(v, "TensorRT 11 has no calibration caches (--calib was removed); build int8 from a Q/DQ ONNX model")
		case spec.Precision == manifest.INT8 && spec.int8Mode() == Int8Random:
			return "", nil, unsupported(v, "TensorRT 11 has no --int8 flag, so it cannot build engines with placeholder ranges; calibrate and build from the Q/DQ ONNX model")
		}
		return PathStronglyTyped, nil, nil
	case spec.Precision == manifest.FP16:
		if v.Major == 10 && spec.ONNXIsFP16 {
			return PathStronglyTyped, []string{"--stronglyTyped"}, nil
		}
		return PathFP16Flag, []string{"--fp16"}, nil
	case spec.int8Mode() == Int8QDQ:
		if v.Major == 10 {
			return PathStronglyTyped, []string{"--stronglyTyped"}, nil
		}
		return PathQDQFlags, []string{"--int8", "--fp16"}, nil
	case spec.int8Mode() == Int8Random:
		return PathRandomRanges, []string{"--int8", "--fp16"}, nil
	}
	// int8 from a calibration cache, TensorRT 8-10
	return PathCalibCache, []string{"--int8", "--fp16", "--calib=" + spec.CalibCache}, nil
}

// builderFlags spells the build settings the way release v reads them.
func builderFlags(spec Spec, v manifest.TRTVersion) ([]string, error) {
	var args []string
	if spec.WorkspaceMiB > 0 {
		if v.AtLeast(8, 4) {
			args = append(args, "--memPoolSize=workspace:"+strconv.Itoa(spec.WorkspaceMiB)+"M")
		} else {
			args = append(args, "--workspace="+strconv.Itoa(spec.WorkspaceMiB))
		}
	}
	if spec.OptimizationLevel != nil {
		if !v.AtLeast(8, 6) {
			return nil, unsupported(v, "--builderOptimizationLevel needs TensorRT 8.6 or later")
		}
		args = append(args, "--builderOptimizationLevel="+strconv.Itoa(*spec.OptimizationLevel))
	}
	if spec.TimingCache != "" {
		args = append(args, "--timingCacheFile="+spec.TimingCache)
	}
	if hc := spec.HardwareCompat; hc != "" && hc != HardwareCompatNone {
		if !v.AtLeast(8, 6) || (hc == HardwareCompatSameCompute && v.Major < 10) {
			return nil, unsupported(v, "--hardwareCompatibilityLevel=%s is not available in this release", hc)
		}
		args = append(args, "--hardwareCompatibilityLevel="+string(hc))
	}
	if spec.VersionCompatible {
		if !v.AtLeast(8, 6) {
			return nil, unsupported(v, "--versionCompatible needs TensorRT 8.6 or later")
		}
		args = append(args, "--versionCompatible")
	}
	if spec.LayerInfo != "" {
		if !v.AtLeast(8, 2) {
			return nil, unsupported(v, "--exportLayerInfo needs TensorRT 8.2 or later")
		}
		args = append(args, "--profilingVerbosity=detailed", "--exportLayerInfo="+spec.LayerInfo)
	}
	if spec.SkipInference {
		if v.AtLeast(8, 6) {
			args = append(args, "--skipInference")
		} else {
			args = append(args, "--buildOnly")
		}
	}
	return args, nil
}
