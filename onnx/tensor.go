package onnx

import (
	"encoding/binary"
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

// goElems is how many Go slice elements a tensor of n elements needs per
// storage unit; complex types use 2 float scalars per element in typed storage.
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
	le := binary.LittleEndian
	switch dt {
	case Float:
		d := make([]float32, n)
		for i := range d {
			d[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
		t.Data = d
	case Double:
		d := make([]float64, n)
		for i := range d {
			d[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
		t.Data = d
	case Float16:
		d := make([]float16.Float16, n)
		for i := range d {
			d[i] = float16.Frombits(le.Uint16(raw[2*i:]))
		}
		t.Data = d
	case BFloat16:
		d := make([]BF16, n)
		for i := range d {
			d[i] = BF16(le.Uint16(raw[2*i:]))
		}
		t.Data = d
	case Int8:
		d := make([]int8, n)
		for i := range d {
			d[i] = int8(raw[i])
		}
		t.Data = d
	case Uint8:
		t.Data = clone(raw)
	case Int16:
		d := make([]int16, n)
		for i := range d {
			d[i] = int16(le.Uint16(raw[2*i:]))
		}
		t.Data = d
	case Uint16:
		d := make([]uint16, n)
		for i := range d {
			d[i] = le.Uint16(raw[2*i:])
		}
		t.Data = d
	case Int32:
		d := make([]int32, n)
		for i := range d {
			d[i] = int32(le.Uint32(raw[4*i:]))
		}
		t.Data = d
	case Uint32:
		d := make([]uint32, n)
		for i := range d {
			d[i] = le.Uint32(raw[4*i:])
		}
		t.Data = d
	case Int64:
		d := make([]int64, n)
		for i := range d {
			d[i] = int64(le.Uint64(raw[8*i:]))
		}
		t.Data = d
	case Uint64:
		d := make([]uint64, n)
		for i := range d {
			d[i] = le.Uint64(raw[8*i:])
		}
		t.Data = d
	case Bool:
		d := make([]bool, n)
		for i := range d {
			d[i] = raw[i] != 0
		}
		t.Data = d
	case Complex64:
		d := make([]complex64, n)
		for i := range d {
			d[i] = complex(math.Float32frombits(le.Uint32(raw[8*i:])), math.Float32frombits(le.Uint32(raw[8*i+4:])))
		}
		t.Data = d
	case Complex128:
		d := make([]complex128, n)
		for i := range d {
			d[i] = complex(math.Float64frombits(le.Uint64(raw[16*i:])), math.Float64frombits(le.Uint64(raw[16*i+8:])))
		}
		t.Data = d
	case Int4, Uint4:
		t.Data = unpack4(raw, n, dt == Int4)
	default:
		if isFloat8(dt) {
			t.Data = clone(raw)
			return nil
		}
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

func decodeTyped(t *Tensor, p *onnxpb.TensorProto, n int) error {
	switch t.Type {
	case Float:
		if len(p.FloatData) != n {
			return countErr("float_data", len(p.FloatData), t, n)
		}
		t.Data = clone(p.FloatData)
	case Complex64:
		if len(p.FloatData) != 2*n {
			return countErr("float_data", len(p.FloatData), t, 2*n)
		}
		d := make([]complex64, n)
		for i := range d {
			d[i] = complex(p.FloatData[2*i], p.FloatData[2*i+1])
		}
		t.Data = d
	case Double:
		if len(p.DoubleData) != n {
			return countErr("double_data", len(p.DoubleData), t, n)
		}
		t.Data = clone(p.DoubleData)
	case Complex128:
		if len(p.DoubleData) != 2*n {
			return countErr("double_data", len(p.DoubleData), t, 2*n)
		}
		d := make([]complex128, n)
		for i := range d {
			d[i] = complex(p.DoubleData[2*i], p.DoubleData[2*i+1])
		}
		t.Data = d
	case Int64:
		if len(p.Int64Data) != n {
			return countErr("int64_data", len(p.Int64Data), t, n)
		}
		t.Data = clone(p.Int64Data)
	case Uint32, Uint64:
		if len(p.Uint64Data) != n {
			return countErr("uint64_data", len(p.Uint64Data), t, n)
		}
		if t.Type == Uint64 {
			t.Data = clone(p.Uint64Data)
			return nil
		}
		d := make([]uint32, n)
		for i, v := range p.Uint64Data {
			d[i] = uint32(v)
		}
		t.Data = d
	case Int4, Uint4:
		if len(p.Int32Data) != (n+1)/2 {
			return countErr("int32_data", len(p.Int32Data), t, (n+1)/2)
		}
		packed := make([]byte, len(p.Int32Data))
		for i, v := range p.Int32Data {
			packed[i] = byte(v)
		}
		t.Data = unpack4(packed, n, t.Type == Int4)
	case Int32, Int16, Int8, Uint16, Uint8, Bool, Float16, BFloat16:
		if len(p.Int32Data) != n {
			return countErr("int32_data", len(p.Int32Data), t, n)
		}
		src := p.Int32Data
		switch t.Type {
		case Int32:
			t.Data = clone(src)
		case Int16:
			t.Data = convertInts(src, func(v int32) int16 { return int16(v) })
		case Int8:
			t.Data = convertInts(src, func(v int32) int8 { return int8(v) })
		case Uint16:
			t.Data = convertInts(src, func(v int32) uint16 { return uint16(v) })
		case Uint8:
			t.Data = convertInts(src, func(v int32) uint8 { return uint8(v) })
		case Bool:
			t.Data = convertInts(src, func(v int32) bool { return v != 0 })
		case Float16:
			t.Data = convertInts(src, func(v int32) float16.Float16 { return float16.Frombits(uint16(v)) })
		case BFloat16:
			t.Data = convertInts(src, func(v int32) BF16 { return BF16(uint16(v)) })
		}
	default:
		if isFloat8(t.Type) {
			if len(p.Int32Data) != n {
				return countErr("int32_data", len(p.Int32Data), t, n)
			}
			t.Data = convertInts(p.Int32Data, func(v int32) uint8 { return uint8(v) })
			return nil
		}
		return fmt.Errorf("element type %s is not supported", t.Type)
	}
	return nil
}

func convertInts[T any](src []int32, f func(int32) T) []T {
	d := make([]T, len(src))
	for i, v := range src {
		d[i] = f(v)
	}
	return d
}

// clone copies a slice, returning an empty non-nil slice for empty input so
// decoded tensors compare equal however they were stored.
func clone[T any](s []T) []T {
	out := make([]T, len(s))
	copy(out, s)
	return out
}
