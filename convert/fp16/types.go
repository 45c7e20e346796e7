package fp16

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// ONNX's shape inference is not available in Go, and the FP16 rewrite only
// needs element types, so it infers them itself: for almost every operator
// an output has the element type of its first input; the exceptions below
// are taken from the operators' type constraints in the ONNX specification
// (onnx/onnx docs/Operators.md). An operator that is not listed at all is
// not guessed at: its outputs are typed from the graph's value_info, or the
// rewrite refuses the model.

// sameAsFirst lists default-domain operators whose every output has the
// element type of input 0.
var sameAsFirst = setOf(
	"Abs", "Acos", "Acosh", "Add", "AffineGrid", "Asin", "Asinh", "Atan", "Atanh", "Attention",
	"AveragePool", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Ceil", "Celu",
	"CenterCropPad", "Clip", "Col2Im", "Compress", "Concat", "Conv", "ConvTranspose", "Cos", "Cosh",
	"Crop", "CumSum", "DFT", "DeformConv", "DepthToSpace", "Det", "Div", "Einsum", "Elu", "Erf",
	"Exp", "Expand", "Flatten", "Floor", "GRU", "Gather", "GatherElements", "GatherND", "Gelu",
	"Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "GridSample", "GroupNormalization",
	"HardSigmoid", "HardSwish", "Hardmax", "Identity", "ImageScaler", "InstanceNormalization", "LRN",
	"LSTM", "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "LpPool", "MatMul", "Max",
	"MaxRoiPool", "MaxUnpool", "Mean", "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul",
	"Neg", "NegativeLogLikelihoodLoss", "PRelu", "Pad", "Pow", "RMSNormalization", "RNN",
	"Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
	"ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape",
	"Resize", "ReverseSequence", "RoiAlign", "RotaryEmbedding", "Round", "STFT", "Scale", "Scatter",
	"ScatterElements", "ScatterND", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Slice",
	"Softmax", "SoftmaxCrossEntropyLoss", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt",
	"Squeeze", "Sub", "Sum", "Swish", "Tan", "Tanh", "TensorScatter", "ThresholdedRelu", "Tile",
	"Transpose", "Trilu", "Unsqueeze", "Upsample", "Range",
)

// Outputs with a fixed element type, whatever the inputs are.
var (
	int64Out = setOf("Shape", "Size", "NonZero", "ArgMax", "ArgMin", "NonMaxSuppression")
	boolOut  = setOf("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor",
		"Not", "IsInf", "IsNaN", "RegexFullMatch")
	int32Out = setOf("MatMulInteger", "ConvInteger")
)

// typeAttr is an attribute that sets an operator's output element type.
type typeAttr struct {
	name string
	def  onnx.DataType // Undefined: the type of input 0
}

// typeAttrs lists the operators whose output type an attribute chooses. A
// kept (non-blocked) node of these whose output is float32 gets the
// attribute set to FLOAT16, added when absent (onnxruntime float16.py does
// the same for dtype).
var typeAttrs = map[string]typeAttr{
	"Cast":              {"to", onnx.Undefined},
	"RandomNormal":      {"dtype", onnx.Float},
	"RandomUniform":     {"dtype", onnx.Float},
	"RandomNormalLike":  {"dtype", onnx.Undefined},
	"RandomUniformLike": {"dtype", onnx.Undefined},
	"EyeLike":           {"dtype", onnx.Undefined},
	"Bernoulli":         {"dtype", onnx.Undefined},
	"Multinomial":       {"dtype", onnx.Int32},
	"HannWindow":        {"output_datatype", onnx.Float},
	"HammingWindow":     {"output_datatype", onnx.Float},
	"BlackmanWindow":    {"output_datatype", onnx.Float},
	"MelWeightMatrix":   {"output_datatype", onnx.Float},
}

// controlFlow lists the operators that own subgraphs.
var controlFlow = setOf("If", "Loop", "Scan")

// unsupportedOps are default-domain operators on sequences and optionals,
// whose values the rewrite does not track.
var unsupportedOps = setOf("SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
	"SequenceInsert", "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence",
	"Optional", "OptionalGetElement", "OptionalHasElement")

func setOf(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, v := range s {
		m[v] = true
	}
	return m
}

func isDefaultDomain(n *onnxpb.NodeProto) bool {
	d := n.GetDomain()
	return d == "" || d == "ai.onnx"
}

func attr(n *onnxpb.NodeProto, name string) *onnxpb.AttributeProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a
		}
	}
	return nil
}

func attrInt(n *onnxpb.NodeProto, name string, def int64) int64 {
	if a := attr(n, name); a != nil && a.I != nil {
		return a.GetI()
	}
	return def
}

// inferOutputs returns the element types of a default-domain node's
// outputs from the types of its inputs (Undefined where not known), or
// ok false when the rules do not cover the operator. Control-flow nodes are
// typed by the caller from their subgraphs.
func inferOutputs(n *onnxpb.NodeProto, in []onnx.DataType) (out []onnx.DataType, ok bool) {
	if !isDefaultDomain(n) {
		return nil, false
	}
	o := outTypes{n: n, in: in}
	op := n.GetOpType()
	if ta, found := typeAttrs[op]; found {
		def := ta.def
		if def == onnx.Undefined {
			def = o.get(0)
		}
		return o.all(onnx.DataType(attrInt(n, ta.name, int64(def)))), true
	}
	switch {
	case sameAsFirst[op]:
		return o.all(o.get(0)), true
	case int64Out[op]:
		return o.all(onnx.Int64), true
	case boolOut[op]:
		return o.all(onnx.Bool), true
	case int32Out[op]:
		return o.all(onnx.Int32), true
	}
	if out, ok := o.general(op); ok {
		return out, true
	}
	return o.quantOrText(op)
}

// outTypes types the outputs of one node from its input types.
type outTypes struct {
	n  *onnxpb.NodeProto
	in []onnx.DataType
}

// get is the type of input i, Undefined when the node has no such input.
func (o outTypes) get(i int) onnx.DataType {
	if i < len(o.in) {
		return o.in[i]
	}
	return onnx.Undefined
}

// all gives every output the type dt.
func (o outTypes) all(dt onnx.DataType) []onnx.DataType {
	out := make([]onnx.DataType, len(o.n.GetOutput()))
	for i := range out {
		out[i] = dt
	}
	return out
}

// firstThen gives output 0 the type first and the others rest.
func (o outTypes) firstThen(first, rest onnx.DataType) []onnx.DataType {
	out := o.all(rest)
	out[0] = first
	return out
}

// general covers the operators whose outputs follow another input than the
// first, or whose extra outputs have a type of their own.
func (o outTypes) general(op string) ([]onnx.DataType, bool) {
	n := o.n
	switch op {
	case "Constant":
		return o.all(onnx.ConstantType(n)), true
	case "ConstantOfShape":
		if a := attr(n, "value"); a != nil && a.T != nil {
			return o.all(onnx.DataType(a.T.GetDataType())), true
		}
		return o.all(onnx.Float), true
	case "CastLike", "Where":
		return o.all(o.get(1)), true
	case "OneHot":
		return o.all(o.get(2)), true
	case "TopK", "MaxPool", "Unique":
		return o.firstThen(o.get(0), onnx.Int64), true
	case "Dropout":
		return o.firstThen(o.get(0), onnx.Bool), true
	case "BatchNormalization":
		// Outputs 1-4 (training mode) have the type of the running mean.
		return o.firstThen(o.get(0), o.get(3)), true
	case "LayerNormalization":
		// Mean and InvStdDev have type U, chosen by stash_type (float).
		return o.firstThen(o.get(0), onnx.DataType(attrInt(n, "stash_type", int64(onnx.Float)))), true
	}
	return nil, false
}

// quantOrText covers the quantization operators, whose types attributes
// or scale inputs choose, and the string and image operators.
func (o outTypes) quantOrText(op string) ([]onnx.DataType, bool) {
	n := o.n
	switch op {
	case "DequantizeLinear":
		if dt := attrInt(n, "output_dtype", 0); dt != 0 {
			return o.all(onnx.DataType(dt)), true
		}
		if len(o.in) > 1 && o.get(1) != onnx.Undefined {
			return o.all(o.get(1)), true
		}
		return o.all(onnx.Float), true
	case "QuantizeLinear":
		if dt := attrInt(n, "output_dtype", 0); dt != 0 {
			return o.all(onnx.DataType(dt)), true
		}
		if len(n.GetInput()) > 2 && n.GetInput()[2] != "" {
			return o.all(o.get(2)), true
		}
		return o.all(onnx.Uint8), true
	case "DynamicQuantizeLinear":
		return []onnx.DataType{onnx.Uint8, onnx.Float, onnx.Uint8}[:len(n.GetOutput())], true
	case "QLinearConv", "QLinearMatMul":
		return o.all(o.get(7)), true
	case "TfIdfVectorizer":
		return o.all(onnx.Float), true
	case "StringConcat", "StringNormalizer":
		return o.all(onnx.String), true
	case "StringSplit":
		return o.firstThen(onnx.String, onnx.Int64), true
	case "ImageDecoder":
		return o.all(onnx.Uint8), true
	}
	return nil, false
}

// fixedFloat reports whether output i of a kept node stays float32 whatever
// its inputs are (the type is not tied to a converted input).
func fixedFloat(n *onnxpb.NodeProto, i int) bool {
	switch n.GetOpType() {
	case "LayerNormalization":
		return i > 0
	case "TfIdfVectorizer":
		return true
	}
	return false
}

// fp32Only reports why an operator must run in float32 at the given
// default-domain opset, whatever the block list, or "": its ONNX type
// constraints exclude float16 there (a float16 model using it would not
// load anywhere), float16 would change what it computes (IsInf), or ONNX
// Runtime fails to load the float16 form (Pow before opset 12).
func fp32Only(op string, opset int64) string {
	switch op {
	case "DynamicQuantizeLinear", "NonMaxSuppression", "Range", "Celu":
		return op + " has no float16 type in any opset"
	case "IsInf":
		// Float16 only from opset 20, and at any opset a finite float32
		// above 65504 would become an infinity in float16 and be detected.
		return op + " must see float32 values: float16 turns values above 65504 into infinities"
	case "QuantizeLinear", "DequantizeLinear":
		if opset < 19 {
			return op + " takes float16 only from opset 19 (formats.md §3.1)"
		}
	case "QLinearConv":
		return op + " takes float32 scales only"
	case "QLinearMatMul":
		if opset < 21 {
			return op + " takes float16 scales only from opset 21"
		}
	case "Pow":
		if opset < 12 {
			return powRule
		}
	case "CumSum":
		if opset < 14 {
			return op + " takes float16 only from opset 14"
		}
	}
	return ""
}

// defaultNodeRule reports why the default block list keeps node n float32
// for what its attributes ask, or "": ONNX Runtime's CPU provider has no
// float16 ScatterND/ScatterElements reduction ("MLFloat16 data type is not
// supported with ScatterND opset 16 when reduction is 'add'", at run time,
// not load time), and accumulating duplicates in float16 would lose
// precision anyway.
func defaultNodeRule(n *onnxpb.NodeProto) string {
	switch n.GetOpType() {
	case "ScatterND", "ScatterElements":
		if a := attr(n, "reduction"); a != nil && string(a.GetS()) != "none" {
			return n.GetOpType() + " with reduction " + string(a.GetS()) + " has no float16 kernel in ONNX Runtime's CPU provider"
		}
	}
	return ""
}

// castsAway reports whether a kept Cast or CastLike reads a float32 value to
// produce something else than a float: its input stays float32, since
// float16 would change the digits of a string, the value of an integer
// above 2048 or the bits of a double.
func castsAway(n *onnxpb.NodeProto, in []onnx.DataType) bool {
	switch n.GetOpType() {
	case "Cast":
		return len(in) > 0 && in[0] == onnx.Float && attrInt(n, "to", 0) != int64(onnx.Float)
	case "CastLike":
		return len(in) > 1 && in[0] == onnx.Float && in[1] != onnx.Float && in[1] != onnx.Undefined
	}
	return false
}

// alwaysFloatInputs are input slots of kept nodes that stay float32 because
// the specification types them tensor(float) independently of the data
// (onnxruntime float16.py ALWAYS_FLOAT_INPUTS, plus Upsample's scales).
//
// Pow's exponent (input 1) has its own type constraint, T1, and stays
// float32 too: it is exact there (2 or 0.5 in LayerNorm and RMSNorm
// patterns), and a float16 exponent made ONNX Runtime 1.24's CPU provider,
// which has no float16 Pow, cast the Constant exponent with
// InsertedPrecisionFreeCast_<name> and then fail in
// SimplifiedLayerNormFusion ("Attempting to get index by a name which does
// not exist") at the default optimization level (PP-OCRv4 rec).
//
// Pow's exponent (input 1) has a type constraint of its own, T1, from
// opset 12, and stays float32 there: it is exact (2 or 0.5 in LayerNorm
// and RMSNorm patterns), and a float16 exponent breaks ONNX Runtime (see
// powRule).
var alwaysFloatInputs = map[string][]int{
	"Resize":   {2},
	"Upsample": {1},
	"Pow":      {1},
}

// powRule explains why Pow is kept float32 below opset 12, where its
// exponent must have the base's type. ONNX Runtime 1.24's CPU provider has
// no float16 Pow: it converts a float16 initializer exponent to a float32
// copy (InsertedPrecisionFreeCast_<name>), shares equal exponents between
// nodes (ConstantSharing), and then SimplifiedLayerNormFusion fails on the
// second LayerNorm pattern ("Attempting to get index by a name which does
// not exist", PP-OCRv4 rec) at the default optimization level.
const powRule = "Pow's exponent has the base's type before opset 12, and ONNX Runtime's LayerNorm fusion fails on a float16 exponent"

func alwaysFloat(op string, slot int, opset int64) bool {
	if op == "Pow" && opset < 12 {
		return false // the whole node is float32 (fp32Only)
	}
	for _, s := range alwaysFloatInputs[op] {
		if s == slot {
			return true
		}
	}
	return false
}
