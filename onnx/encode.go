package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
)

// Storage selects which TensorProto field Encode writes.
type Storage int

const (
	// Raw writes little-endian bytes to raw_data (strings still use string_data).
	Raw Storage = iota
	// Typed writes the type's repeated field: float_data, int32_data (also for
	// 8/16-bit integers, bool, and fp16/bf16 bit patterns), int64_data,
	// double_data, uint64_data or string_data.
	Typed
)

// Encode writes t as a TensorProto in the given storage form.
func Encode(t *Tensor, form Storage) (*onnxpb.TensorProto, error) {
	n, err := NumElements(t.Dims)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	want, err := typeOfSlice(t.Data)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if want != t.Type && !compatibleSlice(t.Type, want) {
		return nil, fmt.Errorf("tensor %q: element type %s cannot be stored from %T", t.Name, t.Type, t.Data)
	}
	if t.Len() != n {
		return nil, fmt.Errorf("tensor %q: %d elements for shape %v (want %d)", t.Name, t.Len(), t.Dims, n)
	}
	dt := int32(t.Type)
	p := &onnxpb.TensorProto{DataType: &dt, Dims: append([]int64(nil), t.Dims...)}
	if t.Name != "" {
		p.Name = &t.Name
	}
	if s, ok := t.Data.([]string); ok {
		p.StringData = make([][]byte, len(s))
		for i, v := range s {
			p.StringData[i] = []byte(v)
		}
		return p, nil
	}
	if form == Raw {
		p.RawData = RawBytes(t)
		return p, nil
	}
	encodeTyped(p, t)
	return p, nil
}

// compatibleSlice lists the element types stored in another type's Go slice.
func compatibleSlice(dt, slice DataType) bool {
	switch slice {
	case Int8:
		return dt == Int4
	case Uint8:
		return dt == Uint4 || isFloat8(dt)
	}
	return false
}

// RawBytes returns the tensor's elements as little-endian bytes in the
// layout of TensorProto.raw_data (4-bit types packed two per byte).
func RawBytes(t *Tensor) []byte {
	switch d := t.Data.(type) {
	case []int8:
		if t.Type == Int4 {
			return pack4(len(d), func(i int) uint8 { return uint8(d[i]) })
		}
	case []uint8:
		if t.Type == Uint4 {
			return pack4(len(d), func(i int) uint8 { return d[i] })
		}
		// Not le.Encode: an empty uint8 tensor has always had no raw_data.
		return append([]byte(nil), d...)
	}
	if c, ok := codecOfSlice(t.Data); ok {
		return c.toRaw(t.Data)
	}
	return nil
}

// codecOfSlice returns the codec of the element type data's Go type holds.
func codecOfSlice(data any) (codec, bool) {
	dt, err := typeOfSlice(data)
	if err != nil {
		return codec{}, false
	}
	c, ok := codecs[dt]
	return c, ok
}

// encodeTyped writes the repeated field ONNX assigns to t's element type.
func encodeTyped(p *onnxpb.TensorProto, t *Tensor) {
	switch d := t.Data.(type) {
	case []float32:
		p.FloatData = clone(d)
	case []complex64:
		p.FloatData = parts(d, func(v complex64) (float32, float32) { return real(v), imag(v) })
	case []float64:
		p.DoubleData = clone(d)
	case []complex128:
		p.DoubleData = parts(d, func(v complex128) (float64, float64) { return real(v), imag(v) })
	case []int64:
		p.Int64Data = clone(d)
	case []uint64:
		p.Uint64Data = clone(d)
	case []uint32:
		p.Uint64Data = convert[uint64](d)
	default:
		if is4bit(t.Type) {
			p.Int32Data = convert[int32](RawBytes(t))
		} else if c, ok := codecOfSlice(d); ok && c.toInt32 != nil {
			p.Int32Data = c.toInt32(d)
		}
	}
}

// Float64s returns the elements of a real numeric tensor widened to float64,
// for comparisons and statistics.
func (t *Tensor) Float64s() ([]float64, error) {
	switch d := t.Data.(type) {
	case []float32:
		return convert[float64](d), nil
	case []float64:
		return d, nil
	case []float16.Float16:
		return mapSlice(d, func(v float16.Float16) float64 { return float64(v.Float32()) }), nil
	case []BF16:
		return mapSlice(d, func(v BF16) float64 { return float64(v.Float32()) }), nil
	case []int8:
		return convert[float64](d), nil
	case []int16:
		return convert[float64](d), nil
	case []int32:
		return convert[float64](d), nil
	case []int64:
		return convert[float64](d), nil
	case []uint8:
		if isFloat8(t.Type) {
			return nil, fmt.Errorf("tensor %q: %s values cannot be widened", t.Name, t.Type)
		}
		return convert[float64](d), nil
	case []uint16:
		return convert[float64](d), nil
	case []uint32:
		return convert[float64](d), nil
	case []uint64:
		return convert[float64](d), nil
	case []bool:
		return zeroOne[float64](d), nil
	}
	return nil, fmt.Errorf("tensor %q: %s values are not real numbers", t.Name, t.Type)
}
