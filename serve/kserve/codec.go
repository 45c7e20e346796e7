package kserve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/kiln-ml/kiln/onnx"
)

// The parameters of Triton's binary tensor data extension.
const (
	paramBinarySize   = "binary_data_size"
	paramBinary       = "binary_data"
	paramBinaryOutput = "binary_data_output"
)

// HeaderContentLength is the HTTP header that gives the length of the JSON
// part of a body followed by binary tensor data.
const HeaderContentLength = "Inference-Header-Content-Length"

// wireRequest is the JSON of an inference request ($inference_request).
type wireRequest struct {
	ID         string                     `json:"id,omitempty"`
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
	Inputs     []wireTensor               `json:"inputs"`
	Outputs    []wireOutput               `json:"outputs,omitempty"`
}

// wireTensor is a $request_input or a $response_output.
type wireTensor struct {
	Name       string                     `json:"name"`
	Shape      []int64                    `json:"shape"`
	Datatype   string                     `json:"datatype"`
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
	Data       json.RawMessage            `json:"data,omitempty"`
}

// wireOutput is a $request_output.
type wireOutput struct {
	Name       string                     `json:"name"`
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
}

// wireResponse is the JSON of an inference response ($inference_response).
type wireResponse struct {
	ModelName    string       `json:"model_name"`
	ModelVersion string       `json:"model_version,omitempty"`
	ID           string       `json:"id,omitempty"`
	Outputs      []wireTensor `json:"outputs"`
}

// DecodeRequest decodes an inference request body. headerLength is the
// value of the Inference-Header-Content-Length header, or negative when the
// header is absent and the whole body is JSON. Decoding is strict: the JSON
// must be valid, every tensor's data must match its shape and datatype, and
// binary data must be exactly as long as the binary_data_size parameters say.
func DecodeRequest(body []byte, headerLength int) (*Request, error) {
	js, bin, err := splitBody(body, headerLength)
	if err != nil {
		return nil, err
	}
	var w wireRequest
	if err := json.Unmarshal(js, &w); err != nil {
		return nil, fmt.Errorf("parsing request JSON: %w", jsonError(js, err))
	}
	req := &Request{ID: w.ID}
	if req.Parameters, err = anyParams(w.Parameters); err != nil {
		return nil, fmt.Errorf("request parameters: %w", err)
	}
	if v, ok := req.Parameters[paramBinaryOutput]; ok {
		b, isBool := v.(bool)
		if !isBool {
			return nil, fmt.Errorf("request parameter %s is %v, want true or false", paramBinaryOutput, v)
		}
		req.BinaryOutput = b
		delete(req.Parameters, paramBinaryOutput)
	}
	if len(w.Inputs) == 0 {
		return nil, errors.New("request has no inputs")
	}
	if req.Inputs, err = decodeTensors("input", w.Inputs, bin); err != nil {
		return nil, err
	}
	if req.Outputs, err = decodeOutputs(w.Outputs, req.BinaryOutput); err != nil {
		return nil, err
	}
	return req, nil
}

// DecodeResponse decodes an inference response body; headerLength is as
// for DecodeRequest.
func DecodeResponse(body []byte, headerLength int) (*Response, error) {
	js, bin, err := splitBody(body, headerLength)
	if err != nil {
		return nil, err
	}
	var w wireResponse
	if err := json.Unmarshal(js, &w); err != nil {
		return nil, fmt.Errorf("parsing response JSON: %w", jsonError(js, err))
	}
	outs, err := decodeTensors("output", w.Outputs, bin)
	if err != nil {
		return nil, err
	}
	return &Response{ModelName: w.ModelName, ModelVersion: w.ModelVersion, ID: w.ID, Outputs: outs}, nil
}

// decodeTensors decodes the inputs or outputs of a body, taking binary data
// from bin in their order; all of bin must be used.
func decodeTensors(kind string, ws []wireTensor, bin []byte) ([]*onnx.Tensor, error) {
	out := make([]*onnx.Tensor, 0, len(ws))
	seen := make(map[string]bool, len(ws))
	for i, w := range ws {
		if w.Name == "" {
			return nil, fmt.Errorf("%ss[%d]: no name", kind, i)
		}
		if seen[w.Name] {
			return nil, fmt.Errorf("%s %q appears twice", kind, w.Name)
		}
		seen[w.Name] = true
		t, rest, err := decodeTensor(w, bin)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", kind, w.Name, err)
		}
		bin = rest
		out = append(out, t)
	}
	if len(bin) > 0 {
		return nil, fmt.Errorf("%d bytes of binary data are left after the last %s", len(bin), kind)
	}
	return out, nil
}

// decodeTensor decodes one tensor from its JSON data or from the front of
// bin, returning the rest of bin.
func decodeTensor(w wireTensor, bin []byte) (*onnx.Tensor, []byte, error) {
	if w.Datatype == "" {
		return nil, nil, errors.New("no datatype")
	}
	dt, err := ParseDatatype(w.Datatype)
	if err != nil {
		return nil, nil, err
	}
	if w.Shape == nil {
		return nil, nil, errors.New("no shape")
	}
	if _, ok := w.Parameters["shared_memory_region"]; ok {
		return nil, nil, errors.New("the shared memory extension is not supported: send the data in the body")
	}
	rawSize, isBinary := w.Parameters[paramBinarySize]
	if !isBinary {
		if len(w.Data) == 0 {
			return nil, nil, errors.New("no data and no binary_data_size")
		}
		t, err := decodeJSONData(w.Name, dt, w.Shape, w.Data)
		return t, bin, err
	}
	if len(w.Data) > 0 {
		return nil, nil, errors.New("has both data and binary_data_size")
	}
	size, err := strconv.ParseInt(string(bytes.TrimSpace(rawSize)), 10, 64)
	if err != nil || size < 0 {
		return nil, nil, fmt.Errorf("binary_data_size %s is not a byte count", rawSize)
	}
	if size > int64(len(bin)) {
		return nil, nil, fmt.Errorf("binary_data_size is %d but only %d bytes of binary data are left (truncated binary data)", size, len(bin))
	}
	t, err := decodeBinary(w.Name, dt, w.Shape, bin[:size])
	return t, bin[size:], err
}

// decodeOutputs reads the requested outputs; binaryDefault is the request's
// binary_data_output.
func decodeOutputs(ws []wireOutput, binaryDefault bool) ([]OutputRequest, error) {
	var out []OutputRequest
	seen := map[string]bool{}
	for i, w := range ws {
		if w.Name == "" {
			return nil, fmt.Errorf("outputs[%d]: no name", i)
		}
		if seen[w.Name] {
			return nil, fmt.Errorf("output %q is requested twice", w.Name)
		}
		seen[w.Name] = true
		params, err := anyParams(w.Parameters)
		if err != nil {
			return nil, fmt.Errorf("output %q parameters: %w", w.Name, err)
		}
		o := OutputRequest{Name: w.Name, Binary: binaryDefault, Parameters: params}
		if v, ok := params[paramBinary]; ok {
			b, isBool := v.(bool)
			if !isBool {
				return nil, fmt.Errorf("output %q: parameter %s is %v, want true or false", w.Name, paramBinary, v)
			}
			o.Binary = b
			delete(params, paramBinary)
		}
		if len(params) == 0 {
			o.Parameters = nil
		}
		out = append(out, o)
	}
	return out, nil
}

// anyParams decodes parameter values, numbers as json.Number.
func anyParams(raw map[string]json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	out := make(map[string]any, len(raw))
	for k, v := range raw {
		d := json.NewDecoder(bytes.NewReader(v))
		d.UseNumber()
		var x any
		if err := d.Decode(&x); err != nil {
			return nil, fmt.Errorf("parameter %q: %w", k, err)
		}
		out[k] = x
	}
	return out, nil
}

// EncodeRequest encodes r as a request body, its inputs as binary data when
// binary is set. headerLength is the length of the JSON part: when it is
// less than len(body), binary data follows and the caller must send it as
// the Inference-Header-Content-Length header.
func EncodeRequest(r *Request, binary bool) (body []byte, headerLength int, err error) {
	w := wireRequest{ID: r.ID, Inputs: make([]wireTensor, 0, len(r.Inputs))}
	params := map[string]any{}
	for k, v := range r.Parameters {
		params[k] = v
	}
	if r.BinaryOutput {
		params[paramBinaryOutput] = true
	}
	if w.Parameters, err = rawParams(params); err != nil {
		return nil, 0, fmt.Errorf("encoding request parameters: %w", err)
	}
	var tail [][]byte
	for _, t := range r.Inputs {
		wt, raw, err := encodeTensor(t, binary)
		if err != nil {
			return nil, 0, fmt.Errorf("encoding input %q: %w", t.Name, err)
		}
		w.Inputs = append(w.Inputs, wt)
		tail = appendNonNil(tail, raw)
	}
	for _, o := range r.Outputs {
		p := map[string]any{}
		for k, v := range o.Parameters {
			p[k] = v
		}
		if o.Binary || r.BinaryOutput {
			p[paramBinary] = o.Binary
		}
		rp, err := rawParams(p)
		if err != nil {
			return nil, 0, fmt.Errorf("encoding output %q parameters: %w", o.Name, err)
		}
		w.Outputs = append(w.Outputs, wireOutput{Name: o.Name, Parameters: rp})
	}
	return joinBody(w, tail)
}

// EncodeResponse encodes r as a response body, the outputs binary names
// as binary data; headerLength is as for EncodeRequest.
func EncodeResponse(r *Response, binary map[string]bool) (body []byte, headerLength int, err error) {
	w := wireResponse{ModelName: r.ModelName, ModelVersion: r.ModelVersion, ID: r.ID,
		Outputs: make([]wireTensor, 0, len(r.Outputs))}
	var tail [][]byte
	for _, t := range r.Outputs {
		wt, raw, err := encodeTensor(t, binary[t.Name])
		if err != nil {
			return nil, 0, fmt.Errorf("encoding output %q: %w", t.Name, err)
		}
		w.Outputs = append(w.Outputs, wt)
		tail = appendNonNil(tail, raw)
	}
	return joinBody(w, tail)
}

func appendNonNil(tail [][]byte, raw []byte) [][]byte {
	if raw != nil {
		tail = append(tail, raw)
	}
	return tail
}

// joinBody marshals the JSON part and appends the binary data.
func joinBody(w any, tail [][]byte) ([]byte, int, error) {
	js, err := json.Marshal(w)
	if err != nil {
		return nil, 0, fmt.Errorf("encoding JSON: %w", err)
	}
	n := len(js)
	for _, b := range tail {
		n += len(b)
	}
	body := make([]byte, 0, n)
	body = append(body, js...)
	for _, b := range tail {
		body = append(body, b...)
	}
	return body, len(js), nil
}

// encodeTensor returns the JSON of t and, when binary, its binary data
// (non-nil even when empty, so that an empty tensor is still binary).
func encodeTensor(t *onnx.Tensor, binary bool) (wireTensor, []byte, error) {
	if err := checkTensor(t); err != nil {
		return wireTensor{}, nil, err
	}
	name, err := Datatype(t.Type)
	if err != nil {
		return wireTensor{}, nil, err
	}
	w := wireTensor{Name: t.Name, Shape: t.Dims, Datatype: name}
	if w.Shape == nil {
		w.Shape = []int64{}
	}
	if binary {
		raw := encodeBinary(t)
		w.Parameters = map[string]json.RawMessage{paramBinarySize: strconv.AppendInt(nil, int64(len(raw)), 10)}
		return w, raw, nil
	}
	if w.Data, err = encodeJSONData(t); err != nil {
		return wireTensor{}, nil, err
	}
	return w, nil, nil
}

func rawParams(p map[string]any) (map[string]json.RawMessage, error) {
	if len(p) == 0 {
		return nil, nil
	}
	out := make(map[string]json.RawMessage, len(p))
	for k, v := range p {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %w", k, err)
		}
		out[k] = b
	}
	return out, nil
}

// checkTensor checks that t's data is the Go slice its type calls for and
// has as many elements as its shape.
func checkTensor(t *onnx.Tensor) error {
	u, err := onnx.NewTensor(t.Name, t.Dims, t.Data)
	if err != nil {
		return err
	}
	if u.Type != t.Type {
		return fmt.Errorf("tensor of type %s holds %T", t.Type, t.Data)
	}
	return nil
}

// jsonError adds the line and column to a syntax error and names the field
// of a type error.
func jsonError(js []byte, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		at, line, col := position(js, se.Offset)
		return fmt.Errorf("%s at line %d, column %d (byte %d)", se.Error(), line, col, at)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "the body"
		}
		return fmt.Errorf("%s: JSON %s where %s is expected (byte %d)", field, te.Value, te.Type, te.Offset)
	}
	return err
}

// position finds the byte that broke the syntax (a syntax error's offset
// is just past it): its 0-based index and 1-based line and column.
func position(js []byte, off int64) (at int64, line, col int) {
	at = min(off, int64(len(js)))
	if at > 0 {
		at--
	}
	before := js[:at]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(at) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return at, line, col
}

// splitBody cuts a body into its JSON and binary parts.
func splitBody(body []byte, headerLength int) (js, bin []byte, err error) {
	if headerLength < 0 {
		return body, nil, nil
	}
	if headerLength > len(body) {
		return nil, nil, fmt.Errorf("%s is %d but the body has only %d bytes (truncated body)", HeaderContentLength, headerLength, len(body))
	}
	return body[:headerLength], body[headerLength:], nil
}
