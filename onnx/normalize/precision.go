package normalize

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Precision is the numeric form a source model computes in. kiln records
// it next to the source so that no variant carries a label the source does
// not support (an "fp32" variant of an fp16 model computes nothing in fp32
// unless RaiseFP16 rewrote it).
type Precision string

// Source precisions, from the most to the least precise.
const (
	// PrecisionFP32 computes in float32 with float32 weights.
	PrecisionFP32 Precision = "fp32"
	// PrecisionMixed stores weights as float16 (or bfloat16) that Cast to
	// float32 before use, or computes in float16 between Casts in an
	// otherwise float32 graph.
	PrecisionMixed Precision = "mixed"
	// PrecisionFP16 computes in float16 (or bfloat16) end to end: half
	// weights and half activations, with half or float32 inputs and outputs.
	PrecisionFP16 Precision = "fp16"
	// PrecisionINT8 is already quantized: QuantizeLinear/DequantizeLinear,
	// QLinear* operators, ConvInteger/MatMulInteger, DynamicQuantizeLinear,
	// or 8-bit weights feeding DequantizeLinear.
	PrecisionINT8 Precision = "int8"
)

// SourcePrecision says what m computes in, with a one-line reason ("112 of
// 120 float weights are float16 and reach compute through Cast to
// float32"). It looks at every graph (subgraphs included): quantization
// operators first; then the element type each compute node (not Casts,
// constants or data movement) computes in, inferred from the graph's
// inputs, weights, Casts and value_info: fp16 when at least 90% of them
// compute in float16 or bfloat16, not counting those float16 converters
// keep in float32 (TopK, NonMaxSuppression, Range...), since converters
// leave small float32 islands; mixed when fewer do. Where no node is seen
// computing in a half type, the float weights decide: half weights read
// through Cast to float32 are mixed, half weights read directly are fp16
// when they are at least 90% of the float weights.
func SourcePrecision(m *onnx.Model) (Precision, string) {
	s := precisionStats(m)
	if s.quantOps > 0 {
		return PrecisionINT8, s.int8Reason()
	}
	half := s.halfCompute
	switch {
	case half > 0 && 10*half >= 9*(half+s.fullCompute-s.fullKept):
		return PrecisionFP16, fmt.Sprintf("%d of %d compute nodes run in %s%s", half, half+s.fullCompute, s.halfName(), s.weightClause())
	case half > 0:
		return PrecisionMixed, fmt.Sprintf("%d of %d compute nodes run in %s between Casts, the rest in float32%s", half, half+s.fullCompute, s.halfName(), s.weightClause())
	case s.halfWeights > 0:
		r := fmt.Sprintf("%d of %d float weights are %s", s.halfWeights, s.floatWeights, s.halfName())
		if s.castWeights == s.halfWeights {
			return PrecisionMixed, r + " and reach compute through Cast to float32"
		}
		if direct := s.halfWeights - s.castWeights; 10*direct >= 9*s.floatWeights {
			return PrecisionFP16, fmt.Sprintf("%s, %d of them read directly by compute nodes", r, direct)
		}
		return PrecisionMixed, fmt.Sprintf("%s (%d of them reach compute through Cast to float32)", r, s.castWeights)
	case s.fullCompute == 0 && s.floatWeights == 0:
		return PrecisionFP32, "the model has no float weights and no float compute nodes"
	}
	return PrecisionFP32, fmt.Sprintf("all %d float weights and %d compute nodes are float32", s.floatWeights, s.fullCompute)
}

// precStats is what SourcePrecision counts.
type precStats struct {
	quantOps    int            // quantization operators
	quantByOp   map[string]int // per op type
	int8Weights int            // 8-bit initializers read by DequantizeLinear
	// Float weights (initializers and Constant values), the float16 or
	// bfloat16 ones, and the half ones whose every reader is Cast(to=FLOAT).
	floatWeights, halfWeights, castWeights int
	// Compute nodes with a half or a float32 output, and the float32 ones
	// of operators float16 converters keep in float32.
	halfCompute, fullCompute, fullKept int
	bf16                               bool // the half type seen is bfloat16
}

func (s *precStats) halfName() string {
	if s.bf16 {
		return "bfloat16"
	}
	return "float16"
}

func (s *precStats) weightClause() string {
	if s.floatWeights == 0 {
		return ""
	}
	return fmt.Sprintf("; %d of %d float weights are %s", s.halfWeights, s.floatWeights, s.halfName())
}

func (s *precStats) int8Reason() string {
	var parts []string
	for _, op := range precSorted(s.quantByOp) {
		parts = append(parts, fmt.Sprintf("%d %s", s.quantByOp[op], op))
	}
	r := "quantization operators: " + strings.Join(parts, ", ")
	if s.int8Weights > 0 {
		r += fmt.Sprintf("; %d 8-bit weights feed DequantizeLinear", s.int8Weights)
	}
	return r
}

// quantOpTypes are the operators of an already quantized model (any domain).
var quantOpTypes = map[string]bool{
	"QuantizeLinear": true, "DequantizeLinear": true, "DynamicQuantizeLinear": true,
	"ConvInteger": true, "MatMulInteger": true, "DynamicQuantizeMatMul": true,
	"MatMulIntegerToFloat": true, "QGemm": true, "QAttention": true,
}

// precNoCompute are operators that move or retype data without computing on
// it: a float16 Reshape says nothing about the arithmetic precision.
var precNoCompute = map[string]bool{
	"Cast": true, "CastLike": true, "Constant": true, "ConstantOfShape": true, "Identity": true,
	"Reshape": true, "Flatten": true, "Squeeze": true, "Unsqueeze": true, "Transpose": true,
	"Concat": true, "Split": true, "Slice": true, "Gather": true, "Expand": true, "Tile": true,
	"Shape": true, "Size": true, "If": true, "Loop": true, "Scan": true,
}

// precKeptFP32 are operators that float16 converters leave in float32
// (onnxconverter-common's block list, less the ai.onnx.ml operators, whose
// types kiln does not infer): a float16 model may compute them in float32
// and still be float16 end to end.
var precKeptFP32 = precSet("NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum", "Min", "Max", "Upsample", "RandomUniformLike")

func precisionStats(m *onnx.Model) *precStats {
	s := &precStats{quantByOp: map[string]int{}}
	var walk func(g *onnxpb.GraphProto, outer map[string]onnx.DataType)
	walk = func(g *onnxpb.GraphProto, outer map[string]onnx.DataType) {
		types := inferElemTypes(g, outer)
		s.countGraph(g, types)
		for _, n := range g.GetNode() {
			for _, a := range n.GetAttribute() {
				for _, sub := range precSubgraphs(a) {
					walk(sub, types)
				}
			}
		}
	}
	walk(m.Graph(), nil)
	return s
}

func (s *precStats) countGraph(g *onnxpb.GraphProto, types map[string]onnx.DataType) {
	ix := onnx.NewIndex(g)
	for _, t := range g.GetInitializer() {
		s.countWeight(t.GetName(), onnx.DataType(t.GetDataType()), ix)
	}
	for _, n := range g.GetNode() {
		op := n.GetOpType()
		if quantOpTypes[op] || strings.HasPrefix(op, "QLinear") {
			s.quantOps++
			s.quantByOp[op]++
		}
		if op == "Constant" && len(n.GetOutput()) == 1 {
			s.countWeight(n.GetOutput()[0], types[n.GetOutput()[0]], ix)
			continue
		}
		if precNoCompute[op] {
			continue
		}
		for _, o := range n.GetOutput() {
			if precHalf(types[o]) {
				s.halfCompute++
				break
			}
			if types[o] == onnx.Float {
				s.fullCompute++
				if precKeptFP32[op] {
					s.fullKept++
				}
				break
			}
		}
	}
}

func (s *precStats) countWeight(name string, dt onnx.DataType, ix *onnx.Index) {
	if dt == onnx.Int8 || dt == onnx.Uint8 {
		for _, c := range ix.Consumers[name] {
			if c.GetOpType() == "DequantizeLinear" && len(c.GetInput()) > 0 && c.GetInput()[0] == name {
				s.int8Weights++
				break
			}
		}
		return
	}
	if dt != onnx.Float && !precHalf(dt) {
		return
	}
	s.floatWeights++
	if !precHalf(dt) {
		return
	}
	s.halfWeights++
	if dt == onnx.BFloat16 {
		s.bf16 = true
	}
	cs := ix.Consumers[name]
	for _, c := range cs {
		if c.GetOpType() != "Cast" || castTarget(c) != onnx.Float {
			return
		}
	}
	if len(cs) > 0 {
		s.castWeights++
	}
}

func precHalf(dt onnx.DataType) bool { return dt == onnx.Float16 || dt == onnx.BFloat16 }

// castTarget is the target type of a Cast node (Undefined when missing).
func castTarget(n *onnxpb.NodeProto) onnx.DataType {
	if a := precAttr(n, "to"); a != nil {
		return onnx.DataType(a.GetI())
	}
	return onnx.Undefined
}

func precAttr(n *onnxpb.NodeProto, name string) *onnxpb.AttributeProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a
		}
	}
	return nil
}

func precSubgraphs(a *onnxpb.AttributeProto) []*onnxpb.GraphProto {
	gs := a.GetGraphs()
	if a.G != nil {
		gs = append([]*onnxpb.GraphProto{a.G}, gs...)
	}
	return gs
}

func precSorted[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// sameAsFirst are operators whose outputs (the first, for several of them)
// have the element type of their first input.
var precSameType = precSet(
	"Abs", "Acos", "Acosh", "Add", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization",
	"Ceil", "Celu", "Clip", "Concat", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace",
	"Div", "Dropout", "Einsum", "Elu", "Erf", "Exp", "Expand", "Flatten", "Floor", "GRU", "Gather",
	"GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool",
	"GroupNormalization", "HardSigmoid", "HardSwish", "Hardmax", "Identity", "InstanceNormalization",
	"LRN", "LSTM", "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "LpPool",
	"MatMul", "Max", "MaxPool", "MaxRoiPool", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Pad", "Pow",
	"PRelu", "RNN", "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
	"ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu",
	"Reshape", "Resize", "ReverseSequence", "RoiAlign", "Round", "ScatterElements", "ScatterND",
	"Scatter", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Slice", "Softmax", "Softplus",
	"Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh",
	"ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unique", "Unsqueeze", "Upsample",
)

// boolOut are operators that answer with booleans.
var precBoolOut = precSet("And", "Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual", "Not", "Or", "Xor")

// int64Out are operators that answer with indices or sizes.
var precInt64Out = precSet("ArgMax", "ArgMin", "NonZero", "Shape", "Size")

func precSet(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, v := range s {
		m[v] = true
	}
	return m
}

// inferTypes returns the element type of every tensor value of g it can
// tell, from outer (the enclosing scopes), g's inputs, initializers,
// value_info and outputs, and node by node in topological order. It is
// conservative: an operator it does not know leaves its outputs unknown
// (absent) unless value_info records them.
func inferElemTypes(g *onnxpb.GraphProto, outer map[string]onnx.DataType) map[string]onnx.DataType {
	types := make(map[string]onnx.DataType, len(outer)+len(g.GetNode()))
	maps.Copy(types, outer)
	declare := func(vs []*onnxpb.ValueInfoProto) {
		for _, v := range vs {
			if dt := onnx.DataType(v.GetType().GetTensorType().GetElemType()); dt != onnx.Undefined {
				types[v.GetName()] = dt
			}
		}
	}
	declare(g.GetInput())
	for _, t := range g.GetInitializer() {
		types[t.GetName()] = onnx.DataType(t.GetDataType())
	}
	declare(g.GetValueInfo())
	declare(g.GetOutput())
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		nodes = g.GetNode()
	}
	for _, n := range nodes {
		for i, dt := range elemTypesOf(n, types) {
			if o := n.GetOutput()[i]; o != "" && dt != onnx.Undefined {
				if _, ok := types[o]; !ok {
					types[o] = dt
				}
			}
		}
	}
	return types
}

// nodeTypes is the element type of each of n's outputs (Undefined where it
// cannot tell).
func elemTypesOf(n *onnxpb.NodeProto, types map[string]onnx.DataType) []onnx.DataType {
	out := make([]onnx.DataType, len(n.GetOutput()))
	if n.GetDomain() != "" && n.GetDomain() != "ai.onnx" {
		return out
	}
	in := func(i int) onnx.DataType {
		if i < len(n.GetInput()) {
			return types[n.GetInput()[i]]
		}
		return onnx.Undefined
	}
	dtype := func(name string, def onnx.DataType) onnx.DataType {
		if a := precAttr(n, name); a != nil {
			return onnx.DataType(a.GetI())
		}
		return def
	}
	op := n.GetOpType()
	switch {
	case op == "Cast":
		out[0] = castTarget(n)
	case op == "CastLike":
		out[0] = in(1)
	case op == "Constant":
		out[0] = onnx.ConstantType(n)
	case op == "ConstantOfShape":
		out[0] = onnx.Float
		if a := precAttr(n, "value"); a != nil && a.GetT() != nil {
			out[0] = onnx.DataType(a.GetT().GetDataType())
		}
	case op == "DequantizeLinear":
		out[0] = in(1)
	case op == "QuantizeLinear":
		out[0] = dtype("output_dtype", onnx.Uint8)
		if zp := in(2); zp != onnx.Undefined {
			out[0] = zp
		}
	case op == "EyeLike", op == "RandomNormalLike", op == "RandomUniformLike", op == "Bernoulli":
		out[0] = dtype("dtype", in(0))
	case op == "RandomNormal", op == "RandomUniform":
		out[0] = dtype("dtype", onnx.Float)
	case op == "HannWindow", op == "HammingWindow", op == "BlackmanWindow":
		out[0] = dtype("output_datatype", onnx.Float)
	case op == "Where":
		out[0] = in(1)
	case op == "OneHot":
		out[0] = in(2)
	case op == "If", op == "Loop", op == "Scan":
		copy(out, bodyElemTypes(n))
	case precBoolOut[op]:
		out[0] = onnx.Bool
	case precInt64Out[op]:
		out[0] = onnx.Int64
	case precSameType[op]:
		for i := range out {
			out[i] = in(0)
		}
		precIndexOutputs(op, out)
	}
	return out
}

// fixIndexOutputs sets the index outputs of operators whose first output
// follows their input.
func precIndexOutputs(op string, out []onnx.DataType) {
	switch op {
	case "TopK", "MaxPool":
		if len(out) > 1 {
			out[1] = onnx.Int64
		}
	case "Unique":
		for i := 1; i < len(out); i++ {
			out[i] = onnx.Int64
		}
	case "Dropout":
		if len(out) > 1 {
			out[1] = onnx.Bool
		}
	case "LayerNormalization":
		// mean and inverse std follow stash_type, not the input.
		for i := 1; i < len(out); i++ {
			out[i] = onnx.Undefined
		}
	}
}

// bodyTypes reads the output types an If, Loop or Scan node declares in
// its body (Loop's body also outputs the condition first).
func bodyElemTypes(n *onnxpb.NodeProto) []onnx.DataType {
	name := "then_branch"
	skip := 0
	switch n.GetOpType() {
	case "Loop":
		name, skip = "body", 1
	case "Scan":
		name = "body"
	}
	a := precAttr(n, name)
	if a == nil || a.GetG() == nil {
		return nil
	}
	var out []onnx.DataType
	for i, o := range a.GetG().GetOutput() {
		if i >= skip {
			out = append(out, onnx.DataType(o.GetType().GetTensorType().GetElemType()))
		}
	}
	return out
}
