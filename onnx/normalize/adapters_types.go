package normalize

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// upgTypes is a light forward inference of element types and ranks, just
// enough for the adapters that must know them: Clip and Pad need their
// constants in the data's own element type, the legacy broadcast of
// opset 6 and Softmax before 13 depend on ranks. What it cannot tell stays
// unknown (Undefined, rank -1), and the adapters then take the path that
// needs no knowledge or refuse the node.
type upgTypes struct {
	elem map[string]onnx.DataType
	rank map[string]int
	init map[string]*onnxpb.TensorProto
	// length holds the number of elements of 1-D values whose length is
	// known (shape tensors), so that a Reshape's rank follows from it.
	length map[string]int
}

func (t *upgTypes) set(name string, dt onnx.DataType, rank int) {
	if name == "" {
		return
	}
	if dt != onnx.Undefined {
		t.elem[name] = dt
	}
	if rank >= 0 {
		t.rank[name] = rank
	}
}

// typeOf returns the element type of a value, Undefined when unknown.
func (t *upgTypes) typeOf(name string) onnx.DataType { return t.elem[name] }

// rankOf returns the rank of a value, -1 when unknown.
func (t *upgTypes) rankOf(name string) int {
	if r, ok := t.rank[name]; ok {
		return r
	}
	return -1
}

// upgInferTypes records what g and its subgraphs declare (inputs, outputs,
// value_info, initializers) and propagates it through the nodes in order.
func upgInferTypes(g *onnxpb.GraphProto) *upgTypes {
	t := &upgTypes{elem: map[string]onnx.DataType{}, rank: map[string]int{}, init: map[string]*onnxpb.TensorProto{}, length: map[string]int{}}
	onnx.WalkGraphs(g, func(g *onnxpb.GraphProto) {
		for _, in := range g.GetInitializer() {
			t.init[in.GetName()] = in
			if len(in.GetDims()) == 1 {
				t.length[in.GetName()] = int(in.GetDims()[0])
			}
			t.set(in.GetName(), onnx.DataType(in.GetDataType()), len(in.GetDims()))
		}
		for _, vs := range [][]*onnxpb.ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
			for _, v := range vs {
				info := onnx.InfoOf(v)
				if info.Kind != "tensor" {
					continue
				}
				r := -1
				if info.Shape.Ranked {
					r = len(info.Shape.Dims)
				}
				t.set(v.GetName(), info.Type, r)
			}
		}
	})
	onnx.WalkGraphs(g, func(g *onnxpb.GraphProto) {
		for _, n := range g.GetNode() {
			t.infer(n)
			t.inferLength(n)
		}
	})
	return t
}

// sameAsInput lists operators whose first output has the element type and
// rank of their first input.
var upgSameAsInput = map[string]bool{
	"Abs": true, "Acos": true, "Acosh": true, "Asin": true, "Asinh": true, "Atan": true, "Atanh": true,
	"AveragePool": true, "BatchNormalization": true, "Ceil": true, "Celu": true, "Clip": true, "Conv": true,
	"ConvTranspose": true, "Cos": true, "Cosh": true, "CumSum": true, "DepthToSpace": true, "Dropout": true,
	"Elu": true, "Erf": true, "Exp": true, "Floor": true, "GlobalAveragePool": true, "GlobalLpPool": true,
	"GlobalMaxPool": true, "HardSigmoid": true, "HardSwish": true, "Hardmax": true, "Identity": true,
	"InstanceNormalization": true, "LRN": true, "LeakyRelu": true, "Log": true, "LogSoftmax": true,
	"LpNormalization": true, "LpPool": true, "MaxPool": true, "MeanVarianceNormalization": true, "Mish": true,
	"Neg": true, "PRelu": true, "Pad": true, "Reciprocal": true, "Relu": true, "Resize": true, "Round": true,
	"Selu": true, "Shrink": true, "Sigmoid": true, "Sign": true, "Sin": true, "Sinh": true, "Slice": true,
	"Softmax": true, "Softplus": true, "Softsign": true, "SpaceToDepth": true, "Split": true, "Sqrt": true,
	"Tan": true, "Tanh": true, "ThresholdedRelu": true, "Tile": true, "TopK": true, "Transpose": true,
	"Upsample": true, "ReverseSequence": true, "ScatterElements": true, "Scatter": true, "ScatterND": true,
}

// upgBroadcast lists the element-wise operators with several inputs.
var upgBroadcast = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Pow": true, "Max": true, "Min": true, "Mean": true,
	"Sum": true, "Mod": true, "And": true, "Or": true, "Xor": true, "Equal": true, "Greater": true, "Less": true,
	"GreaterOrEqual": true, "LessOrEqual": true, "Where": true, "BitShift": true,
}

var upgBoolOut = map[string]bool{
	"And": true, "Or": true, "Xor": true, "Not": true, "Equal": true, "Greater": true, "Less": true,
	"GreaterOrEqual": true, "LessOrEqual": true, "IsNaN": true, "IsInf": true,
}

func (t *upgTypes) infer(n *onnxpb.NodeProto) {
	in, out := n.GetInput(), n.GetOutput()
	if len(out) == 0 {
		return
	}
	first := ""
	if len(in) > 0 {
		first = in[0]
	}
	op := n.GetOpType()
	dt, r := t.typeOf(first), t.rankOf(first)
	switch {
	case upgSameAsInput[op]:
		t.set(out[0], dt, r)
		if op == "Split" {
			for _, o := range out[1:] {
				t.set(o, dt, r)
			}
		}
		if op == "TopK" && len(out) > 1 {
			t.set(out[1], onnx.Int64, r)
		}
		if op == "MaxPool" && len(out) > 1 {
			t.set(out[1], onnx.Int64, r)
		}
		if op == "Dropout" && len(out) > 1 {
			t.set(out[1], onnx.Undefined, r)
		}
		return
	case upgBroadcast[op]:
		r = 0
		for _, i := range in {
			ri := t.rankOf(i)
			if ri < 0 {
				r = -1
				break
			}
			r = max(r, ri)
		}
		if upgBoolOut[op] {
			dt = onnx.Bool
		} else if op == "Where" && len(in) > 1 {
			dt = t.typeOf(in[1])
		}
		t.set(out[0], dt, r)
		return
	}
	t.set(out[0], t.outType(n, dt), t.outRank(n, r))
}

// outType is the element type of the first output of the operators that
// are not the same as their input.
func (t *upgTypes) outType(n *onnxpb.NodeProto, first onnx.DataType) onnx.DataType {
	switch n.GetOpType() {
	case "Cast":
		return onnx.DataType(upgIntAttr(n, "to", 0))
	case "Shape", "Size", "ArgMax", "ArgMin", "NonZero", "NonMaxSuppression":
		return onnx.Int64
	case "Not", "IsNaN", "IsInf":
		return onnx.Bool
	case "Constant":
		if a := upgAttr(n, "value"); a != nil && a.GetT() != nil {
			return onnx.DataType(a.GetT().GetDataType())
		}
		return onnx.Undefined
	case "ConstantOfShape":
		if a := upgAttr(n, "value"); a != nil && a.GetT() != nil {
			return onnx.DataType(a.GetT().GetDataType())
		}
		return onnx.Float
	case "DequantizeLinear":
		return onnx.Float
	case "QuantizeLinear":
		if len(n.GetInput()) > 2 {
			return t.typeOf(n.GetInput()[2])
		}
		return onnx.Uint8
	case "If", "Loop", "Scan", "EyeLike", "RandomNormal", "RandomUniform", "Multinomial", "OneHot",
		"RandomNormalLike", "RandomUniformLike", "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul":
		return onnx.Undefined
	}
	return first
}

// outRank is the rank of the first output, -1 when unknown.
func (t *upgTypes) outRank(n *onnxpb.NodeProto, first int) int {
	switch n.GetOpType() {
	case "Flatten", "Gemm":
		return 2
	case "Shape":
		return 1
	case "Size":
		return 0
	case "Cast", "Expand", "Concat", "Gather", "GatherElements":
		if n.GetOpType() == "Gather" {
			if ri := t.rankOf(upgInput(n, 1)); first >= 0 && ri >= 0 {
				return first + ri - 1
			}
			return -1
		}
		if n.GetOpType() == "Expand" {
			return -1
		}
		return first
	case "MatMul":
		if r1 := t.rankOf(upgInput(n, 1)); first >= 2 && r1 >= 2 {
			return max(first, r1)
		}
		return -1
	case "Constant":
		if a := upgAttr(n, "value"); a != nil && a.GetT() != nil {
			return len(a.GetT().GetDims())
		}
	case "Reshape":
		if l, ok := t.length[upgInput(n, 1)]; ok {
			return l
		}
	case "Unsqueeze", "Squeeze":
		return t.squeezeRank(n, first)
	case "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
		"ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin":
		if upgIntAttr(n, "keepdims", 1) == 1 {
			return first
		}
		if n.GetOpType() == "ArgMax" || n.GetOpType() == "ArgMin" {
			if first > 0 {
				return first - 1
			}
			return -1
		}
		if a := upgAttr(n, "axes"); a != nil && first >= 0 {
			return first - len(a.GetInts())
		}
	}
	return -1
}

func (t *upgTypes) squeezeRank(n *onnxpb.NodeProto, first int) int {
	if first < 0 {
		return -1
	}
	k := -1
	if a := upgAttr(n, "axes"); a != nil {
		k = len(a.GetInts())
	} else if s := t.init[upgInput(n, 1)]; s != nil && len(s.GetDims()) == 1 {
		k = int(s.GetDims()[0])
	}
	if k < 0 {
		return -1
	}
	if n.GetOpType() == "Unsqueeze" {
		return first + k
	}
	return first - k
}

// upgInput returns n's i-th input, "" when it has none.
func upgInput(n *onnxpb.NodeProto, i int) string {
	if i < len(n.GetInput()) {
		return n.GetInput()[i]
	}
	return ""
}

// inferLength follows the length of 1-D shape tensors through the nodes
// that build them (Shape, Cast, Concat, Unsqueeze of a scalar, Slice with
// constant bounds).
func (t *upgTypes) inferLength(n *onnxpb.NodeProto) {
	out := upgOutput(n, 0)
	in0 := upgInput(n, 0)
	l, ok := -1, false
	switch n.GetOpType() {
	case "Shape":
		if r := t.rankOf(in0); r >= 0 && upgAttr(n, "start") == nil && upgAttr(n, "end") == nil {
			l, ok = r, true
		}
	case "Cast", "Identity", "Neg", "Abs":
		l, ok = t.length[in0]
	case "Constant":
		if a := upgAttr(n, "value"); a != nil && a.GetT() != nil && len(a.GetT().GetDims()) == 1 {
			l, ok = int(a.GetT().GetDims()[0]), true
		}
	case "Concat":
		l, ok = 0, true
		for _, i := range n.GetInput() {
			li, known := t.length[i]
			if !known {
				ok = false
				break
			}
			l += li
		}
	case "Unsqueeze":
		if t.rankOf(in0) == 0 && t.squeezeRank(n, 0) == 1 {
			l, ok = 1, true
		}
	case "Slice":
		l, ok = t.sliceLength(n)
	}
	if ok && out != "" {
		t.length[out] = l
		t.set(out, onnx.Undefined, 1)
	}
}

// sliceLength is the length of a Slice of a 1-D value of known length
// with constant bounds and unit steps.
func (t *upgTypes) sliceLength(n *onnxpb.NodeProto) (int, bool) {
	size, ok := t.length[upgInput(n, 0)]
	if !ok {
		return 0, false
	}
	var starts, ends []int64
	if a, b := upgAttr(n, "starts"), upgAttr(n, "ends"); a != nil && b != nil {
		starts, ends = a.GetInts(), b.GetInts()
	} else {
		var err1, err2 error
		starts, err1 = t.constInts(upgInput(n, 1))
		ends, err2 = t.constInts(upgInput(n, 2))
		if err1 != nil || err2 != nil || upgInput(n, 4) != "" {
			return 0, false
		}
	}
	if len(starts) != 1 || len(ends) != 1 {
		return 0, false
	}
	clamp := func(v int64) int64 {
		if v < 0 {
			v += int64(size)
		}
		return max(0, min(v, int64(size)))
	}
	return int(max(0, clamp(ends[0])-clamp(starts[0]))), true
}
