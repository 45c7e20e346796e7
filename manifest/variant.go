package manifest

import (
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
