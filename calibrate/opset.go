package calibrate

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// opsetBreaks lists operators whose definition changed incompatibly at the
// given default-domain opset (inputs that became attributes or the reverse,
// or changed semantics). Raising a model's opset across one of them would
// change what the model computes or make it invalid.
var opsetBreaks = map[string][]int64{
	"Slice": {10}, "TopK": {10}, "Upsample": {9, 10}, "Resize": {11}, "Clip": {11}, "Pad": {11},
	"Softmax": {13}, "LogSoftmax": {13}, "Hardmax": {13}, // rewritten to their 2-D form
	"Split": {13}, "Squeeze": {13},
	"Unsqueeze": {13}, "ReduceSum": {13}, "BatchNormalization": {9}, "Scan": {9}, "Scatter": {11},
	"Dropout": {12}, // rewritten to Identity: inference ignores it
}

// rewritten are the operators raiseOpset rewrites instead of refusing.
var rewritten = map[string]bool{"Dropout": true, "Softmax": true, "LogSoftmax": true, "Hardmax": true}

func intAttrProto(name string, v int64) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_INT
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, I: proto.Int64(v)}
}

// raiseOpset raises the default-domain opset to at least target, rewriting
// inference-only Dropout nodes to Identity, and refusing when an operator's
// definition changed on the way. It also raises the IR version to the one
// that introduced the opset.
func raiseOpset(m *onnx.Model, target int64) (int64, error) {
	cur := m.Opset()
	if cur == 0 {
		cur = 1
	}
	if cur >= target {
		return cur, nil
	}
	var broken []string
	for _, n := range m.Graph().GetNode() {
		if d := n.GetDomain(); d != "" && d != "ai.onnx" {
			continue
		}
		for _, v := range opsetBreaks[n.GetOpType()] {
			if cur < v && v <= target && !rewritten[n.GetOpType()] && !slices.Contains(broken, n.GetOpType()) {
				broken = append(broken, n.GetOpType())
			}
		}
	}
	if len(broken) > 0 {
		sort.Strings(broken)
		return 0, fmt.Errorf("raising opset %d to %d would change the meaning of %s", cur, target, strings.Join(broken, ", "))
	}
	g := m.Graph()
	if cur < 12 && target >= 12 {
		ix := onnx.NewIndex(g)
		for _, n := range g.GetNode() {
			if n.GetOpType() != "Dropout" {
				continue
			}
			if outs := n.GetOutput(); len(outs) > 1 && outs[1] != "" {
				if len(ix.Consumers[outs[1]]) > 0 || ix.Outputs[outs[1]] {
					return 0, fmt.Errorf("Dropout node %q: its mask output is used", nodeName(n))
				}
			}
			n.OpType, n.Attribute = proto.String("Identity"), nil
			n.Input, n.Output = n.Input[:1], n.Output[:1]
		}
	}
	if cur < 13 && target >= 13 {
		names := newNamer(g)
		var extra []*onnxpb.NodeProto
		for _, n := range g.GetNode() {
			switch n.GetOpType() {
			case "Softmax", "LogSoftmax", "Hardmax":
			default:
				continue
			}
			// Before 13 these flattened the input to 2-D at axis (default
			// 1) and normalized each row; from 13 they work along axis
			// alone. Flatten, apply along axis 1, reshape back.
			x, y, base := n.GetInput()[0], n.GetOutput()[0], nodeName(n)
			shape, flat, out := names.value(base+"_shape"), names.value(base+"_flat"), names.value(base+"_2d")
			extra = append(extra,
				&onnxpb.NodeProto{Name: proto.String(names.value(base + "_Shape")), OpType: proto.String("Shape"), Input: []string{x}, Output: []string{shape}},
				&onnxpb.NodeProto{Name: proto.String(names.value(base + "_Flatten")), OpType: proto.String("Flatten"), Input: []string{x}, Output: []string{flat},
					Attribute: []*onnxpb.AttributeProto{intAttrProto("axis", intAttr(n, "axis", 1))}},
				&onnxpb.NodeProto{Name: proto.String(names.value(base + "_Reshape")), OpType: proto.String("Reshape"), Input: []string{out, shape}, Output: []string{y}})
			n.Input[0], n.Output[0] = flat, out
			n.Attribute = []*onnxpb.AttributeProto{intAttrProto("axis", 1)}
		}
		g.Node = append(g.Node, extra...)
		nodes, err := onnx.TopoSort(g)
		if err != nil {
			return 0, err
		}
		g.Node = nodes
	}
	m.SetOpset("", target)
	ir := map[int64]int64{11: 6, 13: 7}[target]
	if m.Proto.GetIrVersion() < ir {
		m.Proto.IrVersion = proto.Int64(ir)
	}
	return target, nil
}
