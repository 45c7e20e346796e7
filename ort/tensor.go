package ort

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
	ortgo "github.com/yalue/onnxruntime_go"
)

// The binding cannot build rank-0 tensors except its numeric Scalar type, and
// cannot build empty tensors from byte buffers. Those limits show up as the
// errors below rather than as the binding's own messages.
var (
	errScalarCustom = errors.New("the ONNX Runtime binding cannot pass rank-0 tensors of this element type")
	errUnsupported  = errors.New("element type is not supported by kiln's ONNX Runtime binding")
)

// checkData verifies that t.Data's Go type stores t.Type and that its length
// matches t.Dims.
func checkData(t *onnx.Tensor) error {
	ok := false
	switch t.Data.(type) {
	case []float32:
		ok = t.Type == onnx.Float
	case []float64:
		ok = t.Type == onnx.Double
	case []float16.Float16:
		ok = t.Type == onnx.Float16
	case []onnx.BF16:
		ok = t.Type == onnx.BFloat16
	case []int8:
		ok = t.Type == onnx.Int8
	case []int16:
		ok = t.Type == onnx.Int16
	case []int32:
		ok = t.Type == onnx.Int32
	case []int64:
		ok = t.Type == onnx.Int64
	case []uint8:
		ok = t.Type == onnx.Uint8 || isFloat8(t.Type)
	case []uint16:
		ok = t.Type == onnx.Uint16
	case []uint32:
		ok = t.Type == onnx.Uint32
	case []uint64:
		ok = t.Type == onnx.Uint64
	case []bool:
		ok = t.Type == onnx.Bool
	case []string:
		ok = t.Type == onnx.String
	}
	if !ok {
		return fmt.Errorf("element type %s cannot be stored in %T", t.Type, t.Data)
	}
	n, err := onnx.NumElements(t.Dims)
	if err != nil {
		return err
	}
	if t.Len() != n {
		return fmt.Errorf("%d elements for shape %v (want %d)", t.Len(), t.Dims, n)
	}
	return nil
}

func isFloat8(dt onnx.DataType) bool {
	switch dt {
	case onnx.Float8E4M3FN, onnx.Float8E4M3FNUZ, onnx.Float8E5M2, onnx.Float8E5M2FNUZ:
		return true
	}
	return false
}

// supported reports whether tensors of dt can cross the binding.
func supported(dt onnx.DataType) bool {
	switch dt {
	case onnx.Float, onnx.Double, onnx.Float16, onnx.BFloat16, onnx.Int8, onnx.Int16, onnx.Int32,
		onnx.Int64, onnx.Uint8, onnx.Uint16, onnx.Uint32, onnx.Uint64, onnx.Bool, onnx.String:
		return true
	}
	return isFloat8(dt)
}

// toValue wraps a checked tensor as an ONNX Runtime value. Numeric data is
// shared, not copied: the value must be destroyed before t.Data changes.
func toValue(t *onnx.Tensor) (ortgo.Value, error) {
	switch d := t.Data.(type) {
	case []float32:
		return numeric(t.Dims, d)
	case []float64:
		return numeric(t.Dims, d)
	case []int8:
		return numeric(t.Dims, d)
	case []int16:
		return numeric(t.Dims, d)
	case []int32:
		return numeric(t.Dims, d)
	case []int64:
		return numeric(t.Dims, d)
	case []uint8:
		if isFloat8(t.Type) {
			return custom(t.Dims, d, t.Type)
		}
		return numeric(t.Dims, d)
	case []uint16:
		return numeric(t.Dims, d)
	case []uint32:
		return numeric(t.Dims, d)
	case []uint64:
		return numeric(t.Dims, d)
	case []bool:
		return numeric(t.Dims, d)
	case []float16.Float16:
		return custom(t.Dims, bytesOf(d), onnx.Float16)
	case []onnx.BF16:
		return custom(t.Dims, bytesOf(d), onnx.BFloat16)
	case []string:
		if len(t.Dims) == 0 {
			return nil, errScalarCustom
		}
		v, err := ortgo.NewStringTensor(ortgo.Shape(t.Dims))
		if err != nil {
			return nil, err
		}
		if err := v.SetContents(d); err != nil {
			v.Destroy()
			return nil, err
		}
		return v, nil
	}
	return nil, fmt.Errorf("%s: %w", t.Type, errUnsupported)
}

func numeric[T ortgo.TensorData](dims []int64, data []T) (ortgo.Value, error) {
	if len(dims) == 0 {
		return ortgo.NewScalar(data[0])
	}
	return ortgo.NewTensor(ortgo.Shape(dims), data)
}

// custom builds a tensor from raw bytes for the types the binding has no Go
// type for (float16, bfloat16, float8).
func custom(dims []int64, data []byte, dt onnx.DataType) (ortgo.Value, error) {
	if len(dims) == 0 {
		return nil, errScalarCustom
	}
	if len(data) == 0 {
		// The binding refuses empty buffers; ONNX Runtime only checks that
		// the buffer is large enough for the zero elements.
		data = make([]byte, 2)
	}
	v, err := ortgo.NewCustomDataTensor(ortgo.Shape(dims), data, ortgo.TensorElementDataType(dt))
	if err != nil {
		return nil, err // not a typed nil, which callers would Destroy
	}
	return v, nil
}

// bytesOf views a slice of 2-byte elements as bytes in host order, the order
// ONNX Runtime uses in memory.
func bytesOf[T float16.Float16 | onnx.BF16](d []T) []byte {
	if len(d) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&d[0])), 2*len(d))
}

// allocate makes an output value of a known shape over Go memory, drawn
// from prior (the data of a tensor the caller gave back) when it has the
// same Go type and room for the elements. data is the Go slice the value
// writes into (nil for scalars, read back with fromValue). It is also the
// work-around for the binding, which cannot convert float16/bfloat16 outputs
// that ONNX Runtime allocates (it copies one byte per element and then fails
// with "not enough space") nor outputs of rank 0.
func allocate(dt onnx.DataType, dims []int64, prior any) (ortgo.Value, any, error) {
	n, err := onnx.NumElements(dims)
	if err != nil {
		return nil, nil, err
	}
	switch dt {
	case onnx.Float16:
		d := reuse[float16.Float16](prior, n)
		v, err := custom(dims, bytesOf(d), dt)
		return v, d, err
	case onnx.BFloat16:
		d := reuse[onnx.BF16](prior, n)
		v, err := custom(dims, bytesOf(d), dt)
		return v, d, err
	case onnx.Float8E4M3FN, onnx.Float8E4M3FNUZ, onnx.Float8E5M2, onnx.Float8E5M2FNUZ:
		d := reuse[uint8](prior, n)
		v, err := custom(dims, d, dt)
		return v, d, err
	case onnx.Float:
		return empty[float32](dims, prior)
	case onnx.Double:
		return empty[float64](dims, prior)
	case onnx.Int8:
		return empty[int8](dims, prior)
	case onnx.Int16:
		return empty[int16](dims, prior)
	case onnx.Int32:
		return empty[int32](dims, prior)
	case onnx.Int64:
		return empty[int64](dims, prior)
	case onnx.Uint8:
		return empty[uint8](dims, prior)
	case onnx.Uint16:
		return empty[uint16](dims, prior)
	case onnx.Uint32:
		return empty[uint32](dims, prior)
	case onnx.Uint64:
		return empty[uint64](dims, prior)
	case onnx.Bool:
		return empty[bool](dims, prior)
	}
	return nil, nil, fmt.Errorf("%s: %w", dt, errUnsupported)
}

func empty[T ortgo.TensorData](dims []int64, prior any) (ortgo.Value, any, error) {
	if len(dims) == 0 {
		v, err := ortgo.NewEmptyScalar[T]()
		if err != nil {
			return nil, nil, err // not a typed nil, which callers would Destroy
		}
		return v, nil, nil
	}
	d := reuse[T](prior, mustElements(dims))
	v, err := ortgo.NewTensor(ortgo.Shape(dims), d)
	if err != nil {
		return nil, nil, err
	}
	return v, d, nil
}

// reuse returns prior[:n] when prior is a []T with room for n elements, and
// a new slice otherwise. The old contents stay: every output element is
// written by the run.
func reuse[T any](prior any, n int) []T {
	if d, ok := prior.([]T); ok && cap(d) >= n {
		return d[:n]
	}
	return make([]T, n)
}

func mustElements(dims []int64) int {
	n, _ := onnx.NumElements(dims)
	return n
}

// fromValue converts an output value to a tensor. Numeric data is moved,
// not copied: the binding already copied it into Go memory that the value
// no longer uses once destroyed.
func fromValue(name string, v ortgo.Value) (*onnx.Tensor, error) {
	if v.GetONNXType() != ortgo.ONNXTypeTensor {
		return nil, fmt.Errorf("value is a %s; only tensors are supported", v.GetONNXType())
	}
	dt := onnx.DataType(int(v.DataType()))
	t := &onnx.Tensor{Name: name, Type: dt, Dims: []int64(v.GetShape())}
	switch x := v.(type) {
	case *ortgo.StringTensor:
		s, err := x.GetContents()
		if err != nil {
			return nil, err
		}
		t.Data = s
		return t, nil
	case *ortgo.CustomDataTensor:
		if !isFloat8(dt) {
			// float16/bfloat16 outputs are always pre-allocated or widened
			// to float32, so the binding never hands them back here.
			return nil, fmt.Errorf("%s: %w", dt, errUnsupported)
		}
		t.Data = x.GetData()[:mustElements(t.Dims)]
		return t, nil
	}
	for _, f := range readers {
		if data, scalar, ok := f(v); ok {
			t.Data = data
			if scalar {
				t.Dims = []int64{}
			}
			return t, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", dt, errUnsupported)
}

var readers = []func(ortgo.Value) (any, bool, bool){
	read[float32], read[float64], read[int8], read[int16], read[int32], read[int64],
	read[uint8], read[uint16], read[uint32], read[uint64], read[bool],
}

func read[T ortgo.TensorData](v ortgo.Value) (data any, scalar, ok bool) {
	switch x := v.(type) {
	case *ortgo.Tensor[T]:
		return x.GetData(), false, true
	case *ortgo.Scalar[T]:
		return []T{x.GetData()}, true, true
	}
	return nil, false, false
}

// narrow converts a float32 output that was widened from float16 or
// bfloat16 back to its declared type, into prior's memory where it fits (see
// reuse). Both widenings are exact, so this is exact too (NaN stays NaN).
func narrow(t *onnx.Tensor, dt onnx.DataType, prior any) (*onnx.Tensor, error) {
	f, ok := t.Data.([]float32)
	if !ok {
		return nil, fmt.Errorf("widened output holds %T, want []float32", t.Data)
	}
	out := &onnx.Tensor{Name: t.Name, Type: dt, Dims: t.Dims}
	switch dt {
	case onnx.Float16:
		d := reuse[float16.Float16](prior, len(f))
		for i, v := range f {
			d[i] = float16.Fromfloat32(v)
		}
		out.Data = d
	case onnx.BFloat16:
		d := reuse[onnx.BF16](prior, len(f))
		for i, v := range f {
			d[i] = onnx.BF16(math.Float32bits(v) >> 16)
		}
		out.Data = d
	default:
		return nil, fmt.Errorf("cannot narrow float32 to %s", dt)
	}
	return out, nil
}
