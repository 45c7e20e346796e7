package ort

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// The binding (onnxruntime_go v1.27.0) cannot return float16 or bfloat16
// outputs that ONNX Runtime allocates: it copies one byte per element into a
// buffer that ONNX Runtime then finds too small ("not enough space"). Outputs
// whose shape is fully known are therefore pre-allocated (see allocate).
// For the others (a dynamic or unknown dimension, or rank 0, which the
// binding cannot pre-allocate for these types) the session's model gets one
// extra graph output per such output, Cast(output, to=FLOAT), that Run
// fetches instead of the original and narrows back. float16 and bfloat16
// both widen to float32 exactly, so the result is bit-for-bit what ONNX
// Runtime computed (NaN payloads aside). The original outputs stay in the
// graph, so graph optimizations see the same consumers as before.

const widenPrefix = "kiln.ort.float32/"

// needsWiden reports whether output o must be fetched through a float32 cast.
func needsWiden(o onnx.ValueInfo) bool {
	if o.Kind != "tensor" || (o.Type != onnx.Float16 && o.Type != onnx.BFloat16) {
		return false
	}
	return !staticShape(o.Shape) || len(o.Shape.Dims) == 0
}

func staticShape(s onnx.Shape) bool {
	if !s.Ranked {
		return false
	}
	for _, d := range s.Dims {
		if !d.Known {
			return false
		}
	}
	return true
}

// widen adds Cast(name, to=FLOAT) graph outputs for the named outputs and
// returns the name of each added output by original name.
func widen(m *onnx.Model, names []string) map[string]string {
	g := m.Graph()
	used := map[string]bool{}
	for _, v := range g.GetInput() {
		used[v.GetName()] = true
	}
	for _, v := range g.GetOutput() {
		used[v.GetName()] = true
	}
	for _, t := range g.GetInitializer() {
		used[t.GetName()] = true
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			used[o] = true
		}
	}
	shapes := map[string]onnx.Shape{}
	for _, o := range m.Outputs() {
		shapes[o.Name] = o.Shape
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		hidden := widenPrefix + name
		for used[hidden] {
			hidden += "_"
		}
		used[hidden] = true
		out[name] = hidden
		op, attr, to := "Cast", "to", int64(onnx.Float)
		attrType := onnxpb.AttributeProto_INT
		nodeName := hidden
		g.Node = append(g.Node, &onnxpb.NodeProto{
			Name:   &nodeName,
			OpType: &op,
			Input:  []string{name},
			Output: []string{hidden},
			Attribute: []*onnxpb.AttributeProto{{
				Name: &attr, Type: &attrType, I: &to,
			}},
		})
		g.Output = append(g.Output, onnx.TensorType(hidden, onnx.Float, shapes[name]))
	}
	return out
}
