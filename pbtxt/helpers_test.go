package pbtxt

import (
	"os"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// tensor describes a graph input or output for onnxModel; -1 is a symbolic
// dimension ("N").
type tensor struct {
	name  string
	dt    onnx.DataType
	shape []int64
}

func shapeOf(dims []int64) onnx.Shape {
	s := onnx.Shape{Ranked: true}
	for _, d := range dims {
		if d < 0 {
			s.Dims = append(s.Dims, onnx.Dim{Param: "N"})
		} else {
			s.Dims = append(s.Dims, onnx.Dim{Value: d, Known: true})
		}
	}
	return s
}

// onnxModel serializes a small ONNX model with the given inputs and outputs
// (one Identity node per output, fed by the first input).
func onnxModel(t testing.TB, ins, outs []tensor) []byte {
	t.Helper()
	g := &onnxpb.GraphProto{Name: proto.String("g")}
	for _, in := range ins {
		g.Input = append(g.Input, onnx.TensorType(in.name, in.dt, shapeOf(in.shape)))
	}
	for _, out := range outs {
		g.Output = append(g.Output, onnx.TensorType(out.name, out.dt, shapeOf(out.shape)))
		g.Node = append(g.Node, &onnxpb.NodeProto{OpType: proto.String("Identity"), Input: []string{ins[0].name}, Output: []string{out.name}})
	}
	m := &onnxpb.ModelProto{
		IrVersion:   proto.Int64(8),
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(17)}},
		Graph:       g,
	}
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writeONNX(t testing.TB, path string, ins, outs []tensor) {
	t.Helper()
	if err := os.WriteFile(path, onnxModel(t, ins, outs), 0o644); err != nil {
		t.Fatal(err)
	}
}

// classifier is a batchable image classifier signature.
var classifierIO = struct{ ins, outs []tensor }{
	ins:  []tensor{{"images", onnx.Float, []int64{-1, 3, 224, 224}}},
	outs: []tensor{{"logits", onnx.Float, []int64{-1, 1000}}},
}
