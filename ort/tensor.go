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
	if !holds(t.Data, t.Type) {
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

// holds reports whether data's Go type is the one that stores dt.
func holds(data any, dt onnx.DataType) bool {
	switch data.(type) {
	case []float16.Float16:
		return dt == onnx.Float16
	case []onnx.BF16:
		return dt == onnx.BFloat16
	case []string:
		return dt == onnx.String
	case []uint8:
		if isFloat8(dt) {
			return true
		}
	}
	num, ok := numerics[dt]
	return ok && num.holds(data)
}

// numeric is how tensors of one of the binding's numeric Go types cross
// it: the generic code below instantiated for that type.
type numeric struct {
	holds func(data any) bool
	value func(dims []int64, data any) (ortgo.Value, error)
	empty func(dims []int64, prior any) (ortgo.Value, any, error)
	read  func(v ortgo.Value) (data any, scalar, ok bool)
	zeros func(n int) any
}

func numericOf[T ortgo.TensorData]() numeric {
	return numeric{
		holds: func(data any) bool { _, ok := data.([]T); return ok },
		value: func(dims []int64, data any) (ortgo.Value, error) { return numericValue(dims, data.([]T)) },
		empty: empty[T],
		read:  read[T],
		zeros: func(n int) any { return make([]T, n) },
	}
}

// numerics are the element types the binding has a Go type for; float16,
// bfloat16 and the float8 types cross it as custom data, strings apart.
var numerics = map[onnx.DataType]numeric{
	onnx.Float: numericOf[float32](), onnx.Double: numericOf[float64](),
	onnx.Int8: numericOf[int8](), onnx.Int16: numericOf[int16](), onnx.Int32: numericOf[int32](),
	onnx.Int64: numericOf[int64](), onnx.Uint8: numericOf[uint8](), onnx.Uint16: numericOf[uint16](),
	onnx.Uint32: numericOf[uint32](), onnx.Uint64: numericOf[uint64](), onnx.Bool: numericOf[bool](),
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
	_, ok := numerics[dt]
	return ok || dt == onnx.Float16 || dt == onnx.BFloat16 || dt == onnx.String || isFloat8(dt)
}

// toValue wraps a checked tensor as an ONNX Runtime value. Numeric data is
// shared, not copied: the value must be destroyed before t.Data changes.
// checkData has made sure that t.Type says which Go type t.Data is.
func toValue(t *onnx.Tensor) (ortgo.Value, error) {
	switch d := t.Data.(type) {
	case []float16.Float16:
		return custom(t.Dims, bytesOf(d), onnx.Float16)
	case []onnx.BF16:
		return custom(t.Dims, bytesOf(d), onnx.BFloat16)
	case []uint8:
		if isFloat8(t.Type) {
			return custom(t.Dims, d, t.Type)
		}
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
	if num, ok := numerics[t.Type]; ok && num.holds(t.Data) {
		return num.value(t.Dims, t.Data)
	}
	return nil, fmt.Errorf("%s: %w", t.Type, errUnsupported)
}

func numericValue[T ortgo.TensorData](dims []int64, data []T) (ortgo.Value, error) {
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

// customData are the Go types of the element types passed as custom data.
type customData interface {
	float16.Float16 | onnx.BF16 | uint8
}

// bytesOf views a slice as bytes in host order, the order ONNX Runtime uses
// in memory.
func bytesOf[T customData](d []T) []byte {
	if len(d) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&d[0])), int(unsafe.Sizeof(d[0]))*len(d))
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
	switch {
	case dt == onnx.Float16:
		return emptyCustom[float16.Float16](dt, dims, prior, n)
	case dt == onnx.BFloat16:
		return emptyCustom[onnx.BF16](dt, dims, prior, n)
	case isFloat8(dt):
		return emptyCustom[uint8](dt, dims, prior, n)
	}
	if num, ok := numerics[dt]; ok {
		return num.empty(dims, prior)
	}
	return nil, nil, fmt.Errorf("%s: %w", dt, errUnsupported)
}

func emptyCustom[T customData](dt onnx.DataType, dims []int64, prior any, n int) (ortgo.Value, any, error) {
	d := reuse[T](prior, n)
	v, err := custom(dims, bytesOf(d), dt)
	return v, d, err
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
	// The binding's Go type follows the element type, so dt picks the reader.
	if num, ok := numerics[dt]; ok {
		if data, scalar, ok := num.read(v); ok {
			t.Data = data
			if scalar {
				t.Dims = []int64{}
			}
			return t, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", dt, errUnsupported)
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
		out.Data = narrowInto(f, prior, float16.Fromfloat32)
	case onnx.BFloat16:
		out.Data = narrowInto(f, prior, func(v float32) onnx.BF16 { return onnx.BF16(math.Float32bits(v) >> 16) })
	default:
		return nil, fmt.Errorf("cannot narrow float32 to %s", dt)
	}
	return out, nil
}

func narrowInto[T any](f []float32, prior any, conv func(float32) T) []T {
	d := reuse[T](prior, len(f))
	for i, v := range f {
		d[i] = conv(v)
	}
	return d
}
