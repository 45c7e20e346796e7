// Package testmodels builds the small ONNX models kiln ships under
// testdata/ and that tests and benchmarks create on the fly. Every model is
// deterministic: the same seed gives byte-identical files.
package testmodels

import (
	"math"
	"math/rand/v2"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Builder assembles one graph.
type Builder struct {
	g    *onnxpb.GraphProto
	rng  *rand.Rand
	next int
}

// NewBuilder starts a graph whose random weights come from seed.
func NewBuilder(name string, seed uint64) *Builder {
	return &Builder{g: &onnxpb.GraphProto{Name: proto.String(name)}, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Input declares a graph input.
func (b *Builder) Input(name string, dt onnx.DataType, dims ...any) string {
	b.g.Input = append(b.g.Input, onnx.TensorType(name, dt, shape(dims)))
	return name
}

// Output declares a graph output.
func (b *Builder) Output(name string, dt onnx.DataType, dims ...any) {
	b.g.Output = append(b.g.Output, onnx.TensorType(name, dt, shape(dims)))
}

// shape turns int and string arguments into fixed and symbolic dims.
func shape(dims []any) onnx.Shape {
	s := onnx.Shape{Ranked: true}
	for _, d := range dims {
		switch v := d.(type) {
		case int:
			s.Dims = append(s.Dims, onnx.Dim{Value: int64(v), Known: true})
		case string:
			s.Dims = append(s.Dims, onnx.Dim{Param: v})
		}
	}
	return s
}

// Init adds an initializer with the given data.
func (b *Builder) Init(name string, dims []int64, data any) string {
	t, err := onnx.NewTensor(name, dims, data)
	if err != nil {
		panic(err) // programming error in a generator, not input
	}
	p, err := onnx.Encode(t, onnx.Raw)
	if err != nil {
		panic(err)
	}
	b.g.Initializer = append(b.g.Initializer, p)
	return name
}

// RandNormal adds a float32 initializer drawn from N(0, std²).
func (b *Builder) RandNormal(name string, std float64, dims ...int64) string {
	n, _ := onnx.NumElements(dims)
	d := make([]float32, n)
	for i := range d {
		d[i] = float32(b.rng.NormFloat64() * std)
	}
	return b.Init(name, dims, d)
}

// He is RandNormal with He initialisation for a layer with fanIn inputs.
func (b *Builder) He(name string, fanIn int64, dims ...int64) string {
	return b.RandNormal(name, math.Sqrt(2/float64(fanIn)), dims...)
}

// Attr builds node attributes.
type Attr = *onnxpb.AttributeProto

// Ints is an INTS attribute.
func Ints(name string, v ...int64) Attr {
	t := onnxpb.AttributeProto_INTS
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, Ints: v}
}

// Int is an INT attribute.
func Int(name string, v int64) Attr {
	t := onnxpb.AttributeProto_INT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, I: proto.Int64(v)}
}

// Float is a FLOAT attribute.
func Float(name string, v float32) Attr {
	t := onnxpb.AttributeProto_FLOAT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, F: proto.Float32(v)}
}

// Tensor is a TENSOR attribute holding data of the given shape.
func Tensor(name string, dims []int64, data any) Attr {
	v, err := onnx.NewTensor("", dims, data)
	if err != nil {
		panic(err) // programming error in a generator, not input
	}
	p, err := onnx.Encode(v, onnx.Raw)
	if err != nil {
		panic(err)
	}
	t := onnxpb.AttributeProto_TENSOR
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, T: p}
}

// Node adds a node with one output and returns the output name.
func (b *Builder) Node(op string, inputs []string, attrs ...Attr) string {
	b.next++
	name := op + "_" + itoa(b.next)
	out := name + "_out"
	b.g.Node = append(b.g.Node, &onnxpb.NodeProto{
		Name: proto.String(name), OpType: proto.String(op),
		Input: inputs, Output: []string{out}, Attribute: attrs,
	})
	return out
}

// Rename makes the last node write to name (used for graph outputs).
func (b *Builder) Rename(name string) {
	n := b.g.Node[len(b.g.Node)-1]
	n.Output[0] = name
}

// Model wraps the graph in a model with the default-domain opset.
func (b *Builder) Model(opset int64, ir int64) *onnxpb.ModelProto {
	return &onnxpb.ModelProto{
		IrVersion:       proto.Int64(ir),
		ProducerName:    proto.String("kiln-testmodels"),
		ProducerVersion: proto.String("1"),
		OpsetImport:     []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}},
		Graph:           b.g,
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var buf [20]byte
	p := len(buf)
	for ; i > 0; i /= 10 {
		p--
		buf[p] = byte('0' + i%10)
	}
	return string(buf[p:])
}
