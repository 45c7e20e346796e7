package normalize

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"google.golang.org/protobuf/proto"
)

// upgIO declares a graph input or output; dims nil means unranked.
type upgIO struct {
	name string
	dt   onnx.DataType
	dims []int64
}

func (v upgIO) proto() *onnxpb.ValueInfoProto {
	if v.dims == nil {
		vi := onnx.TensorType(v.name, v.dt, onnx.Shape{})
		return vi
	}
	s := onnx.Shape{Ranked: true}
	for _, d := range v.dims {
		s.Dims = append(s.Dims, onnx.Dim{Value: d, Known: true})
	}
	return onnx.TensorType(v.name, v.dt, s)
}

// upgModel builds a one-graph model at the given default-domain opset.
func upgModel(t testing.TB, opset int64, ins, outs []upgIO, inits []*onnx.Tensor, nodes ...*onnxpb.NodeProto) *onnx.Model {
	t.Helper()
	g := &onnxpb.GraphProto{Name: proto.String("g"), Node: nodes}
	for _, v := range ins {
		g.Input = append(g.Input, v.proto())
	}
	for _, v := range outs {
		g.Output = append(g.Output, v.proto())
	}
	for _, it := range inits {
		p, err := onnx.Encode(it, onnx.Raw)
		if err != nil {
			t.Fatal(err)
		}
		p.Name = proto.String(it.Name)
		g.Initializer = append(g.Initializer, p)
	}
	ir := upgIRVersion(opset)
	if ir < 4 {
		ir = 4 // initializers need not be listed as inputs
	}
	return &onnx.Model{Proto: &onnxpb.ModelProto{
		IrVersion:   proto.Int64(ir),
		Graph:       g,
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}},
	}}
}

func upgNode(op string, in, out []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{Name: proto.String(op + "_0"), OpType: proto.String(op), Input: in, Output: out, Attribute: attrs}
}

func upgAF(name string, f float32) *onnxpb.AttributeProto {
	ty := onnxpb.AttributeProto_FLOAT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &ty, F: proto.Float32(f)}
}

func upgAFs(name string, f ...float32) *onnxpb.AttributeProto {
	ty := onnxpb.AttributeProto_FLOATS
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &ty, Floats: f}
}

func upgAI(name string, v int64) *onnxpb.AttributeProto { return upgIntAttrProto(name, v) }

func upgAIs(name string, v ...int64) *onnxpb.AttributeProto { return upgIntsAttrProto(name, v) }

func upgAS(name, v string) *onnxpb.AttributeProto {
	ty := onnxpb.AttributeProto_STRING
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &ty, S: []byte(v)}
}

// upgFloats is a fixed input with distinct values in [-5, 5) (no ties for
// TopK, ArgMax and Hardmax).
func upgFloats(name string, dims ...int64) *onnx.Tensor {
	n, _ := onnx.NumElements(dims)
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((i*37)%101)/10 - 5 + float32(i)*1e-4
	}
	return &onnx.Tensor{Name: name, Type: onnx.Float, Dims: dims, Data: x}
}

// upgRun runs m in ONNX Runtime on the inputs (no graph optimization, so
// the rewrite itself is what runs).
func upgRun(t testing.TB, m *onnx.Model, in map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	s, err := ort.NewSessionFromBytes(b, ort.SessionOptions{IntraOpThreads: 1, InterOpThreads: 1, OptLevel: ort.OptDisabled})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Run(context.Background(), in, nil)
}

// upgDiff compares two runs' outputs and describes the first difference
// larger than tol ("" when they match).
func upgDiff(want, got map[string]*onnx.Tensor, tol float64) string {
	if len(want) != len(got) {
		return fmt.Sprintf("%d outputs, want %d", len(got), len(want))
	}
	for name, w := range want {
		g := got[name]
		if g == nil {
			return "output " + name + " missing"
		}
		if fmt.Sprint(g.Dims) != fmt.Sprint(w.Dims) || g.Type != w.Type {
			return fmt.Sprintf("output %s is %s%v, want %s%v", name, g.Type, g.Dims, w.Type, w.Dims)
		}
		if w.Type == onnx.String || w.Type == onnx.Bool {
			if fmt.Sprint(g.Data) != fmt.Sprint(w.Data) {
				return "output " + name + " differs"
			}
			continue
		}
		wf, err1 := w.Float64s()
		gf, err2 := g.Float64s()
		if err1 != nil || err2 != nil {
			if fmt.Sprint(g.Data) != fmt.Sprint(w.Data) {
				return "output " + name + " differs"
			}
			continue
		}
		for i := range wf {
			if d := upgDelta(wf[i], gf[i]); d > tol {
				return fmt.Sprintf("output %s[%d] = %g, want %g", name, i, gf[i], wf[i])
			}
		}
	}
	return ""
}

func upgDelta(a, b float64) float64 {
	if math.IsNaN(a) && math.IsNaN(b) || a == b {
		return 0
	}
	return math.Abs(a-b) / math.Max(1, math.Abs(a))
}

// upgOps lists the op types of m's main graph in order.
func upgOps(m *onnx.Model) []string {
	var ops []string
	for _, n := range m.Graph().GetNode() {
		ops = append(ops, n.GetOpType())
	}
	return ops
}
