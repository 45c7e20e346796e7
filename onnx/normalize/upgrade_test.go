package normalize

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

type upgCase struct {
	name  string
	opset int64
	build func(t testing.TB, opset int64) *onnx.Model
	in    []*onnx.Tensor
	// summary is a part the upgrade's summary must contain.
	summary string
}

func upgF(dims ...int64) upgIO { return upgIO{"x", onnx.Float, dims} }

// upgOne builds a model of one node reading x and writing y (and more
// outputs when outs names them).
func upgOne(in upgIO, outs []upgIO, inits []*onnx.Tensor, n *onnxpb.NodeProto) func(testing.TB, int64) *onnx.Model {
	return func(t testing.TB, opset int64) *onnx.Model {
		return upgModel(t, opset, []upgIO{in}, outs, inits, n)
	}
}

func upgY(dt onnx.DataType) []upgIO { return []upgIO{{"y", dt, nil}} }

func upgCases() []upgCase {
	fy := upgY(onnx.Float)
	x234 := []*onnx.Tensor{upgFloats("x", 2, 3, 4)}
	return []upgCase{
		{"Clip min max", 9, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Clip", []string{"x"}, []string{"y"}, upgAF("min", -1.5), upgAF("max", 2))), x234, "Clip ×1"},
		{"Clip max only", 6, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Clip", []string{"x"}, []string{"y"}, upgAF("max", 0.5))), x234, "Clip ×1"},
		{"Clip no bounds", 10, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Clip", []string{"x"}, []string{"y"})), x234, "Clip ×1"},
		{"Slice", 9, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Slice", []string{"x"}, []string{"y"}, upgAIs("starts", 1, -3), upgAIs("ends", 3, 1000), upgAIs("axes", 1, 2))), x234, "Slice ×1"},
		{"Slice no axes", 7, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Slice", []string{"x"}, []string{"y"}, upgAIs("starts", 1, 0), upgAIs("ends", 2, -1))), x234, "Slice ×1"},
		{"Pad constant", 9, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Pad", []string{"x"}, []string{"y"}, upgAIs("pads", 0, 1, 2, 0, 2, 1), upgAF("value", 1.5))), x234, "Pad ×1"},
		{"Pad reflect", 10, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Pad", []string{"x"}, []string{"y"}, upgAIs("pads", 0, 1, 2, 0, 1, 1), upgAS("mode", "reflect"))), x234, "Pad ×1"},
		{"Pad edge", 7, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Pad", []string{"x"}, []string{"y"}, upgAIs("pads", 1, 0, 2, 0, 2, 3), upgAS("mode", "edge"))), x234, "Pad ×1"},
		{"Upsample-7 nearest", 7, upgOne(upgF(1, 2, 3, 4), fy, nil, upgNode("Upsample", []string{"x"}, []string{"y"}, upgAFs("scales", 1, 1, 2, 3))), []*onnx.Tensor{upgFloats("x", 1, 2, 3, 4)}, "Upsample→Resize ×1"},
		{"Upsample-7 linear", 8, upgOne(upgF(1, 2, 3, 4), fy, nil, upgNode("Upsample", []string{"x"}, []string{"y"}, upgAFs("scales", 1, 1, 2, 2.5), upgAS("mode", "linear"))), []*onnx.Tensor{upgFloats("x", 1, 2, 3, 4)}, "Upsample→Resize ×1"},
		{"Upsample-9 nearest", 9, upgOne(upgF(1, 2, 3, 4), fy, []*onnx.Tensor{{Name: "s", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, 1, 1.5, 2}}}, upgNode("Upsample", []string{"x", "s"}, []string{"y"})), []*onnx.Tensor{upgFloats("x", 1, 2, 3, 4)}, "Upsample→Resize ×1"},
		{"Upsample-9 linear", 9, upgOne(upgF(1, 2, 3, 4), fy, []*onnx.Tensor{{Name: "s", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, 1, 2, 2}}}, upgNode("Upsample", []string{"x", "s"}, []string{"y"}, upgAS("mode", "linear"))), []*onnx.Tensor{upgFloats("x", 1, 2, 3, 4)}, "Upsample→Resize ×1"},
		{"Resize-10 nearest", 10, upgOne(upgF(1, 2, 3, 4), fy, []*onnx.Tensor{{Name: "s", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, 1, 2.5, 0.75}}}, upgNode("Resize", []string{"x", "s"}, []string{"y"})), []*onnx.Tensor{upgFloats("x", 1, 2, 3, 4)}, "Resize ×1"},
		{"Resize-10 linear", 10, upgOne(upgF(1, 2, 3, 4), fy, []*onnx.Tensor{{Name: "s", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, 1, 2, 1.5}}}, upgNode("Resize", []string{"x", "s"}, []string{"y"}, upgAS("mode", "linear"))), []*onnx.Tensor{upgFloats("x", 1, 2, 3, 4)}, "Resize ×1"},
		{"Resize-10 nearest shrink", 10, upgOne(upgF(1, 2, 6, 4), fy, []*onnx.Tensor{{Name: "s", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, 1, 0.6, 0.5}}}, upgNode("Resize", []string{"x", "s"}, []string{"y"})), []*onnx.Tensor{upgFloats("x", 1, 2, 6, 4)}, "Resize ×1"},
		{"Resize-10 linear shrink", 10, upgOne(upgF(1, 2, 6, 4), fy, []*onnx.Tensor{{Name: "s", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, 1, 0.6, 0.5}}}, upgNode("Resize", []string{"x", "s"}, []string{"y"}, upgAS("mode", "linear"))), []*onnx.Tensor{upgFloats("x", 1, 2, 6, 4)}, "Resize ×1"},
		{"Squeeze", 11, upgOne(upgF(2, 1, 4), fy, nil, upgNode("Squeeze", []string{"x"}, []string{"y"}, upgAIs("axes", -2))), []*onnx.Tensor{upgFloats("x", 2, 1, 4)}, "Squeeze ×1"},
		{"Squeeze all", 9, upgOne(upgF(2, 1, 4), fy, nil, upgNode("Squeeze", []string{"x"}, []string{"y"})), []*onnx.Tensor{upgFloats("x", 2, 1, 4)}, "upgraded opset 9 to"},
		{"Unsqueeze", 9, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Unsqueeze", []string{"x"}, []string{"y"}, upgAIs("axes", 0, 3))), x234, "Unsqueeze ×1"},
		{"ReduceSum", 11, upgOne(upgF(2, 3, 4), fy, nil, upgNode("ReduceSum", []string{"x"}, []string{"y"}, upgAIs("axes", 0, -1), upgAI("keepdims", 0))), x234, "ReduceSum ×1"},
		{"ReduceSum all", 9, upgOne(upgF(2, 3, 4), fy, nil, upgNode("ReduceSum", []string{"x"}, []string{"y"})), x234, "upgraded"},
		{"ReduceMean", 11, upgOne(upgF(2, 3, 4), fy, nil, upgNode("ReduceMean", []string{"x"}, []string{"y"}, upgAIs("axes", 1))), x234, "upgraded"},
		{"Split", 9, upgModelSplit, x234, "Split ×1"},
		{"Dropout-7", 7, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Dropout", []string{"x"}, []string{"y"}, upgAF("ratio", 0.3))), x234, "Dropout ×1"},
		{"Dropout mask unused", 10, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Dropout", []string{"x"}, []string{"y", "mask"}, upgAF("ratio", 0.2))), x234, "Dropout ×1"},
		{"BatchNormalization-7", 7, upgModelBN(upgAI("spatial", 1)), []*onnx.Tensor{upgFloats("x", 2, 3, 2, 2)}, "upgraded opset 7"},
		{"BatchNormalization-9", 9, upgModelBN(), []*onnx.Tensor{upgFloats("x", 2, 3, 2, 2)}, "upgraded opset 9"},
		{"TopK", 9, upgModel2Out("TopK", onnx.Int64, upgAI("k", 3), upgAI("axis", 1)), []*onnx.Tensor{upgFloats("x", 2, 5, 3)}, "TopK ×1"},
		{"Softmax axis 1 rank 3", 11, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Softmax", []string{"x"}, []string{"y"})), x234, "Softmax ×1"},
		{"Softmax axis 0 unranked", 9, upgOne(upgIO{"x", onnx.Float, nil}, fy, nil, upgNode("Softmax", []string{"x"}, []string{"y"}, upgAI("axis", 0))), x234, "Softmax ×1"},
		{"Softmax last axis", 12, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Softmax", []string{"x"}, []string{"y"}, upgAI("axis", 2))), x234, "upgraded opset 12"},
		{"LogSoftmax", 9, upgOne(upgF(2, 3, 4), fy, nil, upgNode("LogSoftmax", []string{"x"}, []string{"y"})), x234, "LogSoftmax ×1"},
		{"Hardmax", 11, upgOne(upgF(2, 3, 4), fy, nil, upgNode("Hardmax", []string{"x"}, []string{"y"}, upgAI("axis", -2))), x234, "Hardmax ×1"},
		{"ArgMax", 11, upgOne(upgF(2, 3, 4), upgY(onnx.Int64), nil, upgNode("ArgMax", []string{"x"}, []string{"y"}, upgAI("axis", 1))), x234, "upgraded"},
		{"Gemm", 9, upgModelGemm, []*onnx.Tensor{upgFloats("x", 2, 3)}, "upgraded"},
		{"Cast", 9, upgOne(upgF(2, 3, 4), upgY(onnx.Int32), nil, upgNode("Cast", []string{"x"}, []string{"y"}, upgAI("to", int64(onnx.Int32)))), x234, "upgraded"},
		{"Scatter", 10, upgModelScatter, []*onnx.Tensor{upgFloats("x", 3, 3)}, "Scatter→ScatterElements ×1"},
		{"Softmax in If", 11, upgModelIf, []*onnx.Tensor{upgFloats("x", 2, 3, 4), {Name: "c", Type: onnx.Bool, Dims: []int64{}, Data: []bool{true}}}, "Softmax ×1"},
	}
}

func upgModelSplit(t testing.TB, opset int64) *onnx.Model {
	return upgModel(t, opset, []upgIO{upgF(2, 3, 4)}, []upgIO{{"a", onnx.Float, nil}, {"b", onnx.Float, nil}}, nil,
		upgNode("Split", []string{"x"}, []string{"a", "b"}, upgAI("axis", 2), upgAIs("split", 1, 3)))
}

func upgModelBN(attrs ...*onnxpb.AttributeProto) func(testing.TB, int64) *onnx.Model {
	return func(t testing.TB, opset int64) *onnx.Model {
		c := func(name string, v ...float32) *onnx.Tensor {
			return &onnx.Tensor{Name: name, Type: onnx.Float, Dims: []int64{3}, Data: v}
		}
		inits := []*onnx.Tensor{c("s", 1, 2, 0.5), c("b", 0, -1, 2), c("m", 0.1, 0.2, -0.3), c("v", 1, 0.5, 2)}
		return upgModel(t, opset, []upgIO{upgF(2, 3, 2, 2)}, upgY(onnx.Float), inits,
			upgNode("BatchNormalization", []string{"x", "s", "b", "m", "v"}, []string{"y"}, append(attrs, upgAF("epsilon", 1e-3))...))
	}
}

func upgModel2Out(op string, second onnx.DataType, attrs ...*onnxpb.AttributeProto) func(testing.TB, int64) *onnx.Model {
	return func(t testing.TB, opset int64) *onnx.Model {
		return upgModel(t, opset, []upgIO{upgF(2, 5, 3)}, []upgIO{{"y", onnx.Float, nil}, {"i", second, nil}}, nil,
			upgNode(op, []string{"x"}, []string{"y", "i"}, attrs...))
	}
}

func upgModelGemm(t testing.TB, opset int64) *onnx.Model {
	w := &onnx.Tensor{Name: "w", Type: onnx.Float, Dims: []int64{4, 3}, Data: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}
	b := &onnx.Tensor{Name: "b", Type: onnx.Float, Dims: []int64{4}, Data: []float32{1, -1, 0.5, 2}}
	return upgModel(t, opset, []upgIO{upgF(2, 3)}, upgY(onnx.Float), []*onnx.Tensor{w, b},
		upgNode("Gemm", []string{"x", "w", "b"}, []string{"g"}, upgAI("transB", 1), upgAF("alpha", 0.5)),
		upgNode("MatMul", []string{"g", "w"}, []string{"h"}),
		upgNode("Add", []string{"h", "x"}, []string{"y"}))
}

func upgModelScatter(t testing.TB, opset int64) *onnx.Model {
	idx := &onnx.Tensor{Name: "i", Type: onnx.Int64, Dims: []int64{2, 3}, Data: []int64{1, 0, 2, 0, 2, 1}}
	upd := &onnx.Tensor{Name: "u", Type: onnx.Float, Dims: []int64{2, 3}, Data: []float32{10, 11, 12, 13, 14, 15}}
	return upgModel(t, opset, []upgIO{upgF(3, 3)}, upgY(onnx.Float), []*onnx.Tensor{idx, upd},
		upgNode("Scatter", []string{"x", "i", "u"}, []string{"y"}, upgAI("axis", 1)))
}

// upgModelIf has a Softmax inside a branch: subgraphs are upgraded too.
func upgModelIf(t testing.TB, opset int64) *onnx.Model {
	branch := func(op string) *onnxpb.GraphProto {
		return &onnxpb.GraphProto{Name: &op, Node: []*onnxpb.NodeProto{upgNode(op, []string{"x"}, []string{op + "_y"})},
			Output: []*onnxpb.ValueInfoProto{upgIO{op + "_y", onnx.Float, nil}.proto()}}
	}
	ga := func(name string, g *onnxpb.GraphProto) *onnxpb.AttributeProto {
		ty := onnxpb.AttributeProto_GRAPH
		return &onnxpb.AttributeProto{Name: &name, Type: &ty, G: g}
	}
	m := upgModel(t, opset, []upgIO{upgF(2, 3, 4), {"c", onnx.Bool, []int64{}}}, upgY(onnx.Float), nil,
		upgNode("If", []string{"c"}, []string{"y"}, ga("then_branch", branch("Softmax")), ga("else_branch", branch("Relu"))))
	return m
}

// TestUpgradeAdapters runs every adapter's model before and after the
// upgrade to 13 and to 17 in ONNX Runtime on fixed inputs.
func TestUpgradeAdapters(t *testing.T) {
	ortest.Init(t)
	for _, c := range upgCases() {
		for _, to := range []int64{13, 17} {
			t.Run(fmt.Sprintf("%s/%d", c.name, to), func(t *testing.T) {
				m := c.build(t, c.opset)
				in := map[string]*onnx.Tensor{}
				for _, x := range c.in {
					in[x.Name] = x
				}
				want, err := upgRun(t, m, in)
				if err != nil {
					t.Fatalf("original (opset %d) does not run: %v", c.opset, err)
				}
				up, p, err := Upgrade(m, to)
				if err != nil {
					t.Fatalf("Upgrade(%s, %d) = %v", c.name, to, err)
				}
				if m.Opset() != c.opset {
					t.Errorf("Upgrade modified its input: opset %d", m.Opset())
				}
				if up.Opset() != to || p.Name != "opset" || p.Changed < 1 {
					t.Errorf("Upgrade(%s, %d) = opset %d, pass %+v", c.name, to, up.Opset(), p)
				}
				if !strings.Contains(p.Summary, c.summary) {
					t.Errorf("summary = %q, want it to contain %q", p.Summary, c.summary)
				}
				got, err := upgRun(t, up, in)
				if err != nil {
					t.Fatalf("upgraded model (ops %v) does not run: %v", upgOps(up), err)
				}
				if d := upgDiff(want, got, 1e-6); d != "" {
					t.Errorf("upgraded model (ops %v): %s", upgOps(up), d)
				}
			})
		}
	}
}

// TestUpgradeRefuses checks that nodes whose meaning cannot be carried
// over are errors naming the node and its operator.
func TestUpgradeRefuses(t *testing.T) {
	for _, c := range []struct {
		name  string
		opset int64
		n     *onnxpb.NodeProto
		want  string
	}{
		{"Dropout mask used", 9, upgNode("Dropout", []string{"x"}, []string{"y", "mask"}), `Dropout node "Dropout_0"`},
		{"BatchNormalization spatial=0", 8, upgNode("BatchNormalization", []string{"x", "s", "b", "m", "v"}, []string{"y"}, upgAI("spatial", 0)), `BatchNormalization node "BatchNormalization_0" at opset 9: spatial=0`},
		{"ImageScaler", 8, upgNode("ImageScaler", []string{"x"}, []string{"y"}), `ImageScaler node "ImageScaler_0" at opset 10`},
		{"Scan-8", 8, upgNode("Scan", []string{"", "x"}, []string{"y"}), `Scan node "Scan_0" at opset 9`},
		{"Dropout training", 6, upgNode("Dropout", []string{"x"}, []string{"y"}, upgAI("is_test", 0)), "is_test=0"},
		{"legacy broadcast, unknown rank", 6, upgNode("Add", []string{"x", "z"}, []string{"y"}, upgAI("broadcast", 1), upgAI("axis", 1)), "the ranks of x and z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			outs := []upgIO{{"y", onnx.Float, nil}}
			if len(c.n.Output) > 1 {
				outs = append(outs, upgIO{"mask", onnx.Float, nil})
			}
			m := upgModel(t, c.opset, []upgIO{{"x", onnx.Float, nil}}, outs, nil, c.n)
			_, _, err := Upgrade(m, 13)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Upgrade(%s) = %v, want an error containing %q", c.name, err, c.want)
			}
		})
	}
}

// TestUpgradeStructure checks the form of the rewrites and the pass's
// bookkeeping without running anything.
func TestUpgradeStructure(t *testing.T) {
	t.Run("above 17", func(t *testing.T) {
		m := upgModel(t, 9, []upgIO{upgF(2)}, upgY(onnx.Float), nil, upgNode("Relu", []string{"x"}, []string{"y"}))
		if _, _, err := Upgrade(m, 18); err == nil || !strings.Contains(err.Error(), "at most opset 17") {
			t.Errorf("Upgrade(m, 18) = %v, want a refusal", err)
		}
	})
	t.Run("already there", func(t *testing.T) {
		m := upgModel(t, 13, []upgIO{upgF(2)}, upgY(onnx.Float), nil, upgNode("Relu", []string{"x"}, []string{"y"}))
		up, p, err := Upgrade(m, 11)
		if err != nil || p.Changed != 0 || up.Opset() != 13 {
			t.Errorf("Upgrade(opset 13, 11) = opset %d, %+v, %v; want unchanged", up.Opset(), p, err)
		}
	})
	t.Run("version bump only", func(t *testing.T) {
		m := upgModel(t, 9, []upgIO{upgF(2)}, upgY(onnx.Float), nil, upgNode("Relu", []string{"x"}, []string{"y"}))
		up, p, err := Upgrade(m, 13)
		if err != nil || p.Changed != 1 || p.Summary != "upgraded opset 9 to 13" || up.Proto.GetIrVersion() != 7 {
			t.Errorf("Upgrade = %+v, IR %d, %v", p, up.Proto.GetIrVersion(), err)
		}
	})
	t.Run("Upsample chain", func(t *testing.T) {
		m := upgModel(t, 7, []upgIO{upgF(1, 1, 2, 2)}, upgY(onnx.Float), nil, upgNode("Upsample", []string{"x"}, []string{"y"}, upgAFs("scales", 1, 1, 2, 2)))
		up, _, err := Upgrade(m, 13)
		if err != nil {
			t.Fatal(err)
		}
		n := up.Graph().GetNode()[0]
		if n.GetOpType() != "Resize" || len(n.GetInput()) != 3 || upgStringAttr(n, "coordinate_transformation_mode", "") != "asymmetric" || upgStringAttr(n, "nearest_mode", "") != "floor" {
			t.Errorf("Upsample-7 upgraded to %v", n)
		}
	})
	t.Run("pass", func(t *testing.T) {
		m := upgModel(t, 9, []upgIO{upgF(2)}, upgY(onnx.Float), nil, upgNode("Relu", []string{"x"}, []string{"y"}))
		for _, o := range []Options{{}, {MinOpset: 9}, {MinOpset: 7}} {
			if p, err := upgradePass(context.Background(), clone(m), o); err != nil || p.Changed != 0 {
				t.Errorf("upgradePass(%+v) = %+v, %v; want nothing done", o, p, err)
			}
		}
		p, err := upgradePass(context.Background(), m, Options{MinOpset: 11})
		if err != nil || p.Summary != "upgraded opset 9 to 11" || m.Opset() != 11 {
			t.Errorf("upgradePass(MinOpset 11) = %+v, %v (opset %d)", p, err, m.Opset())
		}
	})
	t.Run("legacy broadcast", func(t *testing.T) {
		b := &onnx.Tensor{Name: "b", Type: onnx.Float, Dims: []int64{3}, Data: []float32{1, 2, 3}}
		m := upgModel(t, 6, []upgIO{upgF(2, 3, 4, 5)}, upgY(onnx.Float), []*onnx.Tensor{b},
			upgNode("Add", []string{"x", "b"}, []string{"y"}, upgAI("broadcast", 1), upgAI("axis", 1)),
		)
		up, p, err := Upgrade(m, 13)
		if err != nil {
			t.Fatal(err)
		}
		n := up.Graph().GetNode()[0]
		if len(n.GetAttribute()) != 0 || !strings.Contains(p.Summary, "Add(broadcast) ×1") {
			t.Errorf("Add = %v, summary %q", n, p.Summary)
		}
		if aligned := up.Initializer(n.GetInput()[1]); aligned == nil || !slices.Equal(aligned.GetDims(), []int64{3, 1, 1}) {
			t.Errorf("aligned B = %v, want dims [3 1 1]", aligned)
		}
	})
	t.Run("legacy broadcast of a graph input", func(t *testing.T) {
		m := upgModel(t, 6, []upgIO{upgF(2, 3, 4, 5), {"b", onnx.Float, []int64{3}}}, upgY(onnx.Float), nil,
			upgNode("Mul", []string{"x", "b"}, []string{"y"}, upgAI("broadcast", 1), upgAI("axis", 1)))
		up, p, err := Upgrade(m, 13)
		if err != nil {
			t.Fatal(err)
		}
		ns := up.Graph().GetNode()
		if got := upgOps(up); !slices.Equal(got, []string{"Unsqueeze", "Mul"}) || p.Summary != "upgraded opset 6 to 13 (Mul(broadcast) ×1)" {
			t.Fatalf("ops %v, summary %q", got, p.Summary)
		}
		axes := up.Initializer(ns[0].GetInput()[1])
		if axes == nil || len(ns[0].GetAttribute()) != 0 {
			t.Fatalf("Unsqueeze = %v, want axes as an input (opset 13)", ns[0])
		}
		if d, _ := onnx.Decode(axes); !slices.Equal(d.Data.([]int64), []int64{1, 2}) {
			t.Errorf("Unsqueeze axes = %v, want [1 2]", d.Data)
		}
	})
}
