package dataset

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

func intInput(name string, dt onnx.DataType, dims ...int64) onnx.ValueInfo {
	v := floatInput(name, dims...)
	v.Type = dt
	return v
}

func TestCorpusKServeRequest(t *testing.T) {
	p := testutil.Corpus(t, "kserve-v2", "gke_marketplace_bert_request.json")
	body, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := ParseRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"input_ids", "input_mask", "segment_ids"} {
		x := ts[name]
		if x == nil || x.Type != onnx.Int32 || !slices.Equal(x.Dims, []int64{1, 128}) {
			t.Errorf("ParseRequest(%s)[%s] = %v, want int32[1,128]", p, name, x)
		}
	}
	if ids := ts["input_ids"].Data.([]int32); ids[0] != 101 || ids[1] != 2054 {
		t.Errorf("input_ids starts %v, want [101 2054 ...]", ids[:2])
	}
	ctx := context.Background()
	sig := []onnx.ValueInfo{intInput("input_ids", onnx.Int32, -1, 128), intInput("input_mask", onnx.Int32, -1, 128), intInput("segment_ids", onnx.Int32, -1, 128)}
	src, err := Open(ctx, Spec{Path: p, Inputs: sig}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := src.Sample(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 1 || s.ID != p+"#0" || !slices.Equal(s.Tensors["input_mask"].Dims, []int64{128}) {
		t.Errorf("Open(%s) = %d samples, %s %v, want 1 sample of [128]", p, src.Len(), s.ID, s.Tensors["input_mask"].Dims)
	}
	if err := Check(sig, s); err != nil {
		t.Error(err)
	}
}

func TestCorpusPerfAnalyzer(t *testing.T) {
	ctx := context.Background()
	dir := testutil.Corpus(t, "kserve-v2", "perf_analyzer_input_data")
	sig := []onnx.ValueInfo{intInput("INPUT0", onnx.Int32, -1, 16), intInput("INPUT1", onnx.Int32, -1, 16)}
	src, err := Open(ctx, Spec{Path: filepath.Join(dir, "int_data.json"), Inputs: sig}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 4 {
		t.Fatalf("int_data.json: %d samples, want 4", src.Len())
	}
	s, err := src.Sample(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if x := s.Tensors["INPUT0"]; x.Type != onnx.Int32 || !slices.Equal(x.Dims, []int64{16}) || x.Data.([]int32)[0] != 3 || !strings.HasSuffix(s.ID, "int_data.json#2") {
		t.Errorf("int_data.json sample 2 = %s %v, want INPUT0 int32[16] starting 3", s.ID, x)
	}
	src, err = Open(ctx, Spec{Path: filepath.Join(dir, "float_data_with_shape.json")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 9 {
		t.Fatalf("float_data_with_shape.json: %d samples, want 9 (3 streams of 4, 3 and 2 steps)", src.Len())
	}
	var shapes [][]int64
	for i := range src.Len() {
		s, err := src.Sample(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		shapes = append(shapes, s.Tensors["INPUT"].Dims)
	}
	if want := [][]int64{{1}, {2}, {2}, {3}, {1}, {2}, {2}, {1}, {2}}; !reflect.DeepEqual(shapes, want) {
		t.Errorf("float_data_with_shape.json shapes = %v, want %v", shapes, want)
	}
	// The directory mixes nothing but JSON: output.json is input data too.
	src, err = Open(ctx, Spec{Path: dir, Inputs: []onnx.ValueInfo{intInput("INPUT", onnx.Float, -1, -1), sig[0], sig[1]}}, nil)
	if err != nil || src.Len() != 17 {
		t.Fatalf("Open(dir) = %v, %v, want 17 samples", src, err)
	}
}

func TestCorpusMLflow(t *testing.T) {
	p := testutil.Corpus(t, "triton-configs", "mlflow_example", "input.json")
	ctx := context.Background()
	src, err := Open(ctx, Spec{Path: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := src.Sample(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if x := s.Tensors["INPUT1"]; src.Len() != 1 || x.Type != onnx.Float || !slices.Equal(x.Dims, []int64{16}) {
		t.Errorf("Open(%s) = %d samples, INPUT1 %v", p, src.Len(), x)
	}
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		body, want string
	}{
		{`{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","data":[1]}]}`, `input "a": 1 values for shape [2] (want 2)`},
		{`{"inputs":[{"name":"a","shape":[1],"datatype":"FLOAT","data":[1]}]}`, `input "a": unknown datatype "FLOAT"`},
		{`{"inputs":[{"name":"a","shape":[1],"datatype":"INT8","data":[300]}]}`, `input "a": value 0 (300): out of range [-128,127]`},
		{`{"inputs":[{"name":"a","shape":[1],"datatype":"INT32","data":[1.5]}]}`, `not an integer`},
		{`{"inputs":[{"name":"a","shape":[1],"datatype":"BOOL","data":[1]}]}`, `is not true or false`},
		{`{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}`, `binary data extension`},
		{`{"inputs":[{"name":"a","datatype":"FP32","data":[1]}]}`, `input "a": no shape`},
		{`{"inputs":[]}`, `no inputs`},
		{`{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","data":[1]}]} {}`, `text after`},
		{`{"inputs":`, `parsing JSON`},
	}
	for _, tt := range tests {
		if _, err := ParseRequest([]byte(tt.body)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseRequest(%s) = %v, want %q", tt.body, err, tt.want)
		}
	}
	// Nested data, 64-bit integers and every datatype read exactly.
	ts, err := ParseRequest([]byte(`{"inputs":[
		{"name":"i","shape":[2,2],"datatype":"INT64","data":[[9007199254740993,-1],[0,2]]},
		{"name":"u","shape":[1],"datatype":"UINT64","data":[18446744073709551615]},
		{"name":"b","shape":[2],"datatype":"BOOL","data":[true,false]},
		{"name":"s","shape":[1],"datatype":"BYTES","data":["hi"]},
		{"name":"h","shape":[1],"datatype":"FP16","data":[0.5]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := ts["i"].Data.([]int64); got[0] != 9007199254740993 || got[3] != 2 {
		t.Errorf("INT64 data = %v", got)
	}
	if got := ts["u"].Data.([]uint64); got[0] != 1<<64-1 {
		t.Errorf("UINT64 data = %v", got)
	}
	if ts["b"].Type != onnx.Bool || ts["s"].Data.([]string)[0] != "hi" || ts["h"].Type != onnx.Float16 {
		t.Errorf("types = %v %v %v", ts["b"].Type, ts["s"].Type, ts["h"].Type)
	}
}
