package onnx

import (
	"testing"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// TestNames: fresh names avoid every name of the graph and its subgraphs
// (inputs, initializers, node names and outputs) and each other, numbering
// from the first suffix asked for.
func TestNames(t *testing.T) {
	body := &onnxpb.GraphProto{Node: []*onnxpb.NodeProto{{Name: proto.String("inner"), Output: []string{"y"}}}}
	g := &onnxpb.GraphProto{
		Input:       []*onnxpb.ValueInfoProto{{Name: proto.String("x")}},
		Initializer: []*onnxpb.TensorProto{{Name: proto.String("w")}},
		Node: []*onnxpb.NodeProto{{
			Name: proto.String("if"), OpType: proto.String("If"), Output: []string{"out"},
			Attribute: []*onnxpb.AttributeProto{{Name: proto.String("then_branch"), G: body}},
		}},
	}
	var walked int
	WalkGraphs(g, func(*onnxpb.GraphProto) { walked++ })
	if walked != 2 {
		t.Errorf("WalkGraphs visited %d graphs, want 2", walked)
	}
	n := NewNames(g, 2)
	for _, tc := range []struct{ base, want string }{
		{"x", "x_2"}, {"w", "w_2"}, {"if", "if_2"}, {"out", "out_2"}, {"inner", "inner_2"}, {"y", "y_2"},
		{"new", "new"}, {"new", "new_2"}, {"new", "new_3"}, {"x", "x_3"},
	} {
		if got := n.Fresh(tc.base); got != tc.want {
			t.Errorf("Fresh(%q) = %q, want %q", tc.base, got, tc.want)
		}
	}
	if got := NewNames(g, 1).Fresh("x"); got != "x_1" {
		t.Errorf("NewNames(g, 1).Fresh(x) = %q, want x_1", got)
	}
}
