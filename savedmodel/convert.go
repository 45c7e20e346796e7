package savedmodel

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// DefaultSignature is the signature Convert uses when none is named.
const DefaultSignature = "serving_default"

// DefaultOpset is the ONNX default-domain opset Convert writes.
const DefaultOpset = 17

// ConvertOptions says which part of a SavedModel Convert turns into ONNX.
// The zero value picks the "serve" meta graph, its serving_default
// signature and DefaultOpset.
type ConvertOptions struct {
	// Tags is the meta graph's tag set ("serve", "serve,gpu"); "" means
	// DefaultTags.
	Tags string
	// Signature is the SignatureDef key; "" means DefaultSignature.
	Signature string
	// Opset is the ONNX opset; 0 means DefaultOpset. Only 17 is written
	// today: later opsets move Reduce* axes to inputs.
	Opset int64
	// Shapes gives the shapes of signature inputs, by signature key or
	// ONNX name, -1 for a dynamic dimension: they fill in the rank and
	// the dimensions TensorFlow left unknown, and must agree with those it
	// knows. Shapes are otherwise inferred from the graph.
	Shapes map[string][]int64
}

// Validate checks the options.
func (o ConvertOptions) Validate() error {
	if o.Opset != 0 && o.Opset != DefaultOpset {
		return fmt.Errorf("opset %d: only opset %d is supported", o.Opset, DefaultOpset)
	}
	return nil
}

// NameMapping records how one signature argument became an ONNX graph
// input or output: clients keep using Key, Triton sees ONNX.
type NameMapping struct {
	// Key is the signature's argument name ("input_1").
	Key string `json:"key"`
	// Tensor is the graph tensor TensorFlow binds it to
	// ("serving_default_input_1:0").
	Tensor string `json:"tensor"`
	// ONNX is the sanitized graph input or output name.
	ONNX  string `json:"onnx"`
	DType string `json:"dtype"`
	// Shape is the best-known shape, -1 for a dynamic dimension; it is
	// nil when UnknownRank.
	Shape       []int64 `json:"shape"`
	UnknownRank bool    `json:"unknown_rank,omitempty"`
	// ShapeFrom says how the shape became known: ShapeFromSignature,
	// ShapeFromGraph or ShapeFromGiven.
	ShapeFrom string `json:"shape_from,omitempty"`
}

// Conversion is the result of Convert.
type Conversion struct {
	Model *onnx.Model
	// Tags and Signature are what was converted.
	Tags      string
	Signature string
	Inputs    []NameMapping
	Outputs   []NameMapping
}

// UnsupportedOp is one node whose op Convert has no ONNX mapping for.
type UnsupportedOp struct {
	Node string
	Op   string
}

// UnsupportedOpsError lists every node of the converted signature whose op
// has no mapping, all at once.
type UnsupportedOpsError struct {
	File string
	Ops  []UnsupportedOp
}

func (e *UnsupportedOpsError) Error() string {
	var b strings.Builder
	seen := map[string]bool{}
	var kinds []string
	for _, o := range e.Ops {
		if !seen[o.Op] {
			seen[o.Op] = true
			kinds = append(kinds, o.Op)
		}
	}
	fmt.Fprintf(&b, "%s: %d node(s) use ops with no ONNX mapping (%s):", e.File, len(e.Ops), strings.Join(kinds, ", "))
	for _, o := range e.Ops {
		fmt.Fprintf(&b, "\n  %s (op %s)", o.Node, o.Op)
	}
	return b.String()
}

// Convert turns one signature of a SavedModel into an ONNX model: functions
// inlined, variables frozen to initializers, control dependencies, NoOps
// and Asserts dropped, Identity chains collapsed and everything the
// signature's outputs do not need pruned. NHWC convolutions and pools are
// wrapped in Transposes that a later pass cancels between layers.
func Convert(ctx context.Context, m *Model, o ConvertOptions) (*Conversion, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Tags == "" {
		o.Tags = DefaultTags
	}
	if o.Signature == "" {
		o.Signature = DefaultSignature
	}
	file := join(m.Dir, ModelFile)
	mg, err := m.MetaGraph(o.Tags)
	if err != nil {
		return nil, err
	}
	sd, ok := mg.GetSignatureDef()[o.Signature]
	if !ok {
		var keys []string
		for k := range mg.GetSignatureDef() {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return nil, fmt.Errorf("%s: no signature %q (the meta graph %q has %q)", file, o.Signature, o.Tags, keys)
	}
	b, err := m.Bundle(ctx)
	if err != nil {
		return nil, err
	}
	fg, err := flatten(mg, file)
	if err != nil {
		return nil, err
	}
	vars, err := bindVariables(ctx, fg, mg, b)
	if err != nil {
		return nil, err
	}
	c := &Conversion{Tags: o.Tags, Signature: o.Signature}
	if err := checkGiven(sd, o.Shapes); err != nil {
		return nil, fmt.Errorf("%s: signature %q: %w", file, o.Signature, err)
	}
	g, err := buildGraph(fg, sd, vars, c, o.Shapes)
	if err != nil {
		return nil, err
	}
	optimize(g)
	c.Model = &onnx.Model{Proto: &onnxpb.ModelProto{
		IrVersion:       proto.Int64(8),
		ProducerName:    proto.String("kiln"),
		ProducerVersion: proto.String("import"),
		OpsetImport:     []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(DefaultOpset)}},
		Graph:           g,
	}}
	return c, nil
}

// Sanitize turns a signature key into a graph name Triton and its clients
// accept: letters, digits and '_' kept, anything else becomes '_'.
func Sanitize(key string) string {
	var b strings.Builder
	for i, r := range key {
		ok := r == '_' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9' && i > 0)
		if ok {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "_"
	}
	return b.String()
}

// mapping describes one signature argument, its shape still to be
// recorded.
func mapping(key string, ti *smpb.TensorInfo) (NameMapping, onnx.DataType, error) {
	dt, err := ONNXType(ti.GetDtype() % 100)
	if err != nil {
		return NameMapping{}, 0, fmt.Errorf("signature argument %s (%s): %w", key, ti.GetName(), err)
	}
	return NameMapping{Key: key, Tensor: ti.GetName(), ONNX: Sanitize(key), DType: ti.GetDtype().String()}, dt, nil
}
