package normalize

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// scan8Model is a running sum over axis 1 of x [2,3,2], for each of the 2
// batch elements (Scan-8's batch axis 0), backwards when reverse: outputs
// the final sums [2,2] and the partial sums [2,3,2].
func scan8Model(t testing.TB, seqLens bool, reverse bool) *onnx.Model {
	body := &onnxpb.GraphProto{Name: proto.String("body"),
		Node: []*onnxpb.NodeProto{
			upgNode("Add", []string{"sum_in", "next"}, []string{"sum_out"}),
			{Name: proto.String("Identity_0"), OpType: proto.String("Identity"), Input: []string{"sum_out"}, Output: []string{"scan_out"}},
		},
		Input:  []*onnxpb.ValueInfoProto{upgIO{"sum_in", onnx.Float, []int64{2}}.proto(), upgIO{"next", onnx.Float, []int64{2}}.proto()},
		Output: []*onnxpb.ValueInfoProto{upgIO{"sum_out", onnx.Float, []int64{2}}.proto(), upgIO{"scan_out", onnx.Float, []int64{2}}.proto()},
	}
	attrs := []*onnxpb.AttributeProto{upgGraphAttr("body", body), upgAI("num_scan_inputs", 1)}
	if reverse {
		attrs = append(attrs, upgAIs("directions", 1))
	}
	ins := []upgIO{{"initial", onnx.Float, []int64{2, 2}}, {"x", onnx.Float, []int64{2, 3, 2}}}
	first := ""
	if seqLens {
		ins = append(ins, upgIO{"lens", onnx.Int32, []int64{2}})
		first = "lens"
	}
	return upgModel(t, 8, ins, []upgIO{{"y", onnx.Float, nil}, {"z", onnx.Float, nil}}, nil,
		upgNode("Scan", []string{first, "initial", "x"}, []string{"y", "z"}, attrs...))
}

// Scan-8 with a batch of 2, forwards and backwards, runs the same after
// the upgrade to 13 and 17 (an outer Scan-9 over the batch around the
// original body); with sequence_lens it is refused with the reason.
func TestUpgradeScan8(t *testing.T) {
	ortest.Init(t)
	feeds := map[string]*onnx.Tensor{
		"initial": {Name: "initial", Type: onnx.Float, Dims: []int64{2, 2}, Data: []float32{0, 0, 10, 20}},
		"x":       {Name: "x", Type: onnx.Float, Dims: []int64{2, 3, 2}, Data: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
	}
	for _, reverse := range []bool{false, true} {
		m := scan8Model(t, false, reverse)
		want, err := upgRun(t, m, feeds)
		if err != nil {
			t.Fatalf("Scan-8 as given: %v", err)
		}
		for _, to := range []int64{13, 17} {
			up, _, err := Upgrade(m, to)
			if err != nil {
				t.Fatalf("Upgrade(Scan-8, %d) = %v", to, err)
			}
			got, err := upgRun(t, up, feeds)
			if err != nil {
				t.Fatalf("upgraded to %d: %v", to, err)
			}
			for _, o := range []string{"y", "z"} {
				if !sameTensor(got[o], want[o]) {
					t.Errorf("reverse=%v, opset %d: %s = %v %v, want %v %v", reverse, to, o, got[o].Dims, got[o].Data, want[o].Dims, want[o].Data)
				}
			}
		}
	}
	_, _, err := Upgrade(scan8Model(t, true, false), 13)
	var ne *upgNodeError
	if !errors.As(err, &ne) || ne.Op != "Scan" {
		t.Errorf("Upgrade(Scan-8 with sequence_lens) = %v, want a refusal naming the Scan node", err)
	}
}

func sameTensor(a, b *onnx.Tensor) bool {
	if a == nil || b == nil || len(a.Dims) != len(b.Dims) {
		return false
	}
	for i := range a.Dims {
		if a.Dims[i] != b.Dims[i] {
			return false
		}
	}
	x, y := a.Data.([]float32), b.Data.([]float32)
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}
