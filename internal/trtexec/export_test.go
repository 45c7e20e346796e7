package trtexec

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// trtexecExport is a file in the layout of sampleReporting.cpp
// exportJSONOutput, with the value spellings of sampleUtils.cpp dumpBuffer
// (C++ stream defaults, glibc's nan and inf) and a scalar output.
const trtexecExport = `[
  { "name" : "y"
  , "dimensions" : "1x4"
  , "values" : [ -0.0518188, 1e+10, -nan, inf ]
  }
, { "name" : "input:0/z"
  , "dimensions" : ""
  , "values" : [ 3 ]
  }
, { "name" : "empty"
  , "dimensions" : "0x3"
  , "values" : [  ]
  }
]
`

func TestParseExportOutput(t *testing.T) {
	tests := []struct {
		name, in string
		want     []ExportedOutput
	}{
		{"trtexec layout", trtexecExport, []ExportedOutput{
			{Name: "y", Dims: []int64{1, 4}, Values: []string{"-0.0518188", "1e+10", "-nan", "inf"}},
			{Name: "input:0/z", Dims: []int64{}, Values: []string{"3"}},
			{Name: "empty", Dims: []int64{0, 3}, Values: []string{}},
		}},
		// An output with a data-dependent shape: Binding::dump writes the
		// allocator's shape into the values array.
		{"final shape", "[\n  { \"name\" : \"nz\"\n  , \"dimensions\" : \"-1x2\"\n  , \"values\" : [ Final shape is 2x2 reported by the output allocator.\n1, 0, 1, 1 ]\n  }\n]\n",
			[]ExportedOutput{{Name: "nz", Dims: []int64{2, 2}, Values: []string{"1", "0", "1", "1"}}}},
		{"unknown members, any order", `[{"values":[1,2],"type":{"a":[true,null,"x",-1.5e3]},"dimensions":"2","name":"a\u0062"}]`,
			[]ExportedOutput{{Name: "ab", Dims: []int64{2}, Values: []string{"1", "2"}}}},
		{"no outputs", "[\n]\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseExportOutput(strings.NewReader(tt.in))
			if err != nil {
				t.Fatalf("ParseExportOutput(%s) error %v", tt.name, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseExportOutput(%s) = %+v, want %+v", tt.name, got, tt.want)
			}
		})
	}
}

func TestFormatExportOutput(t *testing.T) {
	outs, err := ParseExportOutput(strings.NewReader(trtexecExport))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(FormatExportOutput(outs)); got != trtexecExport {
		t.Errorf("FormatExportOutput = %q, want trtexec's layout %q", got, trtexecExport)
	}
}

func TestParseExportOutputErrors(t *testing.T) {
	out := func(members string) string { return "[\n{ " + members + " }\n]" }
	tests := []struct{ name, in, want string }{
		{"not an array", `{"name":"y"}`, `line 1: want '[', found "{\"name\":\"y\"}"`},
		{"trailing", "[]\nx", `line 2: "x" after the outputs`},
		{"unterminated", "[", "line 1: want '{', found end of file"},
		{"unterminated name", `[{"name":"y`, "line 1: name: unterminated string"},
		{"twice", `[{"name":"y","dimensions":"","values":[1]},{"name":"y","dimensions":"","values":[2]}]`, `output "y" listed twice`},
		{"member twice", out(`"name":"y","name":"z"`), `line 2: member "name" given twice`},
		{"no name", out(`"dimensions":"","values":[1]`), "line 2: output without a name"},
		{"no dims", out(`"name":"y","values":[1]`), `output "y" has no dimensions`},
		{"no values", out(`"name":"y","dimensions":"1"`), `output "y" has no values`},
		{"count", out(`"name":"y","dimensions":"2x2","values":[1,2,3]`), `line 2: output "y": 3 values for dimensions "2x2" (4 elements)`},
		{"unknown dims", out(`"name":"y","dimensions":"-1","values":[1]`), `output "y": dimensions -1 are not concrete`},
		{"bad dims", out(`"name":"y","dimensions":"1x-2","values":[1]`), `dimensions: bad dimensions "1x-2"`},
		{"huge dims", out(`"name":"y","dimensions":"4294967296x4294967296","values":[1]`), `output "y": shape [4294967296 4294967296] has too many elements`},
		{"leading zero", out(`"name":"y","dimensions":"1","values":[01]`), `values: value 0: want a number, found "01]`},
		{"bare word", out(`"name":"y","dimensions":"1","values":[infinity]`), "values: value 0: want a number"},
		{"plus sign", out(`"name":"y","dimensions":"1","values":[+1]`), "values: value 0: want a number"},
		{"bad escape", out(`"name":"y\q"`), `string "\"y\\q\""`},
		{"raw newline in name", "[{\"name\":\"a\nb\"}]", "invalid character"},
		{"open final shape", out(`"name":"y","dimensions":"1","values":[ Final shape is 1 ]`), `values: unterminated "Final shape is " line`},
		{"deep unknown", out(`"x":` + strings.Repeat("[", 100)), "x: values nested too deeply"},
		{"bad unknown", out(`"x":nope`), `x: want a value, found "nope }`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseExportOutput(strings.NewReader(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseExportOutput(%s) error = %v, want %q", tt.name, err, tt.want)
			}
		})
	}
}

func TestExportedOutputTensor(t *testing.T) {
	f16 := func(v ...float32) []float16.Float16 {
		out := make([]float16.Float16, len(v))
		for i, x := range v {
			out[i] = float16.Fromfloat32(x)
		}
		return out
	}
	tests := []struct {
		dt   onnx.DataType
		vals []string
		want any
	}{
		{onnx.Float, []string{"-0.0518188", "1e+10", "-0"}, []float32{-0.0518188, 1e10, float32(math.Copysign(0, -1))}},
		{onnx.Float16, []string{"0.000999451", "-65504"}, f16(0.000999451, -65504)},
		{onnx.BFloat16, []string{"1.5", "-3.38953e+38"}, []onnx.BF16{onnx.BF16From(1.5), onnx.BF16From(-3.38953e+38)}},
		{onnx.Int8, []string{"-128", "127"}, []int8{-128, 127}},
		{onnx.Uint8, []string{"0", "255"}, []uint8{0, 255}},
		{onnx.Int32, []string{"-2147483648", "7"}, []int32{math.MinInt32, 7}},
		{onnx.Int64, []string{"9007199254740993", "-1"}, []int64{9007199254740993, -1}},
		{onnx.Bool, []string{"1", "0"}, []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.dt.String(), func(t *testing.T) {
			got, err := ExportedOutput{Name: "o", Dims: []int64{int64(len(tt.vals))}, Values: tt.vals}.Tensor(tt.dt)
			if err != nil {
				t.Fatalf("Tensor(%s) error %v", tt.dt, err)
			}
			if got.Type != tt.dt || got.Name != "o" || !reflect.DeepEqual(got.Data, tt.want) {
				t.Errorf("Tensor(%s) = %s %v, want %v", tt.dt, got.Type, got.Data, tt.want)
			}
		})
	}
	nan, err := ExportedOutput{Name: "o", Dims: []int64{4}, Values: []string{"nan", "-nan", "inf", "-inf"}}.Tensor(onnx.Float)
	if err != nil {
		t.Fatal(err)
	}
	d := nan.Data.([]float32)
	if !isNaN32(d[0]) || math.Signbit(float64(d[0])) || !isNaN32(d[1]) || !math.Signbit(float64(d[1])) ||
		!math.IsInf(float64(d[2]), 1) || !math.IsInf(float64(d[3]), -1) {
		t.Errorf("Tensor(nan, -nan, inf, -inf) = %v", d)
	}
}

func isNaN32(f float32) bool { return f != f }

func TestExportedOutputTensorErrors(t *testing.T) {
	tests := []struct {
		dt   onnx.DataType
		vals []string
		want string
	}{
		{onnx.Int8, []string{"128"}, `output "o" as int8: value 0 (128): out of range`},
		{onnx.Int64, []string{"1.5"}, "value 0 (1.5): not a number of this type"},
		{onnx.Int32, []string{"nan"}, "value 0 (nan): not a number of this type"},
		{onnx.Bool, []string{"2"}, "value 0 (2): not 0 or 1"},
		{onnx.Float16, []string{"70000"}, "value 0 (70000): out of range"},
		{onnx.Float, []string{"1e39"}, "value 0 (1e39): out of range"},
		{onnx.Float, []string{"NaN"}, "value 0 (NaN): not a number of this type"},
		{onnx.Double, []string{"1"}, `output "o": element type float64 is not one kiln exchanges with trtexec`},
		{onnx.Float, []string{"1", "2"}, `output "o": 2 values for dimensions "1" (1 elements)`},
	}
	for _, tt := range tests {
		_, err := ExportedOutput{Name: "o", Dims: []int64{1}, Values: tt.vals}.Tensor(tt.dt)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Tensor(%s, %q) error = %v, want %q", tt.dt, tt.vals, err, tt.want)
		}
	}
}

func TestExportedOutputFrom(t *testing.T) {
	// Values trtexec prints exactly, so that they come back unchanged.
	tensors := []*onnx.Tensor{
		{Name: "f", Type: onnx.Float, Dims: []int64{2, 3}, Data: []float32{0.5, -1.25, 1e10, 100000, 1e-05, -0.0518188}},
		{Name: "h", Type: onnx.Float16, Dims: []int64{2}, Data: []float16.Float16{float16.Fromfloat32(-2.5), float16.Fromfloat32(65504)}},
		{Name: "b", Type: onnx.BFloat16, Dims: []int64{1}, Data: []onnx.BF16{onnx.BF16From(0.375)}},
		{Name: "i8", Type: onnx.Int8, Dims: []int64{2}, Data: []int8{-128, 5}},
		{Name: "u8", Type: onnx.Uint8, Dims: []int64{1}, Data: []uint8{200}},
		{Name: "i32", Type: onnx.Int32, Dims: []int64{}, Data: []int32{-7}},
		{Name: "i64", Type: onnx.Int64, Dims: []int64{1}, Data: []int64{math.MaxInt64}},
		{Name: "m", Type: onnx.Bool, Dims: []int64{2}, Data: []bool{true, false}},
	}
	var outs []ExportedOutput
	for _, x := range tensors {
		o, err := ExportedOutputFrom(x)
		if err != nil {
			t.Fatalf("ExportedOutputFrom(%s) error %v", x.Name, err)
		}
		outs = append(outs, o)
	}
	if got := strings.Join(outs[0].Values, " "); got != "0.5 -1.25 1e+10 100000 1e-05 -0.0518188" {
		t.Errorf("ExportedOutputFrom(float32) values = %s, want C++'s spelling", got)
	}
	parsed, err := ParseExportOutput(bytes.NewReader(FormatExportOutput(outs)))
	if err != nil {
		t.Fatalf("ParseExportOutput(FormatExportOutput) error %v", err)
	}
	for i, x := range tensors {
		got, err := parsed[i].Tensor(x.Type)
		if err != nil || !reflect.DeepEqual(got, x) {
			t.Errorf("round trip of %s = %+v, %v, want %+v", x.Name, got, err, x)
		}
	}
	if _, err := ExportedOutputFrom(&onnx.Tensor{Name: "d", Type: onnx.Float16, Dims: []int64{1}, Data: []float32{1}}); err == nil ||
		!strings.Contains(err.Error(), `tensor "d": a float16 tensor cannot hold []float32 data`) {
		t.Errorf("ExportedOutputFrom(mistyped) error = %v", err)
	}
}

// FuzzExportOutput checks that whatever ParseExportOutput accepts formats
// and parses back to the same outputs, and that decoding the values as any
// type either fails or is stable under formatting.
func FuzzExportOutput(f *testing.F) {
	f.Add([]byte(trtexecExport))
	f.Add([]byte("[\n  { \"name\" : \"nz\"\n  , \"dimensions\" : \"-1x2\"\n  , \"values\" : [ Final shape is 1x2 reported by the output allocator.\n1, 0 ]\n  }\n]\n"))
	f.Add([]byte(`[{"values":[1,2],"type":{"a":[true,null,"x",-1.5e3]},"dimensions":"2","name":"a\u0062"}]`))
	f.Add([]byte(`[{"name":"b","dimensions":"2x1","values":[255,-128]},{"name":"c\\\"","dimensions":"","values":[0.000385761]}]`))
	f.Add([]byte("[]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		outs, err := ParseExportOutput(bytes.NewReader(data))
		if err != nil {
			return
		}
		formatted := FormatExportOutput(outs)
		again, err := ParseExportOutput(bytes.NewReader(formatted))
		if err != nil {
			t.Fatalf("ParseExportOutput(FormatExportOutput(%q)) error %v\nformatted: %q", data, err, formatted)
		}
		if !reflect.DeepEqual(outs, again) {
			t.Fatalf("round trip of %q = %+v, want %+v", data, again, outs)
		}
		for _, o := range outs {
			for dt := range trtTypes {
				x, err := o.Tensor(dt)
				if err != nil {
					continue
				}
				e1, err := ExportedOutputFrom(x)
				if err != nil {
					t.Fatalf("ExportedOutputFrom(%s as %s) error %v", o.Name, dt, err)
				}
				y, err := e1.Tensor(dt)
				if err != nil {
					t.Fatalf("%s as %s: formatted values %q do not decode: %v", o.Name, dt, e1.Values, err)
				}
				if e2, _ := ExportedOutputFrom(y); !reflect.DeepEqual(e1, e2) {
					t.Fatalf("%s as %s: formatting is not stable: %q then %q", o.Name, dt, e1.Values, e2.Values)
				}
			}
		}
	})
}
