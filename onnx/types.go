package onnx

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// DataType is an ONNX element type (TensorProto.DataType).
type DataType int32

// Element types, numbered as in the ONNX specification.
const (
	Undefined      DataType = 0
	Float          DataType = 1
	Uint8          DataType = 2
	Int8           DataType = 3
	Uint16         DataType = 4
	Int16          DataType = 5
	Int32          DataType = 6
	Int64          DataType = 7
	String         DataType = 8
	Bool           DataType = 9
	Float16        DataType = 10
	Double         DataType = 11
	Uint32         DataType = 12
	Uint64         DataType = 13
	Complex64      DataType = 14
	Complex128     DataType = 15
	BFloat16       DataType = 16
	Float8E4M3FN   DataType = 17
	Float8E4M3FNUZ DataType = 18
	Float8E5M2     DataType = 19
	Float8E5M2FNUZ DataType = 20
	Uint4          DataType = 21
	Int4           DataType = 22
	Float4E2M1     DataType = 23
	Float8E8M0     DataType = 24
	Uint2          DataType = 25
	Int2           DataType = 26
)

var typeNames = map[DataType]string{
	Undefined: "undefined", Float: "float32", Uint8: "uint8", Int8: "int8", Uint16: "uint16",
	Int16: "int16", Int32: "int32", Int64: "int64", String: "string", Bool: "bool",
	Float16: "float16", Double: "float64", Uint32: "uint32", Uint64: "uint64",
	Complex64: "complex64", Complex128: "complex128", BFloat16: "bfloat16",
	Float8E4M3FN: "float8e4m3fn", Float8E4M3FNUZ: "float8e4m3fnuz", Float8E5M2: "float8e5m2",
	Float8E5M2FNUZ: "float8e5m2fnuz", Uint4: "uint4", Int4: "int4", Float4E2M1: "float4e2m1",
	Float8E8M0: "float8e8m0", Uint2: "uint2", Int2: "int2",
}

// String returns the short lower-case name used in kiln's output ("float32", "int64").
func (d DataType) String() string {
	if s, ok := typeNames[d]; ok {
		return s
	}
	return fmt.Sprintf("DataType(%d)", int32(d))
}

// ParseDataType accepts kiln's short names and the ONNX enum names ("float32", "FLOAT", "fp16").
func ParseDataType(s string) (DataType, error) {
	l := strings.ToLower(s)
	switch l {
	case "fp32", "float":
		return Float, nil
	case "fp16", "half":
		return Float16, nil
	case "fp64", "double":
		return Double, nil
	case "bf16":
		return BFloat16, nil
	}
	for d, n := range typeNames {
		if n == l {
			return d, nil
		}
	}
	if v, ok := onnxpb.TensorProto_DataType_value[strings.ToUpper(s)]; ok {
		return DataType(v), nil
	}
	return Undefined, fmt.Errorf("unknown element type %q", s)
}

// Size is the number of bytes one element takes in raw_data, 0 for strings
// and for sub-byte types (which pack several elements into a byte).
func (d DataType) Size() int {
	switch d {
	case Bool, Uint8, Int8, Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ, Float8E8M0:
		return 1
	case Uint16, Int16, Float16, BFloat16:
		return 2
	case Float, Int32, Uint32:
		return 4
	case Int64, Uint64, Double, Complex64:
		return 8
	case Complex128:
		return 16
	}
	return 0
}

// IsFloat reports whether d is a floating-point type (any width).
func (d DataType) IsFloat() bool {
	switch d {
	case Float, Float16, Double, BFloat16, Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ,
		Float4E2M1, Float8E8M0:
		return true
	}
	return false
}

// Dim is one dimension of a shape: a fixed Value, or a symbolic Param, or
// neither (unknown).
type Dim struct {
	Value int64  `json:"value,omitempty"`
	Param string `json:"param,omitempty"`
	Known bool   `json:"-"`
}

// Fixed reports whether the dimension has a concrete value.
func (d Dim) Fixed() bool { return d.Known }

// String prints the value, the symbolic name, or "?".
func (d Dim) String() string {
	switch {
	case d.Known:
		return fmt.Sprint(d.Value)
	case d.Param != "":
		return d.Param
	}
	return "?"
}

// Shape is a tensor shape that may have symbolic dimensions. A nil Shape with
// Ranked false means the rank itself is unknown.
type Shape struct {
	Dims   []Dim
	Ranked bool
}

// String prints the shape as [1,3,N,?] or "unranked".
func (s Shape) String() string {
	if !s.Ranked {
		return "unranked"
	}
	parts := make([]string, len(s.Dims))
	for i, d := range s.Dims {
		parts[i] = d.String()
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Static returns the dimensions as integers, with -1 for every dimension
// that is not fixed (Triton's and ONNX Runtime's convention).
func (s Shape) Static() []int64 {
	out := make([]int64, len(s.Dims))
	for i, d := range s.Dims {
		if d.Known {
			out[i] = d.Value
		} else {
			out[i] = -1
		}
	}
	return out
}

// ShapeOf converts a TensorShapeProto; nil means unranked.
func ShapeOf(p *onnxpb.TensorShapeProto) Shape {
	if p == nil {
		return Shape{}
	}
	s := Shape{Ranked: true, Dims: make([]Dim, len(p.GetDim()))}
	for i, d := range p.GetDim() {
		switch v := d.GetValue().(type) {
		case *onnxpb.TensorShapeProto_Dimension_DimValue:
			s.Dims[i] = Dim{Value: v.DimValue, Known: true}
		case *onnxpb.TensorShapeProto_Dimension_DimParam:
			s.Dims[i] = Dim{Param: v.DimParam}
		}
	}
	return s
}

// Proto converts the shape back to a TensorShapeProto (nil when unranked).
func (s Shape) Proto() *onnxpb.TensorShapeProto {
	if !s.Ranked {
		return nil
	}
	p := &onnxpb.TensorShapeProto{Dim: make([]*onnxpb.TensorShapeProto_Dimension, len(s.Dims))}
	for i, d := range s.Dims {
		dim := &onnxpb.TensorShapeProto_Dimension{}
		switch {
		case d.Known:
			dim.Value = &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d.Value}
		case d.Param != "":
			dim.Value = &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: d.Param}
		}
		p.Dim[i] = dim
	}
	return p
}

// ValueInfo is a graph input or output (or an intermediate value with a
// recorded type) in a form that is easy to use.
type ValueInfo struct {
	Name string
	// Kind is "tensor", "sequence", "map", "optional", "sparse_tensor",
	// "opaque" or "" when the type is missing.
	Kind  string
	Type  DataType // element type of a tensor or sparse tensor
	Shape Shape
}

// String prints "name: float32[N,3,224,224]".
func (v ValueInfo) String() string {
	if v.Kind != "tensor" && v.Kind != "sparse_tensor" {
		return fmt.Sprintf("%s: %s", v.Name, v.Kind)
	}
	return fmt.Sprintf("%s: %s%s", v.Name, v.Type, v.Shape)
}

// InfoOf converts a ValueInfoProto.
func InfoOf(p *onnxpb.ValueInfoProto) ValueInfo {
	v := ValueInfo{Name: p.GetName()}
	t := p.GetType()
	switch {
	case t.GetTensorType() != nil:
		v.Kind = "tensor"
		v.Type = DataType(t.GetTensorType().GetElemType())
		v.Shape = ShapeOf(t.GetTensorType().GetShape())
	case t.GetSparseTensorType() != nil:
		v.Kind = "sparse_tensor"
		v.Type = DataType(t.GetSparseTensorType().GetElemType())
		v.Shape = ShapeOf(t.GetSparseTensorType().GetShape())
	case t.GetSequenceType() != nil:
		v.Kind = "sequence"
	case t.GetMapType() != nil:
		v.Kind = "map"
	case t.GetOptionalType() != nil:
		v.Kind = "optional"
	case t.GetOpaqueType() != nil:
		v.Kind = "opaque"
	}
	return v
}

// TensorType builds a ValueInfoProto for a tensor value.
func TensorType(name string, dt DataType, shape Shape) *onnxpb.ValueInfoProto {
	return &onnxpb.ValueInfoProto{
		Name: &name,
		Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{TensorType: &onnxpb.TypeProto_Tensor{
			ElemType: (*int32)(&dt),
			Shape:    shape.Proto(),
		}}},
	}
}
