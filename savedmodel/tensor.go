package savedmodel

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// refOffset is what TensorFlow adds to a DataType for its reference variant.
const refOffset = 100

// onnxTypes maps TensorFlow element types to kiln's. The quantized types
// (DT_QINT8 ...) carry no scale in TensorFlow's tensors: they map to the
// integer type that stores them.
var onnxTypes = map[smpb.DataType]onnx.DataType{
	smpb.DataType_DT_FLOAT: onnx.Float, smpb.DataType_DT_DOUBLE: onnx.Double,
	smpb.DataType_DT_HALF: onnx.Float16, smpb.DataType_DT_BFLOAT16: onnx.BFloat16,
	smpb.DataType_DT_INT8: onnx.Int8, smpb.DataType_DT_INT16: onnx.Int16,
	smpb.DataType_DT_INT32: onnx.Int32, smpb.DataType_DT_INT64: onnx.Int64,
	smpb.DataType_DT_UINT8: onnx.Uint8, smpb.DataType_DT_UINT16: onnx.Uint16,
	smpb.DataType_DT_UINT32: onnx.Uint32, smpb.DataType_DT_UINT64: onnx.Uint64,
	smpb.DataType_DT_BOOL: onnx.Bool, smpb.DataType_DT_STRING: onnx.String,
	smpb.DataType_DT_COMPLEX64: onnx.Complex64, smpb.DataType_DT_COMPLEX128: onnx.Complex128,
	smpb.DataType_DT_QINT8: onnx.Int8, smpb.DataType_DT_QUINT8: onnx.Uint8,
	smpb.DataType_DT_QINT16: onnx.Int16, smpb.DataType_DT_QUINT16: onnx.Uint16,
	smpb.DataType_DT_QINT32: onnx.Int32,
}

// ErrUnsupportedType is returned for element types that have no onnx
// counterpart (DT_RESOURCE, DT_VARIANT, unknown values).
var ErrUnsupportedType = errors.New("element type has no ONNX counterpart")

// ONNXType returns the onnx element type for a TensorFlow one; reference
// types (DT_FLOAT_REF) map like their value types.
func ONNXType(dt smpb.DataType) (onnx.DataType, error) {
	if dt > refOffset {
		dt -= refOffset
	}
	if t, ok := onnxTypes[dt]; ok {
		return t, nil
	}
	return onnx.Undefined, fmt.Errorf("%s: %w", dt, ErrUnsupportedType)
}

// fullDims returns a shape's dimensions, refusing unknown ones: a stored
// tensor's shape is always fully known.
func fullDims(s *smpb.TensorShapeProto) ([]int64, int, error) {
	dims, unknownRank := Shape(s)
	if unknownRank {
		return nil, 0, errors.New("shape has unknown rank")
	}
	n, err := onnx.NumElements(dims)
	if err != nil {
		return nil, 0, err
	}
	return dims, n, nil
}

// TensorFromProto decodes a TensorFlow TensorProto (a Const node's value
// attr, a signature default) into an onnx.Tensor. The data comes from
// tensor_content (raw little-endian, row-major) when it is set, otherwise
// from the typed field TensorFlow uses for the element type (float_val,
// int_val, half_val holding fp16 or bfloat16 bits, ...). As in TensorFlow, a
// typed field with fewer values than the shape needs is filled out with its
// last value (a single value broadcasts), and an empty one means zeros.
func TensorFromProto(p *smpb.TensorProto) (*onnx.Tensor, error) {
	dt, dims, n, err := protoType(p)
	if err != nil {
		return nil, err
	}
	if c := p.GetTensorContent(); len(c) > 0 {
		if dt == onnx.String {
			return nil, errors.New("DT_STRING tensor in tensor_content is not supported")
		}
		return decodeRaw(dt, dims, c)
	}
	q := &onnxpb.TensorProto{DataType: proto.Int32(int32(dt)), Dims: dims}
	if err := fillTyped(q, p, dt, n); err != nil {
		return nil, fmt.Errorf("%s%v tensor: %w", p.GetDtype(), dims, err)
	}
	return onnx.Decode(q)
}

// protoType returns p's element type, dimensions and element count.
func protoType(p *smpb.TensorProto) (onnx.DataType, []int64, int, error) {
	dt, err := ONNXType(p.GetDtype())
	if err != nil {
		return 0, nil, 0, err
	}
	dims, n, err := fullDims(p.GetTensorShape())
	if err != nil {
		return 0, nil, 0, fmt.Errorf("%s tensor: %w", p.GetDtype(), err)
	}
	return dt, dims, n, nil
}

// fillTyped moves p's typed values, filled out to n elements, into the
// field ONNX uses for dt, so that onnx.Decode does the conversion.
func fillTyped(q *onnxpb.TensorProto, p *smpb.TensorProto, dt onnx.DataType, n int) error {
	switch dt {
	case onnx.Float:
		q.FloatData = fill(p.GetFloatVal(), n, 1)
	case onnx.Double:
		q.DoubleData = fill(p.GetDoubleVal(), n, 1)
	case onnx.Complex64:
		q.FloatData = fill(p.GetScomplexVal(), n, 2)
	case onnx.Complex128:
		q.DoubleData = fill(p.GetDcomplexVal(), n, 2)
	case onnx.Int64:
		q.Int64Data = fill(p.GetInt64Val(), n, 1)
	case onnx.Uint32:
		q.Uint64Data = fill(widen(p.GetUint32Val()), n, 1)
	case onnx.Uint64:
		q.Uint64Data = fill(p.GetUint64Val(), n, 1)
	case onnx.Float16, onnx.BFloat16:
		q.Int32Data = fill(p.GetHalfVal(), n, 1)
	case onnx.Bool:
		b := make([]int32, len(p.GetBoolVal()))
		for i, v := range p.GetBoolVal() {
			if v {
				b[i] = 1
			}
		}
		q.Int32Data = fill(b, n, 1)
	case onnx.String:
		q.StringData = fill(p.GetStringVal(), n, 1)
	case onnx.Int8, onnx.Int16, onnx.Int32, onnx.Uint8, onnx.Uint16:
		q.Int32Data = fill(p.GetIntVal(), n, 1)
	default:
		return fmt.Errorf("element type %s is not supported", dt)
	}
	return nil
}

// fill returns n groups of width values (a complex number is a group of 2):
// src itself when it holds exactly that many, otherwise src's first n
// groups, the last group repeated after them, or zeros when src is empty.
// A trailing partial group is dropped.
func fill[T any](src []T, n, width int) []T {
	out := make([]T, n*width)
	have := min(len(src)/width, n)
	copy(out, src[:have*width])
	if have == 0 {
		return out
	}
	last := src[(have-1)*width : have*width]
	for i := have; i < n; i++ {
		copy(out[i*width:], last)
	}
	return out
}

func widen(s []uint32) []uint64 {
	out := make([]uint64, len(s))
	for i, v := range s {
		out[i] = uint64(v)
	}
	return out
}

// InitializerFromProto is TensorFromProto's value as the ONNX initializer
// named name, byte for byte what onnx.Encode(t, onnx.Raw) writes for it. A
// tensor_content's bytes become raw_data as they are, not copied: the
// initializer shares memory with p.
func InitializerFromProto(p *smpb.TensorProto, name string) (*onnxpb.TensorProto, error) {
	if c := p.GetTensorContent(); len(c) > 0 && p.GetDtype() != smpb.DataType_DT_STRING {
		dt, dims, n, err := protoType(p)
		if err != nil {
			return nil, err
		}
		return rawInitializer(name, dt, dims, n, c)
	}
	t, err := TensorFromProto(p)
	if err != nil {
		return nil, err
	}
	t.Name = name
	return onnx.Encode(t, onnx.Raw)
}

// rawInitializer is the initializer named name of n elements of type dt
// stored as little-endian bytes raw (a bundle's data, a tensor_content),
// as onnx.Encode writes the decoded tensor. raw itself becomes raw_data;
// only bools (whose true Encode writes as 1), empty tensors (where Encode
// decides between an empty and an absent raw_data) and a wrong byte count
// (for decoding's error) go through decoding.
func rawInitializer(name string, dt onnx.DataType, dims []int64, n int, raw []byte) (*onnxpb.TensorProto, error) {
	if n == 0 || dt == onnx.Bool || len(raw) != n*dt.Size() {
		t, err := decodeRaw(dt, dims, raw)
		if err != nil {
			return nil, err
		}
		t.Name = name
		return onnx.Encode(t, onnx.Raw)
	}
	return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(dt)), Dims: dims, RawData: raw}, nil
}

// decodeRaw decodes raw little-endian row-major bytes.
func decodeRaw(dt onnx.DataType, dims []int64, raw []byte) (*onnx.Tensor, error) {
	if raw == nil {
		raw = []byte{}
	}
	return onnx.Decode(&onnxpb.TensorProto{DataType: proto.Int32(int32(dt)), Dims: dims, RawData: raw})
}
