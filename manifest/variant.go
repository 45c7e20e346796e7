package manifest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Runtime is where a variant runs.
type Runtime string

// Runtimes.
const (
	RuntimeONNX Runtime = "onnx" // ONNX Runtime (Triton backend onnxruntime)
	RuntimeTRT  Runtime = "trt"  // TensorRT engine (Triton backend tensorrt)
)

// Precision is the numeric precision of a variant.
type Precision string

// Precisions.
const (
	FP32 Precision = "fp32"
	FP16 Precision = "fp16"
	INT8 Precision = "int8"
)

// ParseRuntime accepts "onnx"/"ort"/"onnxruntime" and "trt"/"tensorrt".
func ParseRuntime(s string) (Runtime, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "onnx", "ort", "onnxruntime":
		return RuntimeONNX, nil
	case "trt", "tensorrt":
		return RuntimeTRT, nil
	}
	return "", fmt.Errorf("unknown runtime %q (want onnx or trt)", s)
}

// ParsePrecision accepts fp32, fp16 and int8.
func ParsePrecision(s string) (Precision, error) {
	switch p := Precision(strings.ToLower(strings.TrimSpace(s))); p {
	case FP32, FP16, INT8:
		return p, nil
	}
	return "", fmt.Errorf("unknown precision %q (want fp32, fp16 or int8)", s)
}

// Variant is one way of deploying a model.
type Variant struct {
	Runtime   Runtime   `json:"runtime"`
	Precision Precision `json:"precision"`
	// MaxBatch is Triton's max_batch_size; 0 means the model's default.
	MaxBatch int `json:"max_batch,omitempty"`
	// Instances is the instance_group count; 0 and 1 both mean one instance.
	Instances int `json:"instances,omitempty"`
	// Target is an optional GPU target (compute capability such as "8.6").
	Target string `json:"target,omitempty"`
}

// Validate checks the fields.
func (v Variant) Validate() error {
	if _, err := ParseRuntime(string(v.Runtime)); err != nil {
		return err
	}
	if _, err := ParsePrecision(string(v.Precision)); err != nil {
		return err
	}
	if v.MaxBatch < 0 {
		return fmt.Errorf("max batch %d is negative", v.MaxBatch)
	}
	if v.Instances < 0 {
		return fmt.Errorf("instance count %d is negative", v.Instances)
	}
	return nil
}

// ParseComputeCapability reads a GPU compute capability written as "8.6",
// "86", "sm86" or "sm_86" and returns it as "major.minor" ("8.6"; "12.0"
// for sm120).
func ParseComputeCapability(s string) (string, error) {
	in := strings.TrimSpace(strings.ToLower(s))
	digits := strings.TrimPrefix(strings.TrimPrefix(in, "sm"), "_")
	major, minor, dotted := strings.Cut(digits, ".")
	if !dotted {
		if len(digits) < 2 {
			major = ""
		} else {
			major, minor = digits[:len(digits)-1], digits[len(digits)-1:]
		}
	}
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || ma < 1 || ma > 99 || mi < 0 || mi > 9 || strings.ContainsAny(major+minor, "+-") {
		return "", fmt.Errorf("compute capability %q: want major.minor like 8.6, or sm86", s)
	}
	return fmt.Sprintf("%d.%d", ma, mi), nil
}

// ParseVariant reads a variant ID such as "trt-int8-b16-x4" (the form ID
// prints; '_' works as a separator too): runtime, precision, then optional
// b<max batch>, x<instances> and sm<compute capability>.
func ParseVariant(id string) (Variant, error) {
	parts := strings.FieldsFunc(strings.ToLower(id), func(r rune) bool { return r == '-' || r == '_' })
	if len(parts) < 2 {
		return Variant{}, fmt.Errorf("variant %q: want <runtime>-<precision>[-b<max batch>][-x<instances>][-sm<cc>], e.g. trt-int8-b16-x4", id)
	}
	r, err := ParseRuntime(parts[0])
	if err != nil {
		return Variant{}, fmt.Errorf("variant %q: %w", id, err)
	}
	p, err := ParsePrecision(parts[1])
	if err != nil {
		return Variant{}, fmt.Errorf("variant %q: %w", id, err)
	}
	v := Variant{Runtime: r, Precision: p}
	for _, part := range parts[2:] {
		var err error
		switch {
		case strings.HasPrefix(part, "b"):
			v.MaxBatch, err = strconv.Atoi(part[1:])
		case strings.HasPrefix(part, "x"):
			v.Instances, err = strconv.Atoi(part[1:])
		case strings.HasPrefix(part, "sm") && len(part) >= 4:
			v.Target, err = ParseComputeCapability(part)
		default:
			err = errors.New("unknown part")
		}
		if err != nil || v.MaxBatch < 0 || v.Instances < 0 {
			return Variant{}, fmt.Errorf("variant %q: cannot read %q (want b<max batch>, x<instances> or sm<compute capability>)", id, part)
		}
	}
	return v.normal(), nil
}

// NewVariant builds a variant from its parts as a user writes them (a
// pipeline file's mapping): runtime and precision names, max batch (0: the
// model's default), instances (0 or 1: one) and an optional compute
// capability ("8.6", "sm86"). It is checked, and one instance is written
// as 0 so that equal variants compare equal.
func NewVariant(runtime, precision string, maxBatch, instances int, target string) (Variant, error) {
	r, err := ParseRuntime(runtime)
	if err != nil {
		return Variant{}, err
	}
	p, err := ParsePrecision(precision)
	if err != nil {
		return Variant{}, err
	}
	v := Variant{Runtime: r, Precision: p, MaxBatch: maxBatch, Instances: instances}
	if target != "" {
		if v.Target, err = ParseComputeCapability(target); err != nil {
			return Variant{}, err
		}
	}
	if err := v.Validate(); err != nil {
		return Variant{}, err
	}
	return v.normal(), nil
}

// normal writes one instance as 0, so that equal variants compare equal.
func (v Variant) normal() Variant {
	if v.Instances == 1 {
		v.Instances = 0
	}
	return v
}

// ID is the variant's stable identifier, e.g. "trt-int8-b16-x4".
func (v Variant) ID() string {
	return strings.ReplaceAll(v.suffix(), "_", "-")
}

func (v Variant) suffix() string {
	s := string(v.Runtime) + "_" + string(v.Precision)
	if v.MaxBatch > 0 {
		s += "_b" + strconv.Itoa(v.MaxBatch)
	}
	if v.Instances > 1 {
		s += "_x" + strconv.Itoa(v.Instances)
	}
	if v.Target != "" {
		s += "_sm" + strings.ReplaceAll(v.Target, ".", "")
	}
	return s
}

// ModelName is the Triton model name of this variant of model:
// <model>_<runtime>_<precision>[_b<maxbatch>][_x<instances>], e.g. resnet50_trt_int8_b16_x4.
func (v Variant) ModelName(model string) string {
	return model + "_" + v.suffix()
}
