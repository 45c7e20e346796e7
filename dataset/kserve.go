package dataset

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// kserveTypes maps KServe v2 tensor data types to ONNX types.
var kserveTypes = map[string]onnx.DataType{
	"BOOL": onnx.Bool, "UINT8": onnx.Uint8, "UINT16": onnx.Uint16, "UINT32": onnx.Uint32,
	"UINT64": onnx.Uint64, "INT8": onnx.Int8, "INT16": onnx.Int16, "INT32": onnx.Int32,
	"INT64": onnx.Int64, "FP16": onnx.Float16, "FP32": onnx.Float, "FP64": onnx.Double,
	"BF16": onnx.BFloat16, "BYTES": onnx.String,
}

// requestInput is one tensor of a KServe v2 inference request.
type requestInput struct {
	Name       string         `json:"name"`
	Shape      []int64        `json:"shape"`
	Datatype   string         `json:"datatype"`
	Parameters map[string]any `json:"parameters"`
	Data       any            `json:"data"`
}

// ParseRequest reads a KServe v2 inference request body
// ({"inputs": [{"name", "shape", "datatype", "data"}, ...]}) into tensors
// keyed by input name. data may be flat or nested (row-major). The binary
// data extension is not supported.
func ParseRequest(body []byte) (map[string]*onnx.Tensor, error) {
	var req struct {
		Inputs []requestInput `json:"inputs"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return nil, err
	}
	if len(req.Inputs) == 0 {
		return nil, errors.New("request has no inputs")
	}
	out := map[string]*onnx.Tensor{}
	for i, in := range req.Inputs {
		if in.Name == "" {
			return nil, fmt.Errorf("inputs[%d]: no name", i)
		}
		if _, dup := out[in.Name]; dup {
			return nil, fmt.Errorf("input %q appears twice", in.Name)
		}
		if _, ok := in.Parameters["binary_data_size"]; ok {
			return nil, fmt.Errorf("input %q: the binary data extension is not supported: send JSON data", in.Name)
		}
		dt, ok := kserveTypes[in.Datatype]
		if !ok {
			return nil, fmt.Errorf("input %q: unknown datatype %q", in.Name, in.Datatype)
		}
		if in.Shape == nil {
			return nil, fmt.Errorf("input %q: no shape", in.Name)
		}
		var vals []any
		flatten(in.Data, &vals)
		t, err := jsonTensor(in.Name, dt, in.Shape, vals)
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", in.Name, err)
		}
		out[in.Name] = t
	}
	return out, nil
}

func decodeJSON(body []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("parsing JSON: %w", err)
	}
	if d.More() {
		return errors.New("parsing JSON: text after the JSON value")
	}
	return nil
}

// flatten appends the leaves of nested JSON arrays in row-major order.
func flatten(v any, out *[]any) {
	if a, ok := v.([]any); ok {
		for _, e := range a {
			flatten(e, out)
		}
		return
	}
	*out = append(*out, v)
}

// nestedShape is the shape of nested JSON arrays (by their first elements).
func nestedShape(v any) []int64 {
	var dims []int64
	for {
		a, ok := v.([]any)
		if !ok {
			return dims
		}
		dims = append(dims, int64(len(a)))
		if len(a) == 0 {
			return dims
		}
		v = a[0]
	}
}

// jsonTensor converts JSON values to a tensor of type dt and shape dims.
func jsonTensor(name string, dt onnx.DataType, dims []int64, vals []any) (*onnx.Tensor, error) {
	n, err := onnx.NumElements(dims)
	if err != nil {
		return nil, err
	}
	if len(vals) != n {
		return nil, fmt.Errorf("%d values for shape %v (want %d)", len(vals), dims, n)
	}
	var data any
	switch dt {
	case onnx.Float:
		data, err = convertJSON(vals, floatOf(func(f float64) float32 { return float32(f) }))
	case onnx.Double:
		data, err = convertJSON(vals, floatOf(func(f float64) float64 { return f }))
	case onnx.Float16:
		data, err = convertJSON(vals, floatOf(func(f float64) float16.Float16 { return float16.Fromfloat32(float32(f)) }))
	case onnx.BFloat16:
		data, err = convertJSON(vals, floatOf(func(f float64) onnx.BF16 { return onnx.BF16From(float32(f)) }))
	case onnx.Int8:
		data, err = convertJSON(vals, intOf[int8](math.MinInt8, math.MaxInt8))
	case onnx.Int16:
		data, err = convertJSON(vals, intOf[int16](math.MinInt16, math.MaxInt16))
	case onnx.Int32:
		data, err = convertJSON(vals, intOf[int32](math.MinInt32, math.MaxInt32))
	case onnx.Int64:
		data, err = convertJSON(vals, intOf[int64](math.MinInt64, math.MaxInt64))
	case onnx.Uint8:
		data, err = convertJSON(vals, intOf[uint8](0, math.MaxUint8))
	case onnx.Uint16:
		data, err = convertJSON(vals, intOf[uint16](0, math.MaxUint16))
	case onnx.Uint32:
		data, err = convertJSON(vals, intOf[uint32](0, math.MaxUint32))
	case onnx.Uint64:
		data, err = convertJSON(vals, intOf[uint64](0, math.MaxUint64))
	case onnx.Bool:
		d := make([]bool, n)
		for i, v := range vals {
			b, ok := v.(bool)
			if !ok {
				return nil, fmt.Errorf("value %d (%v) is not true or false", i, v)
			}
			d[i] = b
		}
		data = d
	case onnx.String:
		d := make([]string, n)
		for i, v := range vals {
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("value %d (%v) is not a string", i, v)
			}
			d[i] = s
		}
		data = d
	default:
		return nil, fmt.Errorf("element type %s cannot be read from JSON", dt)
	}
	if err != nil {
		return nil, err
	}
	return &onnx.Tensor{Name: name, Type: dt, Dims: append([]int64(nil), dims...), Data: data}, nil
}

// convertJSON converts JSON numbers (or booleans, as 0 and 1) with f, which
// sees the number's text (so 64-bit integers stay exact) and its value.
func convertJSON[T any](vals []any, f func(text string, v float64) (T, error)) ([]T, error) {
	out := make([]T, len(vals))
	for i, v := range vals {
		var x T
		var err error
		switch v := v.(type) {
		case json.Number:
			fv, ferr := v.Float64()
			if ferr != nil && !isRange(ferr) {
				err = ferr
				break
			}
			x, err = f(string(v), fv)
		case bool:
			fv, text := 0.0, "0"
			if v {
				fv, text = 1, "1"
			}
			x, err = f(text, fv)
		default:
			err = errors.New("not a number")
		}
		if err != nil {
			return nil, fmt.Errorf("value %d (%v): %w", i, v, err)
		}
		out[i] = x
	}
	return out, nil
}

func isRange(err error) bool {
	var ne *strconv.NumError
	return errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange)
}

func floatOf[T any](conv func(float64) T) func(string, float64) (T, error) {
	return func(_ string, v float64) (T, error) { return conv(v), nil }
}

type integer interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

func intOf[T integer](lo int64, hi uint64) func(string, float64) (T, error) {
	return func(s string, _ float64) (T, error) {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			if i < lo || (i > 0 && uint64(i) > hi) {
				return 0, fmt.Errorf("out of range [%d,%d]", lo, hi)
			}
			return T(i), nil
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil && u <= hi {
			return T(u), nil
		}
		return 0, fmt.Errorf("not an integer in [%d,%d]", lo, hi)
	}
}

// perfEntry is one step of perf_analyzer input data: per input either an
// array or {"content": [...], "shape": [...]} or {"b64": "..."}.
type perfEntry map[string]json.RawMessage

// parsePerfData reads perf_analyzer --input-data JSON ({"data": [...]}) as
// samples: each entry is one request without the batch dimension; entries
// that are arrays are streams (sequence models), flattened in order.
func parsePerfData(body []byte, id string, sig []onnx.ValueInfo) ([]Sample, error) {
	var doc struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := decodeJSON(body, &doc); err != nil {
		return nil, err
	}
	var out []Sample
	for i, raw := range doc.Data {
		var stream []perfEntry
		if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
			if err := decodeJSON(raw, &stream); err != nil {
				return nil, fmt.Errorf("data[%d]: %w", i, err)
			}
			for j, e := range stream {
				s, err := perfSample(e, fmt.Sprintf("%s#%d.%d", id, i, j), sig)
				if err != nil {
					return nil, err
				}
				out = append(out, s)
			}
			continue
		}
		var e perfEntry
		if err := decodeJSON(raw, &e); err != nil {
			return nil, fmt.Errorf("data[%d]: %w", i, err)
		}
		s, err := perfSample(e, fmt.Sprintf("%s#%d", id, i), sig)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func perfSample(e perfEntry, id string, sig []onnx.ValueInfo) (Sample, error) {
	s := Sample{ID: id, Tensors: map[string]*onnx.Tensor{}, Label: -1}
	names := make([]string, 0, len(e))
	for n := range e {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t, err := perfTensor(name, e[name], sig)
		if err != nil {
			return Sample{}, sampleErr(id, name, err)
		}
		s.Tensors[name] = t
	}
	return s, nil
}

func perfTensor(name string, raw json.RawMessage, sig []onnx.ValueInfo) (*onnx.Tensor, error) {
	var v struct {
		Content any     `json:"content"`
		Shape   []int64 `json:"shape"`
		B64     *string `json:"b64"`
	}
	var content any
	if err := decodeJSON(raw, &content); err != nil {
		return nil, err
	}
	if _, isObj := content.(map[string]any); isObj {
		if err := decodeJSON(raw, &v); err != nil {
			return nil, err
		}
		content = v.Content
	}
	dt, want := onnx.Float, []int64(nil)
	for _, in := range sig {
		if in.Name == name {
			dt = in.Type
			if d := sampleShape(in, Batched(sig)); in.Shape.Ranked && !hasUnknown(d) {
				want = onnx.Shape{Dims: d, Ranked: true}.Static()
			}
		}
	}
	if v.B64 != nil {
		b, err := base64.StdEncoding.DecodeString(*v.B64)
		if err != nil {
			return nil, fmt.Errorf("b64: %w", err)
		}
		dims := v.Shape
		if dims == nil {
			dims = want
		}
		if dims == nil || dt.Size() == 0 {
			return nil, errors.New("b64 data needs a shape and a numeric model input type")
		}
		return npyDecode(&npyHeader{Type: dt, Dims: dims}, b, name)
	}
	var vals []any
	flatten(content, &vals)
	dims := v.Shape
	if dims == nil {
		if n, err := onnx.NumElements(want); err == nil && want != nil && n == len(vals) {
			dims = want
		} else if dims = nestedShape(content); len(dims) == 0 {
			dims = []int64{int64(len(vals))}
		}
	}
	if dt == onnx.Float && sig == nil && len(vals) > 0 {
		switch vals[0].(type) {
		case bool:
			dt = onnx.Bool
		case string:
			dt = onnx.String
		}
	}
	return jsonTensor(name, dt, dims, vals)
}

func hasUnknown(d []onnx.Dim) bool {
	for _, x := range d {
		if !x.Known {
			return true
		}
	}
	return false
}

// openJSON indexes JSON files: KServe v2 requests (split along dimension 0
// as for stacked files), perf_analyzer input data (one sample per entry),
// and MLflow-Triton requests ({"inputs": {name: nested list}}, split like
// KServe requests; element types from the model, else float32).
func openJSON(ctx context.Context, spec Spec, fsys FS, files []string) (Source, error) {
	u := &unitSource{fsys: fsys}
	u.load = func(ctx context.Context, fsys FS, file string) ([]Sample, error) {
		body, err := readAll(ctx, fsys, file)
		if err != nil {
			return nil, sampleErr(file, "", err)
		}
		var probe map[string]json.RawMessage
		if err := decodeJSON(body, &probe); err != nil {
			return nil, sampleErr(file, "", err)
		}
		switch inputs := bytes.TrimSpace(probe["inputs"]); {
		case bytes.HasPrefix(inputs, []byte("{")):
			// The MLflow-Triton plugin's form: {"inputs": {name: nested list}}.
			var named perfEntry
			if err := decodeJSON(inputs, &named); err != nil {
				return nil, sampleErr(file, "", err)
			}
			s, err := perfSample(named, file, spec.Inputs)
			if err != nil {
				return nil, err
			}
			return splitSamples(spec.Inputs, file, s.Tensors)
		case inputs != nil:
			ts, err := ParseRequest(body)
			if err != nil {
				return nil, sampleErr(file, "", err)
			}
			return splitSamples(spec.Inputs, file, ts)
		case probe["data"] != nil:
			samples, err := parsePerfData(body, file, spec.Inputs)
			if err != nil {
				return nil, sampleErr(file, "", err)
			}
			return samples, nil
		}
		return nil, sampleErr(file, "", errors.New(`want a KServe v2 request ({"inputs": [...]}) or perf_analyzer input data ({"data": [...]})`))
	}
	for _, f := range files {
		rows, err := u.load(ctx, fsys, f)
		if err != nil {
			return nil, err
		}
		u.add(f, len(rows))
	}
	return u, nil
}
