// Package kserve serves models over the KServe v2 REST protocol and calls
// servers that speak it.
//
// It follows the Open Inference Protocol (github.com/kserve/open-inference-protocol,
// specification/protocol/inference_rest.md, whose OpenAPI form is
// open_inference_rest.yaml) and three of Triton's extensions to it, as
// triton-inference-server/server docs/protocol describes them: binary tensor
// data (extension_binary_data.md), the index call of the model repository
// extension (extension_model_repository.md), and the per-model Prometheus
// metrics of docs/user_guide/metrics.md, with Triton's names and labels.
// Model metadata reports shapes as Triton does: with a leading -1 for the
// batch dimension when a model batches.
//
// Server runs local models (anything with a Runner) with dynamic batching;
// Client calls kiln's server or a real Triton, and ModelRunner turns a
// remote model back into a Runner so that it can be checked like a local one.
package kserve

import (
	"fmt"
	"sort"

	"github.com/kiln-ml/kiln/onnx"
)

// datatypes maps KServe v2 tensor datatype names to ONNX element types.
// BF16 is Triton's addition; BYTES holds arbitrary byte strings.
var datatypes = map[string]onnx.DataType{
	"BOOL": onnx.Bool, "UINT8": onnx.Uint8, "UINT16": onnx.Uint16, "UINT32": onnx.Uint32,
	"UINT64": onnx.Uint64, "INT8": onnx.Int8, "INT16": onnx.Int16, "INT32": onnx.Int32,
	"INT64": onnx.Int64, "FP16": onnx.Float16, "FP32": onnx.Float, "FP64": onnx.Double,
	"BF16": onnx.BFloat16, "BYTES": onnx.String,
}

// datatypeNames is the inverse of datatypes.
var datatypeNames = func() map[onnx.DataType]string {
	m := make(map[onnx.DataType]string, len(datatypes))
	for name, dt := range datatypes {
		m[dt] = name
	}
	return m
}()

// ParseDatatype returns the ONNX element type of a KServe v2 datatype name
// such as "FP32" or "BYTES".
func ParseDatatype(name string) (onnx.DataType, error) {
	dt, ok := datatypes[name]
	if !ok {
		return onnx.Undefined, fmt.Errorf("unknown datatype %q (want one of %s)", name, datatypeList())
	}
	return dt, nil
}

// Datatype returns the KServe v2 datatype name of an ONNX element type, or
// an error for the types the protocol has no name for (complex, float8, 4-bit).
func Datatype(dt onnx.DataType) (string, error) {
	name, ok := datatypeNames[dt]
	if !ok {
		return "", fmt.Errorf("element type %s has no KServe v2 datatype", dt)
	}
	return name, nil
}

func datatypeList() string {
	names := make([]string, 0, len(datatypes))
	for n := range datatypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return fmt.Sprint(names)
}

// ServerMetadata is the body of GET /v2.
type ServerMetadata struct {
	Name       string   `json:"name"`
	Version    string   `json:"version"`
	Extensions []string `json:"extensions"`
}

// ModelMetadata is the body of GET /v2/models/{model}[/versions/{version}].
type ModelMetadata struct {
	Name     string       `json:"name"`
	Versions []string     `json:"versions,omitempty"`
	Platform string       `json:"platform"`
	Inputs   []TensorMeta `json:"inputs"`
	Outputs  []TensorMeta `json:"outputs"`
}

// TensorMeta describes one input or output of a model: its name, KServe
// datatype name and shape, -1 standing for a dimension of any size.
type TensorMeta struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

// RepositoryModel is one entry of Triton's repository index
// (POST /v2/repository/index).
type RepositoryModel struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	State   string `json:"state,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Request is a decoded inference request.
type Request struct {
	// ID is echoed in the response.
	ID string
	// Inputs are the input tensors in request order.
	Inputs []*onnx.Tensor
	// Outputs are the requested outputs; none means every output.
	Outputs []OutputRequest
	// BinaryOutput is the binary_data_output parameter: return outputs
	// that do not say otherwise as binary data.
	BinaryOutput bool
	// Parameters are the request's other parameters, numbers as json.Number.
	Parameters map[string]any
}

// OutputRequest is one entry of a request's outputs.
type OutputRequest struct {
	Name string
	// Binary is whether the output comes back as binary data: its
	// binary_data parameter, else the request's binary_data_output.
	Binary bool
	// Parameters are the output's other parameters (classification, ...).
	Parameters map[string]any
}

// Response is a decoded inference response.
type Response struct {
	ModelName    string
	ModelVersion string
	ID           string
	Outputs      []*onnx.Tensor
}

// errorBody is the JSON error object every failing call returns.
type errorBody struct {
	Error string `json:"error"`
}
