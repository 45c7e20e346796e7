package trtexec

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// trtTypes are the element types kiln passes to and reads from trtexec:
// TensorRT's I/O types (nvinfer1::DataType kFLOAT, kHALF, kBF16, kINT8,
// kUINT8, kINT32, kINT64, kBOOL) that have an ONNX type of the same layout.
// fp8 and int4 tensors are left out: their ONNX and TensorRT encodings are
// not checked against each other here.
var trtTypes = map[onnx.DataType]bool{
	onnx.Float: true, onnx.Float16: true, onnx.BFloat16: true, onnx.Int8: true,
	onnx.Uint8: true, onnx.Int32: true, onnx.Int64: true, onnx.Bool: true,
}

func checkTRTType(dt onnx.DataType) error {
	if !trtTypes[dt] {
		return fmt.Errorf("element type %s is not one kiln exchanges with trtexec (float32, float16, bfloat16, int8, uint8, int32, int64, bool)", dt)
	}
	return nil
}

// checkTensor checks that t has a trtTypes type, data of that type's Go
// type and one element per position of its dims.
func checkTensor(t *onnx.Tensor) error {
	if t == nil {
		return errors.New("no tensor")
	}
	if err := checkTRTType(t.Type); err != nil {
		return err
	}
	var ok bool
	switch t.Data.(type) {
	case []float32:
		ok = t.Type == onnx.Float
	case []float16.Float16:
		ok = t.Type == onnx.Float16
	case []onnx.BF16:
		ok = t.Type == onnx.BFloat16
	case []int8:
		ok = t.Type == onnx.Int8
	case []uint8:
		ok = t.Type == onnx.Uint8
	case []int32:
		ok = t.Type == onnx.Int32
	case []int64:
		ok = t.Type == onnx.Int64
	case []bool:
		ok = t.Type == onnx.Bool
	}
	if !ok {
		return fmt.Errorf("a %s tensor cannot hold %T data", t.Type, t.Data)
	}
	n, err := onnx.NumElements(t.Dims)
	if err != nil {
		return err
	}
	if t.Len() != n {
		return fmt.Errorf("%d elements for dims %v (want %d)", t.Len(), t.Dims, n)
	}
	return nil
}

// Tensor decodes the output's values as element type dt, the type of the
// engine's output (trtexec's JSON does not say it). A value that does not
// read as dt, or that dt cannot hold, is an error: it means dt is not the
// output's type.
func (o ExportedOutput) Tensor(dt onnx.DataType) (*onnx.Tensor, error) {
	if err := checkTRTType(dt); err != nil {
		return nil, fmt.Errorf("output %q: %w", o.Name, err)
	}
	if err := checkCount(o); err != nil {
		return nil, err
	}
	var data any
	var err error
	switch dt {
	case onnx.Float:
		data, err = decodeValues(o.Values, parseFloat32)
	case onnx.Float16:
		data, err = decodeValues(o.Values, func(s string) (float16.Float16, error) {
			f, err := parseFloat32(s)
			h := float16.Fromfloat32(f)
			if err == nil && h.IsInf(0) && !math.IsInf(float64(f), 0) {
				err = errors.New("out of range")
			}
			return h, err
		})
	case onnx.BFloat16:
		data, err = decodeValues(o.Values, func(s string) (onnx.BF16, error) {
			f, err := parseFloat32(s)
			b := onnx.BF16From(f)
			if err == nil && math.IsInf(float64(b.Float32()), 0) && !math.IsInf(float64(f), 0) {
				err = errors.New("out of range")
			}
			return b, err
		})
	case onnx.Int8:
		data, err = decodeValues(o.Values, func(s string) (int8, error) { v, err := strconv.ParseInt(s, 10, 8); return int8(v), err })
	case onnx.Uint8:
		data, err = decodeValues(o.Values, func(s string) (uint8, error) { v, err := strconv.ParseUint(s, 10, 8); return uint8(v), err })
	case onnx.Int32:
		data, err = decodeValues(o.Values, func(s string) (int32, error) { v, err := strconv.ParseInt(s, 10, 32); return int32(v), err })
	case onnx.Int64:
		data, err = decodeValues(o.Values, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
	case onnx.Bool:
		data, err = decodeValues(o.Values, parseBool)
	}
	if err != nil {
		return nil, fmt.Errorf("output %q as %s: %w", o.Name, dt, err)
	}
	return &onnx.Tensor{Name: o.Name, Type: dt, Dims: append([]int64{}, o.Dims...), Data: data}, nil
}

func decodeValues[T any](vals []string, parse func(string) (T, error)) ([]T, error) {
	out := make([]T, len(vals))
	for i, s := range vals {
		v, err := parse(s)
		if err != nil {
			return nil, fmt.Errorf("value %d (%s): %w", i, clip(s, 24), unwrapNum(err))
		}
		out[i] = v
	}
	return out, nil
}

// unwrapNum drops strconv's repetition of the input from its errors.
func unwrapNum(err error) error {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		if errors.Is(ne.Err, strconv.ErrRange) {
			return errors.New("out of range")
		}
		return errors.New("not a number of this type")
	}
	return err
}

// parseFloat32 reads a value trtexec printed for a floating-point output.
func parseFloat32(s string) (float32, error) {
	switch s {
	case "nan":
		return float32(math.NaN()), nil
	case "-nan":
		return float32(math.Copysign(math.NaN(), -1)), nil
	case "inf":
		return float32(math.Inf(1)), nil
	case "-inf":
		return float32(math.Inf(-1)), nil
	}
	f, err := strconv.ParseFloat(s, 32)
	if err == nil && (math.IsNaN(f) || math.IsInf(f, 0)) {
		// ParseFloat's own spellings ("NaN", "+Inf") are not trtexec's.
		return 0, errors.New("not a number of this type")
	}
	return float32(f), err
}

func parseBool(s string) (bool, error) {
	switch s {
	case "0":
		return false, nil
	case "1":
		return true, nil
	}
	return false, errors.New("not 0 or 1")
}

// ExportedOutputFrom formats t the way trtexec's --exportOutput writes an
// output of its type (floats with 6 significant digits, as C++ streams
// print them). Tests use it to give the trtexec test double the outputs
// it should report.
func ExportedOutputFrom(t *onnx.Tensor) (ExportedOutput, error) {
	if err := checkTensor(t); err != nil {
		name := ""
		if t != nil {
			name = t.Name
		}
		return ExportedOutput{}, fmt.Errorf("tensor %q: %w", name, err)
	}
	var vals []string
	switch d := t.Data.(type) {
	case []float32:
		vals = formatValues(d, func(v float32) string { return formatFloat(float64(v)) })
	case []float16.Float16:
		vals = formatValues(d, func(v float16.Float16) string { return formatFloat(float64(v.Float32())) })
	case []onnx.BF16:
		vals = formatValues(d, func(v onnx.BF16) string { return formatFloat(float64(v.Float32())) })
	case []int8:
		vals = formatValues(d, func(v int8) string { return strconv.FormatInt(int64(v), 10) })
	case []uint8:
		vals = formatValues(d, func(v uint8) string { return strconv.FormatUint(uint64(v), 10) })
	case []int32:
		vals = formatValues(d, func(v int32) string { return strconv.FormatInt(int64(v), 10) })
	case []int64:
		vals = formatValues(d, func(v int64) string { return strconv.FormatInt(v, 10) })
	case []bool:
		vals = formatValues(d, func(v bool) string { return map[bool]string{false: "0", true: "1"}[v] })
	}
	return ExportedOutput{Name: t.Name, Dims: append([]int64{}, t.Dims...), Values: vals}, nil
}

func formatValues[T any](d []T, f func(T) string) []string {
	out := make([]string, len(d))
	for i, v := range d {
		out[i] = f(v)
	}
	return out
}

// formatFloat prints v as a C++ stream does by default (%g, 6 digits) and
// NaN and infinities as glibc does.
func formatFloat(v float64) string {
	switch {
	case math.IsNaN(v) && math.Signbit(v):
		return "-nan"
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}
