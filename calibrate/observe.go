package calibrate

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// Observed lists the tensors calibration observes, in graph order: every
// float32 graph input and every node output that is or may be float32. These
// are the tensors of the full calibration cache (TensorRT wants a range for
// every network input and layer output) and a superset of the tensors the
// Q/DQ model quantizes (inputs of Conv, ConvTranspose, Gemm and MatMul and
// skip inputs of residual Adds are always graph inputs or node outputs).
// Outputs whose type cannot be told from the graph are included; Collect
// drops those that turn out not to be float32.
func Observed(m *onnx.Model) ([]string, error) {
	g := m.Graph()
	if g == nil {
		return nil, errors.New("the model has no graph")
	}
	types := inferTypes(m)
	var names []string
	seen := map[string]bool{}
	add := func(name string) {
		if name == "" || seen[name] {
			return
		}
		seen[name] = true
		if dt, ok := types[name]; ok && dt != onnx.Float {
			return
		}
		names = append(names, name)
	}
	for _, in := range m.Inputs() {
		add(in.Name)
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		for _, o := range n.GetOutput() {
			add(o)
		}
	}
	if len(names) == 0 {
		return nil, ErrNoFloatTensors
	}
	return names, nil
}

// Scope says which tensors calibration observes.
type Scope string

const (
	// ScopeQDQ observes the activations the Q/DQ model quantizes (see
	// QDQTensors): all that ranges.json and model.int8.onnx need.
	ScopeQDQ Scope = "qdq"
	// ScopeAll observes every tensor Observed lists, as the TensorRT
	// calibration cache and ONNX Runtime's TensorRT table need.
	ScopeAll Scope = "all"
)

// observedIn lists the tensors observed in scope, in graph order: those
// of Observed, and in ScopeQDQ only those QDQTensors lists (without
// exclusions, so that the baseline of an excluded run has its ranges).
// "" is ScopeAll.
func observedIn(m *onnx.Model, scope Scope) ([]string, error) {
	names, err := Observed(m)
	switch {
	case err != nil:
		return nil, err
	case scope == "" || scope == ScopeAll:
		return names, nil
	case scope != ScopeQDQ:
		return nil, fmt.Errorf("unknown calibration scope %q (want %s or %s)", scope, ScopeQDQ, ScopeAll)
	}
	want := map[string]bool{}
	for _, t := range QDQTensors(m, QuantizeOptions{}) {
		want[t] = true
	}
	var qdq []string
	for _, n := range names {
		if want[n] {
			qdq = append(qdq, n)
		}
	}
	if len(qdq) == 0 {
		return nil, ErrNothingToQuantize
	}
	return qdq, nil
}

// Augment returns a copy of m whose graph outputs also include tensors.
// Added outputs carry their element type where the graph tells it and no
// type otherwise (ONNX Runtime infers it); run the result with all outputs
// fetched (a nil output list).
func Augment(m *onnx.Model, tensors []string) (*onnx.Model, error) {
	cp := &onnx.Model{Proto: proto.Clone(m.Proto).(*onnxpb.ModelProto)}
	g := cp.Graph()
	types := inferTypes(cp)
	scalar := scalars(cp)
	have := map[string]bool{}
	for _, o := range g.GetOutput() {
		have[o.GetName()] = true
	}
	for _, t := range tensors {
		if !have[t] {
			have[t] = true
			if dt, ok := types[t]; ok && dt != onnx.Undefined {
				g.Output = append(g.Output, onnx.TensorType(t, dt, onnx.Shape{Ranked: scalar[t]}))
			} else {
				g.Output = append(g.Output, &onnxpb.ValueInfoProto{Name: proto.String(t)})
			}
		}
	}
	return cp, nil
}

// openAugmented opens an ONNX Runtime session on m with tensors as extra
// graph outputs (see Augment), the form in which Collect and Evaluate fetch
// intermediate tensors: ONNX Runtime returns only graph outputs. The
// session asks ONNX Runtime for the shapes of the extra outputs, so that
// even the first run writes them into Go memory (see
// ort.SessionOptions.InferOutputShapes). Its threads sleep instead of
// spinning while they wait for work (ort.SessionOptions.NoSpinning): the
// histogram workers run on the CPUs they leave (see workerPool), where a
// spinning thread would keep them from running, and the histograms fell
// behind ONNX Runtime.
func openAugmented(m *onnx.Model, tensors []string, so ort.SessionOptions) (*ort.Session, error) {
	so.InferOutputShapes = true
	so.NoSpinning = true
	aug, err := Augment(m, tensors)
	if err != nil {
		return nil, err
	}
	data, err := aug.Marshal()
	if err != nil {
		return nil, fmt.Errorf("augmenting the model: %w", err)
	}
	return ort.NewSessionFromBytes(data, so)
}

// inferTypes finds the element types of the values the graph records or that
// follow from a few operators' rules. Values missing from the map have an
// unknown type.
func inferTypes(m *onnx.Model) map[string]onnx.DataType {
	g := m.Graph()
	types := map[string]onnx.DataType{}
	record := func(vs []*onnxpb.ValueInfoProto) {
		for _, v := range vs {
			if i := onnx.InfoOf(v); i.Kind == "tensor" && i.Type != onnx.Undefined {
				types[i.Name] = i.Type
			} else if i.Kind != "" && i.Kind != "tensor" {
				types[i.Name] = onnx.Undefined
			}
		}
	}
	record(g.GetInput())
	record(g.GetOutput())
	record(g.GetValueInfo())
	for _, t := range g.GetInitializer() {
		types[t.GetName()] = onnx.DataType(t.GetDataType())
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return types
	}
	for _, n := range nodes {
		outs := n.GetOutput()
		if len(outs) == 0 {
			continue
		}
		if _, known := types[outs[0]]; known {
			continue
		}
		dt, ok := outputType(n, types)
		if !ok {
			continue
		}
		types[outs[0]] = dt
		if n.GetOpType() == "MaxPool" || n.GetOpType() == "TopK" {
			if len(outs) > 1 && outs[1] != "" {
				types[outs[1]] = onnx.Int64
			}
		}
	}
	return types
}

// outputType applies the element-type rule of n's operator to its first output.
func outputType(n *onnxpb.NodeProto, types map[string]onnx.DataType) (onnx.DataType, bool) {
	in := func(i int) (onnx.DataType, bool) {
		if i >= len(n.GetInput()) {
			return 0, false
		}
		dt, ok := types[n.GetInput()[i]]
		return dt, ok
	}
	switch n.GetOpType() {
	case "Shape", "Size", "ArgMax", "ArgMin", "NonZero", "NonMaxSuppression":
		return onnx.Int64, true
	case "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf":
		return onnx.Bool, true
	case "Cast":
		for _, a := range n.GetAttribute() {
			if a.GetName() == "to" {
				return onnx.DataType(a.GetI()), true
			}
		}
	case "Constant":
		if dt := onnx.ConstantType(n); dt != onnx.Undefined {
			return dt, true
		}
	case "ConstantOfShape":
		for _, a := range n.GetAttribute() {
			if a.GetName() == "value" && a.GetT() != nil {
				return onnx.DataType(a.GetT().GetDataType()), true
			}
		}
		return onnx.Float, true
	case "QuantizeLinear", "DynamicQuantizeLinear":
		if dt, ok := in(2); ok {
			return dt, true
		}
		return onnx.Uint8, true
	case "DequantizeLinear":
		return in(1)
	case "Where":
		return in(1)
	case "Range", "Gather", "GatherElements", "GatherND", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
		"Flatten", "Concat", "Slice", "Expand", "Tile", "Identity", "Relu", "Conv", "ConvTranspose", "Gemm",
		"MatMul", "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "BatchNormalization", "MaxPool", "AveragePool",
		"GlobalAveragePool", "GlobalMaxPool", "Softmax", "LogSoftmax", "Sigmoid", "Tanh", "Clip", "LeakyRelu",
		"Dropout", "Pad", "Resize", "Upsample", "LRN", "Split", "ReduceMean", "ReduceSum", "ReduceMax",
		"ReduceMin", "Pow", "Sqrt", "Exp", "Log", "Abs", "Neg", "Erf", "Gelu", "HardSigmoid", "HardSwish",
		"LayerNormalization", "InstanceNormalization", "TopK":
		return in(0)
	}
	return 0, false
}
