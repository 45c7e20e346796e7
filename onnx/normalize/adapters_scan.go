package normalize

import (
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// upgScan9 rewrites Scan-8, which runs its body over axis 1 of every scan
// input for each element of a batch axis 0 that the states carry too,
// into Scan-9, which has no batch axis: an outer Scan-9 over axis 0 of
// every state and scan input, whose body is an inner Scan-9 of the
// original body over the sequence (axis 0 of its slices) with the original
// directions. The outer Scan stacks the inner's final states and scan
// outputs back along axis 0, so every output keeps Scan-8's shape. A
// sequence_lens input (Scan-8's per-batch lengths) has no Scan-9
// equivalent and is refused.
func upgScan9(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	if u.created[n] {
		return nil, "", nil // the inner Scan this adapter wrote, already Scan-9
	}
	if upgInput(n, 0) != "" {
		return nil, "", errors.New("Scan-8 with a sequence_lens input (per-batch lengths) has no Scan-9 equivalent")
	}
	body := upgAttr(n, "body").GetG()
	if body == nil {
		return nil, "", errors.New("Scan-8 without a body")
	}
	scans := upgIntAttr(n, "num_scan_inputs", 0)
	inner := &onnxpb.NodeProto{
		Name:   proto.String(u.names.Fresh(upgNodeName(n) + "_steps")),
		OpType: proto.String("Scan"),
		Attribute: []*onnxpb.AttributeProto{
			upgGraphAttr("body", body),
			upgIntAttrProto("num_scan_inputs", scans),
		},
	}
	if d := upgAttr(n, "directions"); d != nil {
		inner.Attribute = append(inner.Attribute, upgIntsAttrProto("scan_input_directions", d.GetInts()))
	}
	outerBody := &onnxpb.GraphProto{Name: proto.String(body.GetName() + "_per_batch")}
	for _, in := range body.GetInput() {
		name := u.value(in.GetName() + "_b")
		inner.Input = append(inner.Input, name)
		outerBody.Input = append(outerBody.Input, onnx.TensorType(name, elemOf(in), onnx.Shape{}))
	}
	for _, out := range body.GetOutput() {
		name := u.value(out.GetName() + "_b")
		inner.Output = append(inner.Output, name)
		outerBody.Output = append(outerBody.Output, onnx.TensorType(name, elemOf(out), onnx.Shape{}))
	}
	outerBody.Node = []*onnxpb.NodeProto{inner}
	outer := &onnxpb.NodeProto{
		Name:   n.Name,
		OpType: proto.String("Scan"),
		Input:  append([]string(nil), n.GetInput()[1:]...),
		Output: n.GetOutput(),
		Attribute: []*onnxpb.AttributeProto{
			upgGraphAttr("body", outerBody),
			upgIntAttrProto("num_scan_inputs", int64(len(n.GetInput())-1)),
		},
	}
	u.created[inner] = true
	return []*onnxpb.NodeProto{outer}, "Scan", nil
}

// elemOf is the element type a value info declares.
func elemOf(v *onnxpb.ValueInfoProto) onnx.DataType {
	return onnx.DataType(v.GetType().GetTensorType().GetElemType())
}

func upgGraphAttr(name string, g *onnxpb.GraphProto) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_GRAPH
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &t, G: g}
}
