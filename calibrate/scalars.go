package calibrate

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// scalarOps are operators whose output has the rank of their inputs when
// those are all scalars (elementwise operators, with broadcasting).
var scalarOps = map[string]bool{
	"Abs": true, "Add": true, "Cast": true, "Ceil": true, "Clip": true, "Cos": true, "Div": true,
	"Erf": true, "Exp": true, "Floor": true, "Identity": true, "Log": true, "Max": true, "Mean": true,
	"Min": true, "Mul": true, "Neg": true, "Pow": true, "Reciprocal": true, "Relu": true, "Round": true,
	"Sigmoid": true, "Sign": true, "Sin": true, "Sqrt": true, "Sub": true, "Sum": true, "Tanh": true,
	"Where": true,
}

// scalars finds the tensors of m that are scalars (rank 0) by the graph's
// records and a few operators' rules: constants and initializers without
// dims, elementwise operators of scalars, and reductions over every axis
// without kept dimensions. Augment declares the rank of those it adds as
// outputs, since the ONNX Runtime binding cannot return a scalar output of
// unknown rank (ONNX Runtime reports a scalar and an unknown rank alike).
// Tensors it cannot tell are left out.
func scalars(m *onnx.Model) map[string]bool {
	g := m.Graph()
	s := map[string]bool{}
	for _, vs := range [][]*onnxpb.ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
		for _, v := range vs {
			if i := onnx.InfoOf(v); i.Kind == "tensor" && i.Shape.Ranked && len(i.Shape.Dims) == 0 {
				s[i.Name] = true
			}
		}
	}
	for _, t := range g.GetInitializer() {
		if len(t.GetDims()) == 0 {
			s[t.GetName()] = true
		}
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return s
	}
	for _, n := range nodes {
		outs := n.GetOutput()
		if n.GetDomain() != "" || len(outs) != 1 {
			continue
		}
		if isScalarOutput(n, s) {
			s[outs[0]] = true
		}
	}
	return s
}

func isScalarOutput(n *onnxpb.NodeProto, s map[string]bool) bool {
	op := n.GetOpType()
	switch {
	case op == "Constant":
		for _, a := range n.GetAttribute() {
			switch a.GetName() {
			case "value":
				return len(a.GetT().GetDims()) == 0
			case "value_float", "value_int", "value_string":
				return true
			}
		}
		return false
	case scalarOps[op]:
		any := false
		for _, in := range n.GetInput() {
			if in == "" {
				continue
			}
			if !s[in] {
				return false
			}
			any = true
		}
		return any
	case len(op) > 6 && op[:6] == "Reduce":
		keep, noopEmpty := int64(1), int64(0)
		for _, a := range n.GetAttribute() {
			switch a.GetName() {
			case "keepdims":
				keep = a.GetI()
			case "noop_with_empty_axes":
				noopEmpty = a.GetI()
			case "axes":
				return false // some axes, of a rank not known here
			}
		}
		ins := n.GetInput()
		return keep == 0 && noopEmpty == 0 && (len(ins) < 2 || ins[1] == "")
	}
	return false
}
