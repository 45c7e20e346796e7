package onnx

import (
	"github.com/kiln-ml/kiln/internal/le"
	"github.com/x448/float16"
)

// codec decodes and encodes the values of one element type, stored one
// value per element, in the Go type Tensor documents for it. Each is the
// generic code instantiated for that type, so that every element type
// shares one implementation of each storage form.
type codec struct {
	fromRaw   func(raw []byte) any
	toRaw     func(data any) []byte
	fromInt32 func(v []int32) any    // nil: not stored in int32_data
	toInt32   func(data any) []int32 // nil: not stored in int32_data
}

// codecs holds every element type but strings and the 4-bit types. Keys of
// the same Go type (uint8 and the float8 types) share encoders, which are
// looked up by the Go type of the data.
var codecs = map[DataType]codec{
	Float: numeric[float32](), Double: numeric[float64](),
	Complex64: numeric[complex64](), Complex128: numeric[complex128](),
	Int64: numeric[int64](), Uint32: numeric[uint32](), Uint64: numeric[uint64](),
	// int32_data holds the 32-bit and smaller types, half floats as bit patterns.
	Int32: inInt32[int32](), Int16: inInt32[int16](), Int8: inInt32[int8](),
	Uint16: inInt32[uint16](), Uint8: inInt32[uint8](),
	Float16: inInt32[float16.Float16](), BFloat16: inInt32[BF16](),
	Float8E4M3FN: inInt32[uint8](), Float8E4M3FNUZ: inInt32[uint8](), Float8E5M2: inInt32[uint8](),
	Float8E5M2FNUZ: inInt32[uint8](), Float8E8M0: inInt32[uint8](),
	// Bools are one byte in raw_data, anything but 0 being true.
	Bool: {
		fromRaw:   func(raw []byte) any { return nonZero(raw) },
		toRaw:     func(data any) []byte { return zeroOne[byte](data.([]bool)) },
		fromInt32: func(v []int32) any { return nonZero(v) },
		toInt32:   func(data any) []int32 { return zeroOne[int32](data.([]bool)) },
	},
}

// numeric is the codec of a type stored in raw_data or in a typed field
// of its own (float_data, double_data, int64_data, uint64_data).
func numeric[T le.Number]() codec {
	return codec{
		fromRaw: func(raw []byte) any { return le.Decode[T](raw) },
		toRaw:   func(data any) []byte { return le.Encode(data.([]T)) },
	}
}

// inInt32 is the codec of an integer type (or bit pattern) that the typed
// form stores in int32_data, one value per element.
func inInt32[T le.Integer]() codec {
	c := numeric[T]()
	c.fromInt32 = func(v []int32) any { return convert[T](v) }
	c.toInt32 = func(data any) []int32 { return convert[int32](data.([]T)) }
	return c
}

// convert converts every element as Go's T(v) does: integers wrap or
// extend, bit patterns (float16, BF16) take the low 16 bits. Being generic
// over the types rather than taking a function, it compiles to a plain loop.
func convert[T, S le.Real](src []S) []T {
	if same, ok := any(src).([]T); ok {
		return clone(same) // a copy without zeroing the new slice first
	}
	d := make([]T, len(src))
	for i, v := range src {
		d[i] = T(v)
	}
	return d
}

// mapSlice applies f to every element, for conversions convert cannot do.
func mapSlice[T, S any](src []S, f func(S) T) []T {
	d := make([]T, len(src))
	for i, v := range src {
		d[i] = f(v)
	}
	return d
}

func nonZero[S le.Integer](src []S) []bool {
	d := make([]bool, len(src))
	for i, v := range src {
		d[i] = v != 0
	}
	return d
}

func zeroOne[T le.Real](src []bool) []T {
	d := make([]T, len(src))
	for i, v := range src {
		var x T // assigned in full, so that the loop has no branch to mispredict
		if v {
			x = 1
		}
		d[i] = x
	}
	return d
}

// complexes pairs up consecutive real and imaginary parts, the layout of
// complex values in float_data and double_data. (Go's complex builtin does
// not take type parameters, hence mk; given as a literal, it is inlined.)
func complexes[C any, F le.Float](parts []F, mk func(re, im F) C) []C {
	d := make([]C, len(parts)/2)
	for i := range d {
		d[i] = mk(parts[2*i], parts[2*i+1])
	}
	return d
}

// parts is the inverse of complexes.
func parts[F le.Float, C any](d []C, split func(C) (re, im F)) []F {
	out := make([]F, 2*len(d))
	for i, v := range d {
		out[2*i], out[2*i+1] = split(v)
	}
	return out
}
