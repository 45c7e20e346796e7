package onnx

import (
	"encoding/binary"
	"fmt"
	"math"

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
	le := binary.LittleEndian
	switch d := t.Data.(type) {
	case []float32:
		b := make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b
	case []float64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], math.Float64bits(v))
		}
		return b
	case []float16.Float16:
		b := make([]byte, 2*len(d))
		for i, v := range d {
			le.PutUint16(b[2*i:], v.Bits())
		}
		return b
	case []BF16:
		b := make([]byte, 2*len(d))
		for i, v := range d {
			le.PutUint16(b[2*i:], uint16(v))
		}
		return b
	case []int8:
		if t.Type == Int4 {
			return pack4(len(d), func(i int) uint8 { return uint8(d[i]) })
		}
		b := make([]byte, len(d))
		for i, v := range d {
			b[i] = byte(v)
		}
		return b
	case []uint8:
		if t.Type == Uint4 {
			return pack4(len(d), func(i int) uint8 { return d[i] })
		}
		return append([]byte(nil), d...)
	case []int16:
		b := make([]byte, 2*len(d))
		for i, v := range d {
			le.PutUint16(b[2*i:], uint16(v))
		}
		return b
	case []uint16:
		b := make([]byte, 2*len(d))
		for i, v := range d {
			le.PutUint16(b[2*i:], v)
		}
		return b
	case []int32:
		b := make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(b[4*i:], uint32(v))
		}
		return b
	case []uint32:
		b := make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(b[4*i:], v)
		}
		return b
	case []int64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], uint64(v))
		}
		return b
	case []uint64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], v)
		}
		return b
	case []bool:
		b := make([]byte, len(d))
		for i, v := range d {
			if v {
				b[i] = 1
			}
		}
		return b
	case []complex64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint32(b[8*i:], math.Float32bits(real(v)))
			le.PutUint32(b[8*i+4:], math.Float32bits(imag(v)))
		}
		return b
	case []complex128:
		b := make([]byte, 16*len(d))
		for i, v := range d {
			le.PutUint64(b[16*i:], math.Float64bits(real(v)))
			le.PutUint64(b[16*i+8:], math.Float64bits(imag(v)))
		}
		return b
	}
	return nil
}

func toInt32[T any](d []T, f func(T) int32) []int32 {
	out := make([]int32, len(d))
	for i, v := range d {
		out[i] = f(v)
	}
	return out
}

func encodeTyped(p *onnxpb.TensorProto, t *Tensor) {
	switch d := t.Data.(type) {
	case []float32:
		p.FloatData = append([]float32{}, d...)
	case []complex64:
		p.FloatData = make([]float32, 0, 2*len(d))
		for _, v := range d {
			p.FloatData = append(p.FloatData, real(v), imag(v))
		}
	case []float64:
		p.DoubleData = append([]float64{}, d...)
	case []complex128:
		p.DoubleData = make([]float64, 0, 2*len(d))
		for _, v := range d {
			p.DoubleData = append(p.DoubleData, real(v), imag(v))
		}
	case []int64:
		p.Int64Data = append([]int64{}, d...)
	case []uint64:
		p.Uint64Data = append([]uint64{}, d...)
	case []uint32:
		p.Uint64Data = make([]uint64, len(d))
		for i, v := range d {
			p.Uint64Data[i] = uint64(v)
		}
	case []int32:
		p.Int32Data = append([]int32{}, d...)
	case []int16:
		p.Int32Data = toInt32(d, func(v int16) int32 { return int32(v) })
	case []uint16:
		p.Int32Data = toInt32(d, func(v uint16) int32 { return int32(v) })
	case []int8:
		if t.Type == Int4 {
			p.Int32Data = toInt32(RawBytes(t), func(v byte) int32 { return int32(v) })
			return
		}
		p.Int32Data = toInt32(d, func(v int8) int32 { return int32(v) })
	case []uint8:
		if t.Type == Uint4 {
			p.Int32Data = toInt32(RawBytes(t), func(v byte) int32 { return int32(v) })
			return
		}
		p.Int32Data = toInt32(d, func(v uint8) int32 { return int32(v) })
	case []bool:
		p.Int32Data = toInt32(d, func(v bool) int32 {
			if v {
				return 1
			}
			return 0
		})
	case []float16.Float16:
		p.Int32Data = toInt32(d, func(v float16.Float16) int32 { return int32(v.Bits()) })
	case []BF16:
		p.Int32Data = toInt32(d, func(v BF16) int32 { return int32(v) })
	}
}

// Float64s returns the elements of a real numeric tensor widened to float64,
// for comparisons and statistics.
func (t *Tensor) Float64s() ([]float64, error) {
	switch d := t.Data.(type) {
	case []float32:
		return widen(d, func(v float32) float64 { return float64(v) }), nil
	case []float64:
		return d, nil
	case []float16.Float16:
		return widen(d, func(v float16.Float16) float64 { return float64(v.Float32()) }), nil
	case []BF16:
		return widen(d, func(v BF16) float64 { return float64(v.Float32()) }), nil
	case []int8:
		return widen(d, func(v int8) float64 { return float64(v) }), nil
	case []int16:
		return widen(d, func(v int16) float64 { return float64(v) }), nil
	case []int32:
		return widen(d, func(v int32) float64 { return float64(v) }), nil
	case []int64:
		return widen(d, func(v int64) float64 { return float64(v) }), nil
	case []uint8:
		if isFloat8(t.Type) {
			return nil, fmt.Errorf("tensor %q: %s values cannot be widened", t.Name, t.Type)
		}
		return widen(d, func(v uint8) float64 { return float64(v) }), nil
	case []uint16:
		return widen(d, func(v uint16) float64 { return float64(v) }), nil
	case []uint32:
		return widen(d, func(v uint32) float64 { return float64(v) }), nil
	case []uint64:
		return widen(d, func(v uint64) float64 { return float64(v) }), nil
	case []bool:
		return widen(d, func(v bool) float64 {
			if v {
				return 1
			}
			return 0
		}), nil
	}
	return nil, fmt.Errorf("tensor %q: %s values are not real numbers", t.Name, t.Type)
}

func widen[T any](d []T, f func(T) float64) []float64 {
	out := make([]float64, len(d))
	for i, v := range d {
		out[i] = f(v)
	}
	return out
}
