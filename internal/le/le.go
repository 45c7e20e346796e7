// Package le converts slices of fixed-size numbers to and from their
// little-endian bytes, the layout of ONNX's TensorProto.raw_data (and of
// .npy data and TensorFlow's tensor_content). The conversions are generic,
// so one implementation serves every element type, named types over the
// basic ones included (float16.Float16 and onnx.BF16 are bit patterns in a
// uint16 and convert as uint16 does).
//
// On little-endian hosts the bytes are the values' own memory and a
// conversion is a single copy, faster than decoding value by value; on
// big-endian hosts each value's bytes are reversed after the copy.
package le

import (
	"encoding/binary"
	"reflect"
	"slices"
	"unsafe"
)

// Integer is a fixed-size integer type.
type Integer interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

// Float is a floating-point type.
type Float interface{ ~float32 | ~float64 }

// Complex is a complex type: two floats, real part first.
type Complex interface{ ~complex64 | ~complex128 }

// Real is a fixed-size integer or floating-point type: the types between
// which Go converts values with T(v).
type Real interface{ Integer | Float }

// Number is a fixed-size numeric type, one that has a little-endian layout.
type Number interface{ Integer | Float | Complex }

// Size is the number of bytes one T takes.
func Size[T Number]() int {
	var v T
	return int(unsafe.Sizeof(v))
}

// Decode returns src read as consecutive little-endian Ts; a trailing
// partial value is ignored. The result is a new slice, non-nil also when
// empty (decoded tensors compare equal however they were stored).
func Decode[T Number](src []byte) []T {
	return decode[T](src, littleHost)
}

// Encode returns the little-endian bytes of s in a new slice, non-nil also
// when s is empty (an empty raw_data field is still present).
func Encode[T Number](s []T) []byte {
	return encode(s, littleHost)
}

// littleHost is whether this machine's memory order is ONNX's byte order.
var littleHost = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// decode and encode take the host's order as a parameter so that the tests
// run the big-endian path on little-endian machines too.
func decode[T Number](src []byte, little bool) []T {
	if b, ok := any(src).([]T); ok {
		// T is byte: make followed by copy of the same type is the one
		// allocation Go does not zero first.
		out := make([]T, len(b))
		copy(out, b)
		return out
	}
	out := make([]T, len(src)/Size[T]())
	b := bytesOf(out)
	copy(b, src)
	if !little {
		swap[T](b)
	}
	return out
}

func encode[T Number](s []T, little bool) []byte {
	out := make([]byte, len(s)*Size[T]())
	copy(out, bytesOf(s))
	if !little {
		swap[T](out)
	}
	return out
}

// bytesOf views the memory of s as bytes, in host order.
func bytesOf[T Number](s []T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*Size[T]())
}

// swap reverses the bytes of every number in b, the memory of a []T; it
// converts either way between host and little-endian order on a big-endian
// host. A complex number's parts each have their own byte order.
func swap[T Number](b []byte) {
	n := Size[T]()
	if k := reflect.TypeFor[T]().Kind(); k == reflect.Complex64 || k == reflect.Complex128 {
		n /= 2
	}
	for i := 0; i+n <= len(b); i += n {
		slices.Reverse(b[i : i+n])
	}
}
