package normalize

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// TestFixSilero fixes Silero VAD v5's sample rate to 16000: the sr input and
// the If nodes it decides disappear, and the outputs equal the original's
// with sr=16000.
func TestFixSilero(t *testing.T) {
	ortest.Init(t)
	m, err := onnx.Load(testutil.NPMModel(t, "silero_vad_v5.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	sr := &onnx.Tensor{Type: onnx.Int64, Dims: []int64{}, Data: []int64{16000}}
	out, rep, err := Normalize(context.Background(), m, Options{Fix: map[string]*onnx.Tensor{"sr": sr}})
	if err != nil {
		t.Fatalf("Normalize(silero, sr=16000) = %v", err)
	}
	t.Logf("silero: %s; main graph %d nodes (%d If) before, %d (%d If) after", rep, len(m.Graph().GetNode()), coreOpCount(m, "If"), len(out.Graph().GetNode()), coreOpCount(out, "If"))
	for _, in := range out.Inputs() {
		if in.Name == "sr" {
			t.Errorf("Normalize(silero, sr=16000) kept input sr")
		}
	}
	for _, n := range out.Graph().GetNode() {
		for _, in := range onnx.NodeInputs(n) {
			if in == "sr" {
				t.Errorf("Normalize(silero, sr=16000): %s still reads sr", describeNode(n))
			}
		}
	}
	if err := Check(out); err != nil {
		t.Errorf("Check(normalized silero) = %v", err)
	}
	state := &onnx.Tensor{Name: "state", Type: onnx.Float, Dims: []int64{2, 1, 128}, Data: make([]float32, 256)}
	worst := 0.0
	for seed := range uint64(4) {
		audio, err := onnx.Random("input", onnx.Float, []int64{1, 512}, seed)
		if err != nil {
			t.Fatal(err)
		}
		want := coreMustRun(t, m, map[string]*onnx.Tensor{"input": audio, "state": state, "sr": sr})
		got := coreMustRun(t, out, map[string]*onnx.Tensor{"input": audio, "state": state})
		d, err := coreDiff(want, got)
		if err != nil {
			t.Errorf("chunk %d: normalized silero differs: %v", seed, err)
		}
		worst = max(worst, d)
	}
	t.Logf("silero: largest output difference over 4 chunks %g", worst)
}

// coreIfModel is y, z = If(mode == 1, then: (x + one, one), else: (x, -x))
// over inputs x (float32 [2]) and mode (int64 scalar). Both branches name
// a value r; the then branch has its own initializer, which it also
// returns: inlining copies that through an Identity node.
func coreIfModel() *onnx.Model {
	one := &onnxpb.TensorProto{Name: strRef("one"), DataType: ptrInt32(int32(onnx.Float)), Dims: []int64{1}, FloatData: []float32{1}}
	then := &onnxpb.GraphProto{
		Name:        strRef("then"),
		Initializer: []*onnxpb.TensorProto{one},
		Node:        []*onnxpb.NodeProto{coreNode("Add", "plus", []string{"x", "one"}, []string{"r"})},
		Output:      []*onnxpb.ValueInfoProto{onnx.TensorType("r", onnx.Float, onnx.Shape{}), onnx.TensorType("one", onnx.Float, onnx.Shape{})},
	}
	elseG := &onnxpb.GraphProto{
		Name:   strRef("else"),
		Node:   []*onnxpb.NodeProto{coreNode("Identity", "same", []string{"x"}, []string{"r"}), coreNode("Neg", "neg", []string{"x"}, []string{"s"})},
		Output: []*onnxpb.ValueInfoProto{onnx.TensorType("r", onnx.Float, onnx.Shape{}), onnx.TensorType("s", onnx.Float, onnx.Shape{})},
	}
	graph := func(name string, g *onnxpb.GraphProto) *onnxpb.AttributeProto {
		return &onnxpb.AttributeProto{Name: strRef(name), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: g}
	}
	ir, opset := int64(8), int64(13)
	g := &onnxpb.GraphProto{
		Name: strRef("if"),
		Input: []*onnxpb.ValueInfoProto{
			onnx.TensorType("x", onnx.Float, fixedShape([]int64{2})),
			onnx.TensorType("mode", onnx.Int64, fixedShape(nil)),
		},
		Initializer: []*onnxpb.TensorProto{{Name: strRef("k"), DataType: ptrInt32(int32(onnx.Int64)), Int64Data: []int64{1}}},
		Node: []*onnxpb.NodeProto{
			coreNode("Equal", "is1", []string{"mode", "k"}, []string{"c"}),
			coreNode("If", "if", []string{"c"}, []string{"y", "z"}, graph("then_branch", then), graph("else_branch", elseG)),
		},
		Output: []*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, fixedShape([]int64{2})), onnx.TensorType("z", onnx.Float, onnx.Shape{})},
	}
	return &onnx.Model{Proto: &onnxpb.ModelProto{IrVersion: &ir, OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: &opset}}, Graph: g}}
}

func TestFixResolvesIf(t *testing.T) {
	ortest.Init(t)
	for _, tc := range []struct {
		mode int64
		left []string
	}{
		{1, []string{"Add", "Identity"}},
		{0, []string{"Identity", "Neg"}},
	} {
		t.Run(fmt.Sprint("mode=", tc.mode), func(t *testing.T) {
			m := coreIfModel()
			mode := &onnx.Tensor{Name: "mode", Type: onnx.Int64, Dims: []int64{}, Data: []int64{tc.mode}}
			out, rep, err := Normalize(context.Background(), m, Options{Fix: map[string]*onnx.Tensor{"mode": mode}})
			if err != nil {
				t.Fatalf("Normalize(mode=%d) = %v", tc.mode, err)
			}
			var left []string
			for _, n := range out.Graph().GetNode() {
				left = append(left, n.GetOpType())
			}
			if !reflect.DeepEqual(left, tc.left) {
				t.Errorf("Normalize(mode=%d) left %v, want %v", tc.mode, left, tc.left)
			}
			if !strings.Contains(rep.String(), "fixed input mode to "+fmt.Sprint(tc.mode)) || !strings.Contains(rep.String(), "resolved 1 If node") {
				t.Errorf("Normalize(mode=%d) report = %q, want the fixed input and the resolved If", tc.mode, rep)
			}
			if err := Check(out); err != nil {
				t.Errorf("Check(normalized) = %v", err)
			}
			x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{2}, Data: []float32{3, -4}}
			want := coreMustRun(t, m, map[string]*onnx.Tensor{"x": x, "mode": mode})
			if d, err := coreDiff(want, coreMustRun(t, out, map[string]*onnx.Tensor{"x": x})); err != nil || d != 0 {
				t.Errorf("outputs after Normalize(mode=%d): difference %g, %v", tc.mode, d, err)
			}
		})
	}
}

func TestFixErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value *onnx.Tensor
		input string
		want  string
	}{
		{"no such input", &onnx.Tensor{Type: onnx.Int64, Dims: []int64{}, Data: []int64{1}}, "rate", `fixing input "rate": the model has no such input (its inputs: x, mode)`},
		{"wrong type", &onnx.Tensor{Type: onnx.Float, Dims: []int64{}, Data: []float32{1}}, "mode", `fixing input "mode": the value is float32, the input is int64`},
		{"wrong shape", &onnx.Tensor{Type: onnx.Int64, Dims: []int64{2}, Data: []int64{1, 2}}, "mode", `fixing input "mode": the value has shape [2], the input is declared []`},
		{"an initializer", &onnx.Tensor{Type: onnx.Int64, Dims: []int64{}, Data: []int64{1}}, "k", `fixing input "k": the model has no such input`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Normalize(context.Background(), coreIfModel(), Options{Fix: map[string]*onnx.Tensor{tc.input: tc.value}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Normalize(Fix %s) = %v, want %q", tc.input, err, tc.want)
			}
		})
	}
}
