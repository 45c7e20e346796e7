package onnx_test

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

func f16s(v ...float32) []float16.Float16 {
	out := make([]float16.Float16, len(v))
	for i, x := range v {
		out[i] = float16.Fromfloat32(x)
	}
	return out
}

// codecCases covers every element type the codec supports.
func codecCases() []*onnx.Tensor {
	return []*onnx.Tensor{
		{Name: "f32", Type: onnx.Float, Dims: []int64{2, 2}, Data: []float32{1, -2.5, float32(math.Inf(1)), 3e-40}},
		{Name: "f64", Type: onnx.Double, Dims: []int64{3}, Data: []float64{math.Pi, -0, 1e300}},
		{Name: "f16", Type: onnx.Float16, Dims: []int64{3}, Data: f16s(1, -65504, 0.000061)},
		{Name: "bf16", Type: onnx.BFloat16, Dims: []int64{2}, Data: []onnx.BF16{onnx.BF16From(1.5), onnx.BF16From(-3e38)}},
		{Name: "i8", Type: onnx.Int8, Dims: []int64{3}, Data: []int8{-128, 0, 127}},
		{Name: "u8", Type: onnx.Uint8, Dims: []int64{2}, Data: []uint8{0, 255}},
		{Name: "i16", Type: onnx.Int16, Dims: []int64{2}, Data: []int16{-32768, 32767}},
		{Name: "u16", Type: onnx.Uint16, Dims: []int64{2}, Data: []uint16{0, 65535}},
		{Name: "i32", Type: onnx.Int32, Dims: []int64{2}, Data: []int32{math.MinInt32, math.MaxInt32}},
		{Name: "u32", Type: onnx.Uint32, Dims: []int64{2}, Data: []uint32{0, math.MaxUint32}},
		{Name: "i64", Type: onnx.Int64, Dims: []int64{2}, Data: []int64{math.MinInt64, math.MaxInt64}},
		{Name: "u64", Type: onnx.Uint64, Dims: []int64{2}, Data: []uint64{0, math.MaxUint64}},
		{Name: "bool", Type: onnx.Bool, Dims: []int64{3}, Data: []bool{true, false, true}},
		{Name: "str", Type: onnx.String, Dims: []int64{2}, Data: []string{"héllo", "\x00bytes"}},
		{Name: "c64", Type: onnx.Complex64, Dims: []int64{1}, Data: []complex64{complex(1, -2)}},
		{Name: "c128", Type: onnx.Complex128, Dims: []int64{1}, Data: []complex128{complex(3, 4)}},
		{Name: "i4", Type: onnx.Int4, Dims: []int64{3}, Data: []int8{-8, 7, -1}},
		{Name: "u4", Type: onnx.Uint4, Dims: []int64{3}, Data: []uint8{0, 15, 9}},
		{Name: "scalar", Type: onnx.Float, Dims: nil, Data: []float32{42}},
		{Name: "empty", Type: onnx.Float, Dims: []int64{0, 3}, Data: []float32{}},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for _, form := range []onnx.Storage{onnx.Raw, onnx.Typed} {
		for _, want := range codecCases() {
			t.Run(want.Name+map[onnx.Storage]string{onnx.Raw: "/raw", onnx.Typed: "/typed"}[form], func(t *testing.T) {
				p, err := onnx.Encode(want, form)
				if err != nil {
					t.Fatalf("Encode = %v", err)
				}
				// Through the wire too, so packed encodings are exercised.
				b, _ := proto.Marshal(p)
				p2 := &onnxpb.TensorProto{}
				if err := proto.Unmarshal(b, p2); err != nil {
					t.Fatal(err)
				}
				got, err := onnx.Decode(p2)
				if err != nil {
					t.Fatalf("Decode = %v", err)
				}
				if got.Type != want.Type || !reflect.DeepEqual(got.Data, want.Data) || len(got.Dims) != len(want.Dims) {
					t.Errorf("Decode(Encode(%s)) = %v %v %v, want %v %v %v", want.Name, got.Type, got.Dims, got.Data, want.Type, want.Dims, want.Data)
				}
				if form == onnx.Raw && want.Type != onnx.String && p.RawData == nil {
					t.Error("raw form did not use raw_data")
				}
			})
		}
	}
}

// The typed storage fields are the ones the ONNX spec assigns to each type.
func TestTypedStorageFields(t *testing.T) {
	cases := []struct {
		tensor *onnx.Tensor
		field  string
	}{
		{&onnx.Tensor{Type: onnx.Float16, Dims: []int64{1}, Data: f16s(1)}, "int32_data"},
		{&onnx.Tensor{Type: onnx.BFloat16, Dims: []int64{1}, Data: []onnx.BF16{onnx.BF16From(1)}}, "int32_data"},
		{&onnx.Tensor{Type: onnx.Uint32, Dims: []int64{1}, Data: []uint32{7}}, "uint64_data"},
		{&onnx.Tensor{Type: onnx.Bool, Dims: []int64{1}, Data: []bool{true}}, "int32_data"},
		{&onnx.Tensor{Type: onnx.Double, Dims: []int64{1}, Data: []float64{1}}, "double_data"},
		{&onnx.Tensor{Type: onnx.Int64, Dims: []int64{1}, Data: []int64{1}}, "int64_data"},
		{&onnx.Tensor{Type: onnx.Float, Dims: []int64{1}, Data: []float32{1}}, "float_data"},
	}
	for _, c := range cases {
		p, err := onnx.Encode(c.tensor, onnx.Typed)
		if err != nil {
			t.Fatal(err)
		}
		var set []string
		p.ProtoReflect().Range(func(fd protoreflectFieldDescriptor, _ protoreflectValue) bool {
			n := string(fd.Name())
			if strings.HasSuffix(n, "_data") {
				set = append(set, n)
			}
			return true
		})
		if len(set) != 1 || set[0] != c.field {
			t.Errorf("Encode(%s, Typed) stored in %v, want %s", c.tensor.Type, set, c.field)
		}
	}
	// fp16 bits in int32_data: 1.0 is 0x3c00.
	p, _ := onnx.Encode(&onnx.Tensor{Type: onnx.Float16, Dims: []int64{1}, Data: f16s(1)}, onnx.Typed)
	if p.Int32Data[0] != 0x3c00 {
		t.Errorf("fp16 1.0 stored as %#x, want 0x3c00", p.Int32Data[0])
	}
}

func TestDecodeErrors(t *testing.T) {
	f := int32(onnx.Float)
	s := int32(onnx.String)
	c := int32(99)
	cases := []struct {
		name string
		p    *onnxpb.TensorProto
		want string
	}{
		{"short raw", &onnxpb.TensorProto{Name: proto.String("w"), DataType: &f, Dims: []int64{4}, RawData: make([]byte, 15)}, `tensor "w": raw_data has 15 bytes`},
		{"short typed", &onnxpb.TensorProto{DataType: &f, Dims: []int64{2}, FloatData: []float32{1}}, "float_data has 1 values"},
		{"negative dim", &onnxpb.TensorProto{DataType: &f, Dims: []int64{-1}}, "negative"},
		{"overflow dims", &onnxpb.TensorProto{DataType: &f, Dims: []int64{1 << 40, 1 << 40}}, "too many elements"},
		{"strings count", &onnxpb.TensorProto{DataType: &s, Dims: []int64{2}, StringData: [][]byte{[]byte("a")}}, "string_data has 1"},
		{"unknown type", &onnxpb.TensorProto{DataType: &c, Dims: []int64{1}, RawData: []byte{0}}, "not supported"},
	}
	for _, tc := range cases {
		if _, err := onnx.Decode(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%s) = %v, want error containing %q", tc.name, err, tc.want)
		}
	}
}

// Every corpus test tensor decodes, and re-encoding it in both forms decodes
// to the same values.
func TestCorpusTensors(t *testing.T) {
	root := testutil.Corpus(t, "onnx-node")
	files, _ := filepath.Glob(filepath.Join(root, "*", "test_data_set_0", "*.pb"))
	more, _ := filepath.Glob(filepath.Join(root, "*", "*", "test_data_set_0", "*.pb"))
	files = append(files, more...)
	if len(files) < 100 {
		t.Fatalf("found %d corpus tensors, want >= 100", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		p := &onnxpb.TensorProto{}
		if err := proto.Unmarshal(b, p); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		tt, err := onnx.Decode(p)
		if err != nil {
			t.Errorf("Decode(%s) = %v", f, err)
			continue
		}
		for _, form := range []onnx.Storage{onnx.Raw, onnx.Typed} {
			p2, err := onnx.Encode(tt, form)
			if err != nil {
				t.Fatalf("Encode(%s) = %v", f, err)
			}
			t2, err := onnx.Decode(p2)
			if err != nil || !sameBits(tt.Data, t2.Data) {
				t.Errorf("%s: re-encoded tensor differs (form %d, err %v)", f, form, err)
			}
		}
	}
}

// sameBits compares slices treating NaN payloads as equal bit patterns.
func sameBits(a, b any) bool {
	if fa, ok := a.([]float32); ok {
		fb := b.([]float32)
		if len(fa) != len(fb) {
			return false
		}
		for i := range fa {
			if math.Float32bits(fa[i]) != math.Float32bits(fb[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func TestBF16Rounding(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, rounds to even
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, rounds to even (up)
		{math.Float32frombits(0x3f808001), 0x3f81},
	}
	for _, c := range cases {
		if got := onnx.BF16From(c.in); uint16(got) != c.want {
			t.Errorf("BF16From(%#x) = %#x, want %#x", math.Float32bits(c.in), uint16(got), c.want)
		}
	}
	if nan := onnx.BF16From(float32(math.NaN())).Float32(); nan == nan {
		t.Error("BF16From(NaN) is not NaN")
	}
}
