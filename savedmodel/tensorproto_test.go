package savedmodel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// everyType is a stored tensor of each element type.
var everyType = []stored{
	{key: "f32", dtype: smpb.DataType_DT_FLOAT, dims: []int64{2, 2}, data: []float32{1.5, -2, 3e-38, 0}},
	{key: "f64", dtype: smpb.DataType_DT_DOUBLE, dims: []int64{2}, data: []float64{1e300, -0.25}},
	{key: "f16", dtype: smpb.DataType_DT_HALF, dims: []int64{2}, data: []float16.Float16{float16.Fromfloat32(1.5), float16.Fromfloat32(-3)}},
	{key: "bf16", dtype: smpb.DataType_DT_BFLOAT16, dims: []int64{1}, data: []onnx.BF16{onnx.BF16From(2.5)}},
	{key: "i8", dtype: smpb.DataType_DT_INT8, dims: []int64{3}, data: []int8{-128, 0, 127}},
	{key: "i16", dtype: smpb.DataType_DT_INT16, dims: []int64{2}, data: []int16{-300, 300}},
	{key: "i32", dtype: smpb.DataType_DT_INT32, dims: []int64{}, data: []int32{-7}},
	{key: "i64", dtype: smpb.DataType_DT_INT64, dims: []int64{2}, data: []int64{1 << 40, -1}},
	{key: "u8", dtype: smpb.DataType_DT_UINT8, dims: []int64{2}, data: []uint8{0, 255}},
	{key: "u16", dtype: smpb.DataType_DT_UINT16, dims: []int64{1}, data: []uint16{65535}},
	{key: "u32", dtype: smpb.DataType_DT_UINT32, dims: []int64{1}, data: []uint32{1 << 31}},
	{key: "u64", dtype: smpb.DataType_DT_UINT64, dims: []int64{1}, data: []uint64{1 << 63}},
	{key: "c64", dtype: smpb.DataType_DT_COMPLEX64, dims: []int64{1}, data: []complex64{complex(1, -2)}},
	{key: "c128", dtype: smpb.DataType_DT_COMPLEX128, dims: []int64{1}, data: []complex128{complex(3, 4)}},
	{key: "qi8", dtype: smpb.DataType_DT_QINT8, dims: []int64{1}, data: []int8{-5}},
	// Bool bytes other than 0 and 1 are true, and encode as 1.
	{key: "bool", dtype: smpb.DataType_DT_BOOL, dims: []int64{4}, data: []uint8{0, 2, 1, 255}},
	{key: "str", dtype: smpb.DataType_DT_STRING, dims: []int64{2}, data: []string{"a", "bc"}},
	// Empty tensors: an empty raw_data, or none at all for uint8.
	{key: "empty_f32", dtype: smpb.DataType_DT_FLOAT, dims: []int64{0, 3}, data: []float32{}},
	{key: "empty_u8", dtype: smpb.DataType_DT_UINT8, dims: []int64{0}, data: []uint8{}},
	{key: "empty_bool", dtype: smpb.DataType_DT_BOOL, dims: []int64{0}, data: []bool{}},
}

// TensorProto keeps the stored bytes as raw_data; the initializer must be
// the one encoding the decoded tensor gives, byte for byte, for every type:
// Convert's ONNX did not change when it stopped decoding variables.
func TestTensorProtoIsEncode(t *testing.T) {
	ctx := context.Background()
	tensors := everyType
	prefix := writeBundle(t, filepath.Join(t.TempDir(), "variables", "variables"), 1, tensors)
	b, err := OpenBundle(ctx, nil, prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range tensors {
		p, err := b.TensorProto(ctx, s.key)
		if err != nil {
			t.Fatalf("TensorProto(%s) = %v", s.key, err)
		}
		dec, err := onnx.Decode(p)
		if err != nil {
			t.Fatalf("Decode(TensorProto(%s)) = %v", s.key, err)
		}
		if want := encoded(t, dec); !sameBytes(p, want) || p.GetName() != s.key {
			t.Errorf("TensorProto(%s) = %v, want %v (what Encode writes)", s.key, p, want)
		}
	}
	if got, _ := b.Tensor(ctx, "bool"); !reflect.DeepEqual(got.Data, []bool{false, true, true, true}) {
		t.Errorf("Tensor(bool) = %v, want [false true true true]", got.Data)
	}
}

// A big tensor is read into one buffer of its size, checked while it is
// read: a flipped byte in its last chunk, and a shard that ends inside it,
// are both caught and name the key and the file.
func TestTensorProtoBig(t *testing.T) {
	ctx := context.Background()
	const n = 3*readChunk/4 + 1001 // floats over three read chunks, not a multiple
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(i%251) - 100
	}
	prefix := writeBundle(t, filepath.Join(t.TempDir(), "variables", "variables"), 1,
		[]stored{{key: "w", dtype: smpb.DataType_DT_FLOAT, dims: []int64{n}, data: w}})
	b, err := OpenBundle(ctx, nil, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	p, err := b.TensorProto(ctx, "w")
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4*n+64<<10 {
		t.Errorf("TensorProto of a %d-byte tensor allocated %d bytes, want one buffer of its size", 4*n, alloc)
	}
	if got, _ := b.Tensor(ctx, "w"); !reflect.DeepEqual(got.Data, w) || len(p.GetRawData()) != 4*n {
		t.Errorf("Tensor(w) does not read back what was written")
	}
	file := DataFile(prefix, 0, 1)
	flipByte(t, file, 4*n-3)
	if _, err := b.TensorProto(ctx, "w"); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), `"w"`) || !strings.Contains(err.Error(), file) {
		t.Errorf("TensorProto(w) with its last chunk corrupt = %v, want ErrChecksum naming w and %s", err, file)
	}
	if err := os.Truncate(file, readChunk+100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TensorProto(ctx, "w"); err == nil || !strings.Contains(err.Error(), "file ends") || !strings.Contains(err.Error(), file) {
		t.Errorf("TensorProto(w) of a truncated shard = %v, want an error naming %s", err, file)
	}
}

func encoded(t *testing.T, x *onnx.Tensor) *onnxpb.TensorProto {
	t.Helper()
	p, err := onnx.Encode(x, onnx.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sameBytes is whether a and b marshal to the same bytes.
func sameBytes(a, b *onnxpb.TensorProto) bool {
	det := proto.MarshalOptions{Deterministic: true}
	x, _ := det.Marshal(a)
	y, _ := det.Marshal(b)
	return string(x) == string(y)
}

// A Const's tensor_content becomes raw_data as it is; the initializer is
// still what encoding TensorFromProto's tensor gives, and a wrong byte
// count fails as TensorFromProto does.
func TestInitializerFromProto(t *testing.T) {
	for _, s := range everyType {
		if s.dtype == smpb.DataType_DT_STRING {
			continue
		}
		raw, _, err := smtest.Bytes(smtest.Tensor{Key: s.key, DType: s.dtype, Dims: s.dims, Data: s.data})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []*smpb.TensorProto{
			{Dtype: s.dtype, TensorShape: shapeProto(s.dims), TensorContent: raw},
			{Dtype: s.dtype, TensorShape: shapeProto(s.dims), TensorContent: raw[:max(len(raw)-1, 0)]},
		} {
			got, err := InitializerFromProto(p, "c:0")
			x, xerr := TensorFromProto(p)
			if xerr != nil {
				if err == nil || err.Error() != xerr.Error() {
					t.Errorf("%s, %d bytes: InitializerFromProto = %v, want TensorFromProto's error %v", s.key, len(raw), err, xerr)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: InitializerFromProto = %v", s.key, err)
			}
			x.Name = "c:0"
			if want := encoded(t, x); !sameBytes(got, want) {
				t.Errorf("%s: InitializerFromProto = %v, want %v", s.key, got, want)
			}
		}
	}
	p := &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shapeProto([]int64{3}), FloatVal: []float32{2}}
	got, err := InitializerFromProto(p, "k")
	if err != nil || !sameBytes(got, encoded(t, &onnx.Tensor{Name: "k", Type: onnx.Float, Dims: []int64{3}, Data: []float32{2, 2, 2}})) {
		t.Errorf("InitializerFromProto(float_val [2], shape [3]) = %v, %v, want [2 2 2]", got, err)
	}
}
