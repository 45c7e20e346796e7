package onnx

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
)

// BF16 is a bfloat16 value kept as its 16-bit pattern (the top half of a float32).
type BF16 uint16

// Float32 widens the value exactly.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// BF16From rounds a float32 to the nearest bfloat16 (ties to even); NaN stays NaN.
func BF16From(f float32) BF16 {
	u := math.Float32bits(f)
	if f != f {
		return BF16(u>>16 | 0x40)
	}
	u += 0x7fff + (u>>16)&1
	return BF16(u >> 16)
}

// Tensor is a decoded tensor: its element type, dimensions and a Go slice
// holding the elements in row-major order. Data's Go type follows Type:
//
//	Float []float32, Double []float64, Float16 []float16.Float16, BFloat16 []BF16,
//	Int8 []int8, Int16 []int16, Int32 []int32, Int64 []int64,
//	Uint8 []uint8, Uint16 []uint16, Uint32 []uint32, Uint64 []uint64,
//	Bool []bool, String []string, Complex64 []complex64, Complex128 []complex128,
//	Int4 []int8 and Uint4 []uint8 (one element per value, unpacked),
//	the float8 types []uint8 (bit patterns).
type Tensor struct {
	Name string
	Type DataType
	Dims []int64
	Data any
}

// ErrExternalData is returned when a tensor's data lives in an external file
// that was not loaded (see LoadOptions).
var ErrExternalData = errors.New("tensor data is stored externally and was not loaded")

// NumElements returns the product of dims (1 for a scalar), or an error for
// negative dimensions or a product that does not fit in an int.
func NumElements(dims []int64) (int, error) {
	n := uint64(1)
	for i, d := range dims {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d is negative (%d)", i, d)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt32*uint64(1<<16) {
			return 0, fmt.Errorf("shape %v has too many elements", dims)
		}
		n = lo
	}
	return int(n), nil
}

// Len returns the number of elements in Data.
func (t *Tensor) Len() int {
	switch d := t.Data.(type) {
	case []float32:
		return len(d)
	case []float64:
		return len(d)
	case []float16.Float16:
		return len(d)
	case []BF16:
		return len(d)
	case []int8:
		return len(d)
	case []int16:
		return len(d)
	case []int32:
		return len(d)
	case []int64:
		return len(d)
	case []uint8:
		return len(d)
	case []uint16:
		return len(d)
	case []uint32:
		return len(d)
	case []uint64:
		return len(d)
	case []bool:
		return len(d)
	case []string:
		return len(d)
	case []complex64:
		return len(d)
	case []complex128:
		return len(d)
	}
	return 0
}

// NewTensor builds a tensor whose type is inferred from data's Go type
// ([]int8 is Int8, []uint8 is Uint8, ...). It checks that the element count matches dims.
func NewTensor(name string, dims []int64, data any) (*Tensor, error) {
	dt, err := typeOfSlice(data)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	t := &Tensor{Name: name, Type: dt, Dims: clone(dims), Data: data}
	n, err := NumElements(dims)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	if t.Len() != n {
		return nil, fmt.Errorf("tensor %q: %d elements for shape %v (want %d)", name, t.Len(), dims, n)
	}
	return t, nil
}

func typeOfSlice(data any) (DataType, error) {
	switch data.(type) {
	case []float32:
		return Float, nil
	case []float64:
		return Double, nil
	case []float16.Float16:
		return Float16, nil
	case []BF16:
		return BFloat16, nil
	case []int8:
		return Int8, nil
	case []int16:
		return Int16, nil
	case []int32:
		return Int32, nil
	case []int64:
		return Int64, nil
	case []uint8:
		return Uint8, nil
	case []uint16:
		return Uint16, nil
	case []uint32:
		return Uint32, nil
	case []uint64:
		return Uint64, nil
	case []bool:
		return Bool, nil
	case []string:
		return String, nil
	case []complex64:
		return Complex64, nil
	case []complex128:
		return Complex128, nil
	}
	return Undefined, fmt.Errorf("unsupported element slice %T", data)
}

// is4bit reports whether dt packs two elements into a byte, which no
// element-wise codec can handle.
func is4bit(dt DataType) bool { return dt == Int4 || dt == Uint4 }

func isFloat8(dt DataType) bool {
	switch dt {
	case Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ, Float8E8M0:
		return true
	}
	return false
}

// Decode reads a TensorProto's elements from whichever storage field holds
// them. It never panics on malformed input: sizes are checked before anything
// is allocated.
func Decode(p *onnxpb.TensorProto) (*Tensor, error) {
	t, err := decode(p)
	if err != nil {
		if p.GetName() != "" {
			return nil, fmt.Errorf("tensor %q: %w", p.GetName(), err)
		}
		return nil, err
	}
	return t, nil
}

func decode(p *onnxpb.TensorProto) (*Tensor, error) {
	dt := DataType(p.GetDataType())
	t := &Tensor{Name: p.GetName(), Type: dt, Dims: append([]int64(nil), p.GetDims()...)}
	if p.GetSegment() != nil {
		return nil, errors.New("segmented tensors are not supported")
	}
	n, err := NumElements(p.Dims)
	if err != nil {
		return nil, err
	}
	if p.GetDataLocation() == onnxpb.TensorProto_EXTERNAL && p.RawData == nil {
		return nil, ErrExternalData
	}
	if dt == String {
		if len(p.StringData) != n {
			return nil, fmt.Errorf("string_data has %d elements, shape %v needs %d", len(p.StringData), p.Dims, n)
		}
		s := make([]string, n)
		for i, b := range p.StringData {
			s[i] = string(b)
		}
		t.Data = s
		return t, nil
	}
	if p.RawData != nil {
		return t, decodeRaw(t, p.RawData, n)
	}
	return t, decodeTyped(t, p, n)
}

func decodeRaw(t *Tensor, raw []byte, n int) error {
	dt := t.Type
	want := n * dt.Size()
	if is4bit(dt) {
		want = (n + 1) / 2
	} else if dt.Size() == 0 {
		return fmt.Errorf("raw_data is not supported for element type %s", dt)
	}
	if len(raw) != want {
		return fmt.Errorf("raw_data has %d bytes, %s%v needs %d", len(raw), dt, t.Dims, want)
	}
	switch c, ok := codecs[dt]; {
	case is4bit(dt):
		t.Data = unpack4(raw, n, dt == Int4)
	case ok:
		t.Data = c.fromRaw(raw)
	default:
		return fmt.Errorf("element type %s is not supported", dt)
	}
	return nil
}

func unpack4(packed []byte, n int, signed bool) any {
	get := func(i int) uint8 {
		b := packed[i/2]
		if i%2 == 1 {
			return b >> 4
		}
		return b & 0x0f
	}
	if signed {
		d := make([]int8, n)
		for i := range d {
			d[i] = int8(get(i)<<4) >> 4
		}
		return d
	}
	d := make([]uint8, n)
	for i := range d {
		d[i] = get(i)
	}
	return d
}

func pack4(n int, get func(i int) uint8) []byte {
	out := make([]byte, (n+1)/2)
	for i := 0; i < n; i++ {
		v := get(i) & 0x0f
		if i%2 == 1 {
			out[i/2] |= v << 4
		} else {
			out[i/2] |= v
		}
	}
	return out
}

func countErr(field string, have int, t *Tensor, n int) error {
	return fmt.Errorf("%s has %d values, %s%v needs %d", field, have, t.Type, t.Dims, n)
}

// decodeTyped reads the repeated field ONNX assigns to t's element type.
func decodeTyped(t *Tensor, p *onnxpb.TensorProto, n int) error {
	switch dt := t.Type; {
	case dt == Float:
		return typed(t, "float_data", p.FloatData, n, clone[float32])
	case dt == Complex64:
		return typed(t, "float_data", p.FloatData, 2*n, func(v []float32) []complex64 {
			return complexes(v, func(re, im float32) complex64 { return complex(re, im) })
		})
	case dt == Double:
		return typed(t, "double_data", p.DoubleData, n, clone[float64])
	case dt == Complex128:
		return typed(t, "double_data", p.DoubleData, 2*n, func(v []float64) []complex128 {
			return complexes(v, func(re, im float64) complex128 { return complex(re, im) })
		})
	case dt == Int64:
		return typed(t, "int64_data", p.Int64Data, n, clone[int64])
	case dt == Uint64:
		return typed(t, "uint64_data", p.Uint64Data, n, clone[uint64])
	case dt == Uint32:
		return typed(t, "uint64_data", p.Uint64Data, n, convert[uint32, uint64])
	case is4bit(dt):
		return typed(t, "int32_data", p.Int32Data, (n+1)/2, func(v []int32) any {
			return unpack4(convert[byte](v), n, dt == Int4)
		})
	case codecs[dt].fromInt32 != nil:
		return typed(t, "int32_data", p.Int32Data, n, codecs[dt].fromInt32)
	}
	return fmt.Errorf("element type %s is not supported", t.Type)
}

// typed stores conv(src) as t's data once src, the named typed field, is
// known to hold the want values t's shape needs.
func typed[S, D any](t *Tensor, field string, src []S, want int, conv func([]S) D) error {
	if len(src) != want {
		return countErr(field, len(src), t, want)
	}
	t.Data = conv(src)
	return nil
}

// clone copies a slice, returning an empty non-nil slice for empty input so
// decoded tensors compare equal however they were stored.
func clone[T any](s []T) []T {
	out := make([]T, len(s))
	copy(out, s)
	return out
}
