package onnx_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

func node(name, op string, in []string, out ...string) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{Name: proto.String(name), OpType: proto.String(op), Input: in, Output: out}
}

// checkOrder fails unless every node comes after the producers of its inputs.
func checkOrder(t *testing.T, nodes []*onnxpb.NodeProto) {
	t.Helper()
	seen := map[string]bool{}
	produced := map[string]bool{}
	for _, n := range nodes {
		for _, o := range n.Output {
			produced[o] = true
		}
	}
	for _, n := range nodes {
		for _, in := range onnx.NodeInputs(n) {
			if produced[in] && !seen[in] {
				t.Fatalf("node %s comes before the producer of %s", n.GetName(), in)
			}
		}
		for _, o := range n.Output {
			seen[o] = true
		}
	}
}

func TestTopoSort(t *testing.T) {
	m := testmodels.TinyNet(1)
	g := m.Graph
	want := append([]*onnxpb.NodeProto(nil), g.Node...)
	got, err := onnx.TopoSort(g)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("TopoSort of an already sorted graph moved node %d (%s)", i, want[i].GetName())
		}
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for k := 0; k < 20; k++ {
		rng.Shuffle(len(g.Node), func(i, j int) { g.Node[i], g.Node[j] = g.Node[j], g.Node[i] })
		got, err := onnx.TopoSort(g)
		if err != nil || len(got) != len(want) {
			t.Fatalf("TopoSort(shuffled) = %d nodes, %v", len(got), err)
		}
		checkOrder(t, got)
	}
	cyc := &onnxpb.GraphProto{Name: proto.String("cyc"), Node: []*onnxpb.NodeProto{
		node("a", "Relu", []string{"y"}, "x"), node("b", "Relu", []string{"x"}, "y")}}
	if _, err := onnx.TopoSort(cyc); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("TopoSort(cycle) = %v, want a cycle error", err)
	}
}

// Outer-scope values used inside an If branch count as inputs of the If,
// so the If is ordered after their producer.
func TestNodeInputsSubgraph(t *testing.T) {
	then := &onnxpb.GraphProto{Name: proto.String("then"), Node: []*onnxpb.NodeProto{node("t", "Relu", []string{"outer"}, "r")},
		Output: []*onnxpb.ValueInfoProto{{Name: proto.String("r")}}}
	gt := onnxpb.AttributeProto_GRAPH
	ifNode := node("if", "If", []string{"cond"}, "out")
	ifNode.Attribute = []*onnxpb.AttributeProto{{Name: proto.String("then_branch"), Type: &gt, G: then}}
	got := onnx.NodeInputs(ifNode)
	if strings.Join(got, ",") != "cond,outer" {
		t.Errorf("NodeInputs(If) = %v, want [cond outer]", got)
	}
	g := &onnxpb.GraphProto{Node: []*onnxpb.NodeProto{ifNode, node("p", "Relu", []string{"x"}, "outer")}}
	sorted, err := onnx.TopoSort(g)
	if err != nil || sorted[0].GetName() != "p" {
		t.Errorf("TopoSort puts %s first (%v), want the producer of the outer value", sorted[0].GetName(), err)
	}
	ix := onnx.NewIndex(g)
	if ix.Producer["outer"].GetName() != "p" || len(ix.Consumers["outer"]) != 1 || ix.Consumers["outer"][0] != ifNode {
		t.Errorf("NewIndex: producer %v, consumers %v", ix.Producer["outer"], ix.Consumers["outer"])
	}
}

func TestInputsOpsetsAndTypes(t *testing.T) {
	p := testmodels.TinyNet(1)
	// Before IR 4 initializers were listed as inputs too; Inputs leaves them out.
	p.Graph.Input = append(p.Graph.Input, onnx.TensorType("conv1.weight", onnx.Float, onnx.Shape{Ranked: true}))
	p.OpsetImport = append(p.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: proto.String("ai.onnx.ml"), Version: proto.Int64(3)})
	m := &onnx.Model{Proto: p}
	ins := m.Inputs()
	if len(ins) != 1 || ins[0].Name != "images" || ins[0].Shape.String() != "[N,3,32,32]" || ins[0].Type != onnx.Float {
		t.Errorf("Inputs() = %v, want images float32[N,3,32,32] only", ins)
	}
	if got := ins[0].Shape.Static(); got[0] != -1 || got[1] != 3 {
		t.Errorf("Static() = %v", got)
	}
	if m.Opset() != 13 || m.Opsets()["ai.onnx.ml"] != 3 {
		t.Errorf("Opsets() = %v", m.Opsets())
	}
	m.SetOpset("", 17)
	if m.Opset() != 17 {
		t.Errorf("SetOpset: Opset() = %d, want 17", m.Opset())
	}
	if m.Initializer("fc.weight") == nil || m.Initializer("nope") != nil {
		t.Error("Initializer lookup is wrong")
	}
	for _, c := range []struct {
		in   string
		want onnx.DataType
	}{{"fp16", onnx.Float16}, {"FLOAT", onnx.Float}, {"bfloat16", onnx.BFloat16}, {"int64", onnx.Int64}, {"FLOAT8E4M3FN", onnx.Float8E4M3FN}} {
		if got, err := onnx.ParseDataType(c.in); err != nil || got != c.want {
			t.Errorf("ParseDataType(%q) = %v, %v, want %v", c.in, got, err, c.want)
		}
	}
	if _, err := onnx.ParseDataType("float128"); err == nil {
		t.Error("ParseDataType(float128) = nil error")
	}
}
