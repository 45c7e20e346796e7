package savedmodel

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// opCtx is what an op mapping sees of one TensorFlow node.
type opCtx struct {
	e  *emitter
	fg *flatGraph // the graph n belongs to, for its neighbours and functions
	n  *tfNode
	in []string // ONNX values of the node's inputs
}

// opFunc emits the ONNX nodes computing one TensorFlow node.
type opFunc func(c *opCtx) error

// opTable maps TensorFlow ops to their ONNX emitters.
var opTable map[string]opFunc

func init() {
	opTable = map[string]opFunc{
		"Placeholder": placeholder, "Const": constOp, "NoOp": nothing, "Assert": nothing,
		"Identity": identity, "IdentityN": identityN, "StopGradient": identity, "PreventGradient": identity,
		"Snapshot": identity, "PlaceholderWithDefault": identity, "ReadVariableOp": identity, "EnsureShape": identity,
	}
	for tf, ox := range unaryOps {
		opTable[tf] = unary(ox)
	}
	for tf, ox := range binaryOps {
		opTable[tf] = binaryOp(ox)
	}
	for k, v := range mathOps {
		opTable[k] = v
	}
	for k, v := range nnOps {
		opTable[k] = v
	}
	for _, ops := range []map[string]opFunc{shapeOps, sliceOps, loopOps, rnnOps, xlaOps} {
		for k, v := range ops {
			opTable[k] = v
		}
	}
}

// out is the ONNX value of the node's output i.
func (c *opCtx) out(i int) string { return c.n.name + ":" + strconv.Itoa(i) }

// emit adds a node writing the TF node's first output.
func (c *opCtx) emit(op string, ins []string, attrs ...*onnxpb.AttributeProto) {
	c.e.node(op, ins, []string{c.out(0)}, attrs...)
}

// tmp adds a node writing a fresh value.
func (c *opCtx) tmp(op string, ins []string, attrs ...*onnxpb.AttributeProto) string {
	return c.e.tmp(c.n.name+"/"+op, op, ins, attrs...)
}

func (c *opCtx) input(i int) (string, error) {
	if i >= len(c.in) {
		return "", fmt.Errorf("has %d inputs, needs at least %d", len(c.in), i+1)
	}
	return c.in[i], nil
}

// constant returns input i's value when it is a constant.
func (c *opCtx) constant(i int) (*onnx.Tensor, bool) {
	if i >= len(c.in) {
		return nil, false
	}
	return c.e.value(c.in[i])
}

// constInts returns input i as integers; it must be a constant.
func (c *opCtx) constInts(i int) ([]int64, error) {
	t, ok := c.constant(i)
	if !ok {
		return nil, fmt.Errorf("input %d (%s) must be a constant", i, c.in[i])
	}
	f, err := t.Float64s()
	if err != nil {
		return nil, fmt.Errorf("input %d (%s): %w", i, c.in[i], err)
	}
	out := make([]int64, len(f))
	for j, v := range f {
		out[j] = int64(v)
	}
	return out, nil
}

// int64Input returns input i cast to int64, as ONNX wants shapes and axes.
func (c *opCtx) int64Input(i int) (string, error) {
	if v, err := c.constInts(i); err == nil {
		t, _ := c.constant(i)
		return c.e.constant(c.e.fresh(c.n.name+"/i64"), &onnx.Tensor{Type: onnx.Int64, Dims: t.Dims, Data: v})
	}
	x, err := c.input(i)
	if err != nil {
		return "", err
	}
	return c.tmp("Cast", []string{x}, attrInt("to", int64(onnx.Int64))), nil
}

// dims returns input i's static shape (-1 for unknown sizes) when its rank
// is known: from a constant, the producing node's _output_shapes attribute
// or a graph input's declared shape.
func (c *opCtx) dims(i int) ([]int64, bool) {
	if t, ok := c.constant(i); ok {
		return t.Dims, true
	}
	if i >= len(c.in) || i >= len(c.n.inputs) {
		return nil, false
	}
	if c.fg != nil {
		name, idx := refNode(c.n.inputs[i])
		if p := c.fg.nodes[name]; p != nil {
			if s := p.attr["_output_shapes"].GetList().GetShape(); idx < len(s) {
				if d, unknown := Shape(s[idx]); !unknown {
					return d, true
				}
			}
		}
	}
	for _, vi := range c.e.g.GetInput() {
		if s := onnx.ShapeOf(vi.GetType().GetTensorType().GetShape()); vi.GetName() == c.in[i] && s.Ranked {
			d := make([]int64, len(s.Dims))
			for j, x := range s.Dims {
				d[j] = -1
				if x.Known {
					d[j] = x.Value
				}
			}
			return d, true
		}
	}
	return nil, false
}

// outDims is the node's own recorded shape of output k, when it has one.
func (c *opCtx) outDims(k int) ([]int64, bool) {
	s := c.n.attr["_output_shapes"].GetList().GetShape()
	if k >= len(s) {
		return nil, false
	}
	d, unknown := Shape(s[k])
	return d, !unknown
}

func (c *opCtx) attr(name string) *smpb.AttrValue { return c.n.attr[name] }

// dtype is the ONNX type of a type attribute (T, DstT, dtype).
func (c *opCtx) dtype(name string) (onnx.DataType, error) {
	a, ok := c.n.attr[name]
	if !ok {
		return 0, fmt.Errorf("no attribute %s", name)
	}
	return ONNXType(a.GetType() % 100)
}

func (c *opCtx) boolAttr(name string) bool { return c.n.attr[name].GetB() }
func (c *opCtx) intAttr(name string) int64 { return c.n.attr[name].GetI() }
func (c *opCtx) strAttr(name string) string {
	return string(c.n.attr[name].GetS())
}
func (c *opCtx) intsAttr(name string) []int64 { return c.n.attr[name].GetList().GetI() }

func attrInt(name string, v int64) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_INT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, I: proto.Int64(v)}
}

func attrInts(name string, v ...int64) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_INTS
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, Ints: v}
}

func attrFloat(name string, v float32) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_FLOAT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, F: proto.Float32(v)}
}

func attrString(name, v string) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_STRING
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, S: []byte(v)}
}

func nothing(*opCtx) error { return nil }

func placeholder(c *opCtx) error {
	return fmt.Errorf("placeholder %s is not an input of the signature", c.n.name)
}

func constOp(c *opCtx) error {
	p, err := InitializerFromProto(c.n.attr["value"].GetTensor(), c.out(0))
	if err != nil {
		return err
	}
	c.e.initializer(c.out(0), p)
	return nil
}

func identity(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	c.emit("Identity", []string{x})
	return nil
}

func identityN(c *opCtx) error {
	for i, x := range c.in {
		c.e.node("Identity", []string{x}, []string{c.out(i)})
	}
	return nil
}

// unaryOps map one-input TF ops to the ONNX op of the same meaning.
var unaryOps = map[string]string{
	"Relu": "Relu", "Elu": "Elu", "Selu": "Selu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp",
	"Log": "Log", "Erf": "Erf", "Neg": "Neg", "Abs": "Abs", "Sqrt": "Sqrt", "Floor": "Floor", "Ceil": "Ceil",
	"Reciprocal": "Reciprocal", "Inv": "Reciprocal", "Sin": "Sin", "Cos": "Cos", "Softplus": "Softplus",
	"Sign": "Sign", "Round": "Round", "LogicalNot": "Not", "Softsign": "Softsign",
}

func unary(op string) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		c.emit(op, []string{x})
		return nil
	}
}

// binaryOps map broadcasting two-input TF ops to ONNX ones.
var binaryOps = map[string]string{
	"Add": "Add", "AddV2": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div", "Div": "Div",
	"Maximum": "Max", "Minimum": "Min", "Pow": "Pow", "Equal": "Equal", "Greater": "Greater",
	"GreaterEqual": "GreaterOrEqual", "Less": "Less", "LessEqual": "LessOrEqual", "LogicalAnd": "And",
	"LogicalOr": "Or",
}

func binaryOp(op string) opFunc {
	return func(c *opCtx) error {
		if len(c.in) != 2 {
			return fmt.Errorf("has %d inputs, want 2", len(c.in))
		}
		c.emit(op, c.in)
		return nil
	}
}
