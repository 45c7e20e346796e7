package kserve

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// binaryBody joins a JSON header and binary data as a client sends them.
func binaryBody(js string, bin ...[]byte) ([]byte, int) {
	body := []byte(js)
	for _, b := range bin {
		body = append(body, b...)
	}
	return body, len(js)
}

func le32(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// The request of extension_binary_data.md: two binary inputs, 19 bytes.
func TestDecodeTritonBinaryExample(t *testing.T) {
	js := `{"model_name":"mymodel","inputs":[` +
		`{"name":"input0","shape":[2,2],"datatype":"UINT32","parameters":{"binary_data_size":16}},` +
		`{"name":"input1","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":3}}],` +
		`"outputs":[{"name":"output0","parameters":{"binary_data":true}}]}`
	body, n := binaryBody(js, le32(1, 2, 3, 4), []byte{1, 0, 1})
	req, err := DecodeRequest(body, n)
	if err != nil {
		t.Fatalf("DecodeRequest: %v", err)
	}
	want := []*onnx.Tensor{
		{Name: "input0", Type: onnx.Uint32, Dims: []int64{2, 2}, Data: []uint32{1, 2, 3, 4}},
		{Name: "input1", Type: onnx.Bool, Dims: []int64{3}, Data: []bool{true, false, true}},
	}
	for i, w := range want {
		if err := sameTensor(w, req.Inputs[i]); err != nil {
			t.Error(err)
		}
	}
	if len(req.Outputs) != 1 || req.Outputs[0].Name != "output0" || !req.Outputs[0].Binary || req.Outputs[0].Parameters != nil {
		t.Errorf("outputs = %+v, want output0 as binary", req.Outputs)
	}
}

func TestDecodeRequestErrors(t *testing.T) {
	in := func(s string) string { return `{"inputs":[` + s + `]}` }
	x := func(shape, dt, rest string) string {
		return `{"name":"x","shape":` + shape + `,"datatype":"` + dt + `",` + rest + `}`
	}
	bin := func(size string) string { return `"parameters":{"binary_data_size":` + size + `}` }
	tests := []struct {
		name      string
		js        string
		bin       []byte
		headerLen int // 0: len(js) when bin is set, else -1
		want      string
	}{
		{name: "invalid JSON", js: `{"inputs": [`, want: "parsing request JSON: unexpected end of JSON input"},
		{name: "missing comma", js: "{\n \"id\": \"1\"\n \"inputs\": []}", want: "after object key:value pair at line 3, column 2"},
		{name: "id not a string", js: `{"id": 42, "inputs": []}`, want: "id: JSON number where string is expected"},
		{name: "no inputs", js: `{"inputs": []}`, want: "request has no inputs"},
		{name: "no name", js: in(`{"shape":[1],"datatype":"FP32","data":[1]}`), want: "inputs[0]: no name"},
		{name: "unknown datatype", js: in(x("[1]", "FP8", `"data":[1]`)), want: `input "x": unknown datatype "FP8"`},
		{name: "no datatype", js: in(`{"name":"x","shape":[1],"data":[1]}`), want: `input "x": no datatype`},
		{name: "no shape", js: in(`{"name":"x","datatype":"FP32","data":[1]}`), want: `input "x": no shape`},
		{name: "negative dimension", js: in(x("[-1]", "FP32", `"data":[1]`)), want: `input "x": dimension 0 is negative`},
		{name: "too few values", js: in(x("[2,2]", "FP32", `"data":[1,2,3]`)), want: `input "x": 3 data values for shape [2 2] (want 4)`},
		{name: "nested too many", js: in(x("[2]", "INT32", `"data":[[1,2],[3]]`)), want: `input "x": 3 data values for shape [2] (want 2)`},
		{name: "duplicate input", js: in(x("[1]", "FP32", `"data":[1]`) + "," + x("[1]", "FP32", `"data":[1]`)), want: `input "x" appears twice`},
		{name: "no data", js: in(x("[1]", "FP32", `"parameters":{}`)), want: `input "x": no data and no binary_data_size`},
		{name: "data not array", js: in(x("[1]", "FP32", `"data":1`)), want: `input "x": data is not an array`},
		{name: "null element", js: in(x("[1]", "FP32", `"data":[null]`)), want: `input "x": data element 0 is null`},
		{name: "object element", js: in(x("[1]", "FP32", `"data":[{"a":1}]`)), want: `input "x": data element 0 is an object`},
		{name: "string for float", js: in(x("[1]", "FP32", `"data":["1"]`)), want: `input "x": data element 0 ("1") is not FP32: want a number`},
		{name: "int8 range", js: in(x("[2]", "INT8", `"data":[1,300]`)), want: `input "x": data element 1 (300) is not INT8`},
		{name: "fraction for int", js: in(x("[1]", "INT64", `"data":[1.5]`)), want: `data element 0 (1.5) is not INT64`},
		{name: "negative uint", js: in(x("[1]", "UINT8", `"data":[-1]`)), want: `data element 0 (-1) is not UINT8`},
		{name: "fp32 range", js: in(x("[1]", "FP32", `"data":[1e39]`)), want: `data element 0 (1e39) is not FP32: out of range`},
		{name: "fp16 range", js: in(x("[1]", "FP16", `"data":[70000]`)), want: `data element 0 (70000) is not FP16: out of range`},
		{name: "number for bool", js: in(x("[1]", "BOOL", `"data":[1]`)), want: `data element 0 (1) is not BOOL: want true or false`},
		{name: "number for bytes", js: in(x("[1]", "BYTES", `"data":[1]`)), want: `data element 0 (1) is not a string`},
		{name: "shared memory", js: in(x("[1]", "FP32", `"parameters":{"shared_memory_region":"r"}`)), want: "shared memory extension is not supported"},
		{name: "truncated binary", js: in(x("[4]", "FP32", bin("16"))), bin: make([]byte, 8), want: `input "x": binary_data_size is 16 but only 8 bytes of binary data are left (truncated binary data)`},
		{name: "size mismatch", js: in(x("[4]", "FP32", bin("8"))), bin: make([]byte, 8), want: `input "x": binary_data_size is 8 but shape [4] of FP32 takes 16 bytes`},
		{name: "bytes left over", js: in(x("[1]", "FP32", bin("4"))), bin: make([]byte, 6), want: "2 bytes of binary data are left after the last input"},
		{name: "data and binary", js: in(x("[1]", "FP32", `"data":[1],`+bin("4"))), bin: make([]byte, 4), want: "has both data and binary_data_size"},
		{name: "size not a count", js: in(x("[1]", "FP32", bin("-4"))), bin: make([]byte, 4), want: "binary_data_size -4 is not a byte count"},
		{name: "header past body", js: in(x("[1]", "FP32", `"data":[1]`)), headerLen: 1000, want: "Inference-Header-Content-Length is 1000 but the body has only"},
		{name: "bool byte", js: in(x("[2]", "BOOL", bin("2"))), bin: []byte{1, 2}, want: "BOOL element 1 is byte 2, want 0 or 1"},
		{name: "bytes length", js: in(x("[1]", "BYTES", bin("6"))), bin: append(le32(5), 'a', 'b'), want: "BYTES element 0: length 5 but 2 bytes left"},
		{name: "bytes count", js: in(x("[2]", "BYTES", bin("5"))), bin: append(le32(1), 'a'), want: "2 BYTES elements take at least 8 bytes"},
		{name: "bytes trailing", js: in(x("[1]", "BYTES", bin("7"))), bin: append(le32(1), 'a', 0, 0), want: "2 bytes are left after the last of 1 BYTES elements"},
		{name: "binary_data_output not bool", js: `{"parameters":{"binary_data_output":1},"inputs":[` + x("[1]", "FP32", `"data":[1]`) + `]}`, want: "binary_data_output is 1, want true or false"},
		{name: "duplicate output", js: `{"inputs":[` + x("[1]", "FP32", `"data":[1]`) + `],"outputs":[{"name":"y"},{"name":"y"}]}`, want: `output "y" is requested twice`},
		{name: "binary_data not bool", js: `{"inputs":[` + x("[1]", "FP32", `"data":[1]`) + `],"outputs":[{"name":"y","parameters":{"binary_data":"yes"}}]}`, want: `output "y": parameter binary_data is yes, want true or false`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, n := binaryBody(tt.js, tt.bin)
			if tt.bin == nil {
				n = -1
			}
			if tt.headerLen != 0 {
				n = tt.headerLen
			}
			_, err := DecodeRequest(body, n)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("DecodeRequest(%s) = %v, want an error containing %q", tt.js, err, tt.want)
			}
		})
	}
}

// allTypes has a tensor of every datatype, with values at the edges.
func allTypes() []*onnx.Tensor {
	return []*onnx.Tensor{
		{Name: "bool", Type: onnx.Bool, Dims: []int64{2}, Data: []bool{true, false}},
		{Name: "u8", Type: onnx.Uint8, Dims: []int64{2}, Data: []uint8{0, 255}},
		{Name: "u16", Type: onnx.Uint16, Dims: []int64{1}, Data: []uint16{65535}},
		{Name: "u32", Type: onnx.Uint32, Dims: []int64{1}, Data: []uint32{math.MaxUint32}},
		{Name: "u64", Type: onnx.Uint64, Dims: []int64{1}, Data: []uint64{math.MaxUint64}},
		{Name: "i8", Type: onnx.Int8, Dims: []int64{2}, Data: []int8{-128, 127}},
		{Name: "i16", Type: onnx.Int16, Dims: []int64{1}, Data: []int16{-32768}},
		{Name: "i32", Type: onnx.Int32, Dims: []int64{1}, Data: []int32{math.MinInt32}},
		{Name: "i64", Type: onnx.Int64, Dims: []int64{1}, Data: []int64{math.MinInt64}},
		{Name: "f16", Type: onnx.Float16, Dims: []int64{3}, Data: []float16.Float16{float16.Fromfloat32(0.1), 0x0001, 0x8000}},
		{Name: "bf16", Type: onnx.BFloat16, Dims: []int64{1}, Data: []onnx.BF16{onnx.BF16From(3.14159)}},
		{Name: "f32", Type: onnx.Float, Dims: []int64{2, 2}, Data: []float32{math.SmallestNonzeroFloat32, math.MaxFloat32, -0.0, 1.0 / 3}},
		{Name: "f64", Type: onnx.Double, Dims: []int64{1}, Data: []float64{math.Pi}},
		{Name: "bytes", Type: onnx.String, Dims: []int64{2}, Data: []string{"a\"b\\c", "日本"}},
		{Name: "scalar", Type: onnx.Float, Dims: []int64{}, Data: []float32{7}},
		{Name: "empty", Type: onnx.Int32, Dims: []int64{0, 3}, Data: []int32{}},
	}
}

func TestRequestRoundTrip(t *testing.T) {
	for _, binary := range []bool{false, true} {
		req := &Request{ID: "r-1", Inputs: allTypes(), BinaryOutput: binary,
			Outputs:    []OutputRequest{{Name: "a", Binary: binary}, {Name: "b", Binary: !binary, Parameters: map[string]any{"classification": true}}},
			Parameters: map[string]any{"priority": "high"}}
		body, n, err := EncodeRequest(req, binary)
		if err != nil {
			t.Fatalf("EncodeRequest(binary=%v): %v", binary, err)
		}
		if binary == (n == len(body)) {
			t.Errorf("EncodeRequest(binary=%v): header length %d of %d bytes", binary, n, len(body))
		}
		got, err := DecodeRequest(body, n)
		if err != nil {
			t.Fatalf("DecodeRequest(EncodeRequest(binary=%v)): %v\n%s", binary, err, body[:n])
		}
		compareRequests(t, req, got)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	resp := &Response{ModelName: "m", ModelVersion: "2", ID: "7", Outputs: allTypes()}
	for _, bin := range []map[string]bool{nil, {"f32": true, "bytes": true}, {"bool": true, "empty": true}} {
		body, n, err := EncodeResponse(resp, bin)
		if err != nil {
			t.Fatalf("EncodeResponse(%v): %v", bin, err)
		}
		got, err := DecodeResponse(body, n)
		if err != nil {
			t.Fatalf("DecodeResponse: %v", err)
		}
		if got.ModelName != "m" || got.ModelVersion != "2" || got.ID != "7" || len(got.Outputs) != len(resp.Outputs) {
			t.Fatalf("DecodeResponse = %+v", got)
		}
		for i, w := range resp.Outputs {
			if err := sameTensor(w, got.Outputs[i]); err != nil {
				t.Errorf("binary %v: %v", bin, err)
			}
		}
	}
}

// JSON cannot hold NaN, infinities or non-UTF-8 bytes; binary can.
func TestEncodeJSONLimits(t *testing.T) {
	for _, tt := range []*onnx.Tensor{
		{Name: "nan", Type: onnx.Float, Dims: []int64{1}, Data: []float32{float32(math.NaN())}},
		{Name: "inf", Type: onnx.Double, Dims: []int64{1}, Data: []float64{math.Inf(-1)}},
		{Name: "bytes", Type: onnx.String, Dims: []int64{1}, Data: []string{"\xff"}},
	} {
		resp := &Response{Outputs: []*onnx.Tensor{tt}}
		if _, _, err := EncodeResponse(resp, nil); err == nil || !strings.Contains(err.Error(), "ask for binary data") {
			t.Errorf("EncodeResponse(%s as JSON) = %v, want an error asking for binary data", tt.Name, err)
		}
		body, n, err := EncodeResponse(resp, map[string]bool{tt.Name: true})
		if err != nil {
			t.Fatalf("EncodeResponse(%s as binary): %v", tt.Name, err)
		}
		got, err := DecodeResponse(body, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameTensor(tt, got.Outputs[0]); err != nil {
			t.Error(err)
		}
	}
	bad := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{2}, Data: []float32{1}}
	if _, _, err := EncodeResponse(&Response{Outputs: []*onnx.Tensor{bad}}, nil); err == nil {
		t.Error("EncodeResponse of 1 value for shape [2] succeeded")
	}
}

func TestDatatypes(t *testing.T) {
	for name, dt := range datatypes {
		got, err := Datatype(dt)
		if err != nil || got != name {
			t.Errorf("Datatype(%s) = %q, %v, want %q", dt, got, err, name)
		}
		back, err := ParseDatatype(name)
		if err != nil || back != dt {
			t.Errorf("ParseDatatype(%q) = %v, %v, want %v", name, back, err, dt)
		}
	}
	if _, err := ParseDatatype("STRING"); err == nil {
		t.Error(`ParseDatatype("STRING") succeeded; v2 calls it BYTES`)
	}
	if _, err := Datatype(onnx.Complex64); err == nil {
		t.Error("Datatype(complex64) succeeded")
	}
}
