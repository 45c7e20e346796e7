package kserve

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/internal/le"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// decodeBinary converts the binary data of one tensor (Triton's binary
// tensor data extension): little-endian elements without padding, BOOL as
// one byte 0 or 1, BYTES as a 4-byte little-endian length and the bytes.
// b must hold exactly the tensor.
func decodeBinary(name string, dt onnx.DataType, dims []int64, b []byte) (*onnx.Tensor, error) {
	n, err := onnx.NumElements(dims)
	if err != nil {
		return nil, err
	}
	var data any
	switch dt {
	case onnx.String:
		data, err = decodeBytesElements(n, b)
	case onnx.Bool:
		data, err = decodeBools(n, b)
	default:
		if want := uint64(n) * uint64(dt.Size()); want != uint64(len(b)) {
			return nil, fmt.Errorf("binary_data_size is %d but shape %v of %s takes %d bytes", len(b), dims, datatypeNames[dt], want)
		}
		data = decodeFixed(dt, b)
	}
	if err != nil {
		return nil, err
	}
	return &onnx.Tensor{Name: name, Type: dt, Dims: append([]int64{}, dims...), Data: data}, nil
}

// decodeFixed converts little-endian elements of a fixed-size type.
func decodeFixed(dt onnx.DataType, b []byte) any {
	switch dt {
	case onnx.Float:
		return le.Decode[float32](b)
	case onnx.Double:
		return le.Decode[float64](b)
	case onnx.Float16:
		return le.Decode[float16.Float16](b)
	case onnx.BFloat16:
		return le.Decode[onnx.BF16](b)
	case onnx.Int8:
		return le.Decode[int8](b)
	case onnx.Int16:
		return le.Decode[int16](b)
	case onnx.Int32:
		return le.Decode[int32](b)
	case onnx.Int64:
		return le.Decode[int64](b)
	case onnx.Uint8:
		return append([]uint8{}, b...)
	case onnx.Uint16:
		return le.Decode[uint16](b)
	case onnx.Uint32:
		return le.Decode[uint32](b)
	case onnx.Uint64:
		return le.Decode[uint64](b)
	}
	return nil
}

func decodeBools(n int, b []byte) ([]bool, error) {
	if n != len(b) {
		return nil, fmt.Errorf("binary_data_size is %d but %d BOOL elements take %d bytes", len(b), n, n)
	}
	out := make([]bool, n)
	for i, c := range b {
		if c > 1 {
			return nil, fmt.Errorf("BOOL element %d is byte %d, want 0 or 1", i, c)
		}
		out[i] = c == 1
	}
	return out, nil
}

// decodeBytesElements reads n length-prefixed BYTES elements that must
// fill b exactly.
func decodeBytesElements(n int, b []byte) ([]string, error) {
	if uint64(n)*4 > uint64(len(b)) {
		return nil, fmt.Errorf("binary_data_size is %d but %d BYTES elements take at least %d bytes", len(b), n, uint64(n)*4)
	}
	out := make([]string, n)
	for i := range out {
		if len(b) < 4 {
			return nil, fmt.Errorf("BYTES element %d: %d bytes left, want a 4-byte length", i, len(b))
		}
		size := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if uint64(size) > uint64(len(b)) {
			return nil, fmt.Errorf("BYTES element %d: length %d but %d bytes left", i, size, len(b))
		}
		out[i] = string(b[:size])
		b = b[size:]
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("%d bytes are left after the last of %d BYTES elements", len(b), n)
	}
	return out, nil
}

// encodeBinary returns t's binary data; t has been checked by checkTensor.
func encodeBinary(t *onnx.Tensor) []byte {
	switch d := t.Data.(type) {
	case []string:
		n := 0
		for _, s := range d {
			n += 4 + len(s)
		}
		b := make([]byte, 0, n)
		for _, s := range d {
			b = binary.LittleEndian.AppendUint32(b, uint32(min(len(s), math.MaxUint32)))
			b = append(b, s...)
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
	}
	raw := onnx.RawBytes(t)
	if raw == nil {
		raw = []byte{}
	}
	return raw
}
