package normalize

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
)

// TestBackendSuiteUnchanged normalizes every model of ONNX's backend test
// suite that ONNX Runtime runs as given and checks that its outputs on
// test_data_set_0 stay the same.
func TestBackendSuiteUnchanged(t *testing.T) {
	root := testutil.BackendSuite(t)
	ortest.Init(t)
	paths, err := filepath.Glob(filepath.Join(root, "*", "*", "model.onnx"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no backend-suite models under %s: %v", root, err)
	}
	var runnable, unchanged, refused, notTensors, ortRefuses, checkAgrees, random, changedModels int
	var differ []string
	passTotals := map[string]int{}
	for _, p := range paths {
		name := filepath.Base(filepath.Dir(p))
		m, err := onnx.Load(p)
		if err != nil {
			t.Errorf("onnx.Load(%s) = %v", p, err)
			continue
		}
		in, err := coreBackendInputs(filepath.Dir(p), m)
		if err != nil {
			notTensors++
			continue
		}
		want, err := coreRun(m, in)
		if err != nil {
			ortRefuses++
			if Check(m) != nil {
				checkAgrees++
			}
			continue
		}
		runnable++
		out, rep, err := Normalize(context.Background(), m, Options{})
		var ce *CheckError
		if errors.As(err, &ce) {
			refused++
			t.Errorf("Normalize(%s) refused a model ONNX Runtime runs: %v", name, err)
			continue
		}
		if err != nil {
			differ = append(differ, name+": "+err.Error())
			continue
		}
		if len(rep.Passes) > 0 {
			changedModels++
		}
		for _, ps := range rep.Passes {
			passTotals[ps.Name] += ps.Changed
		}
		got, err := coreRun(out, in)
		if err == nil {
			_, err = coreDiff(want, got)
		}
		if err != nil {
			if again, err2 := coreRun(m, in); err2 == nil {
				if _, d := coreDiff(want, again); d != nil {
					random++ // the model itself gives other outputs each run
					continue
				}
			}
			differ = append(differ, name+" ("+rep.String()+"): "+err.Error())
			continue
		}
		unchanged++
	}
	sort.Strings(differ)
	t.Logf("backend suite: %d models, %d run in ONNX Runtime (%d feed sequences or optionals, %d ONNX Runtime refuses or fails, %d of those refused by Check too), %d unchanged after Normalize (%d of them rewritten), %d nondeterministic, %d refused by Check, %d differ",
		len(paths), runnable, notTensors, ortRefuses, checkAgrees, unchanged, changedModels, random, refused, len(differ))
	t.Logf("changes by pass over the runnable models: %v", passTotals)
	if len(differ) > 0 {
		t.Errorf("Normalize changed the outputs of %d models:\n%s", len(differ), strings.Join(differ, "\n"))
	}
}

// coreFoldGraph is a model of nodes over input x (float32 [2,3]) and the
// given initializers, with output y (float32).
func coreFoldGraph(nodes []*onnxpb.NodeProto, inits ...*onnxpb.TensorProto) *onnx.Model {
	ir, opset := int64(8), int64(13)
	g := &onnxpb.GraphProto{
		Name:        strRef("fold"),
		Input:       []*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, fixedShape([]int64{2, 3}))},
		Output:      []*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, onnx.Shape{})},
		Node:        nodes,
		Initializer: inits,
	}
	return &onnx.Model{Proto: &onnxpb.ModelProto{IrVersion: &ir, OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: &opset}}, Graph: g}}
}

// coreInit encodes an initializer.
func coreInit(t *testing.T, name string, dims []int64, data any) *onnxpb.TensorProto {
	t.Helper()
	x, err := onnx.NewTensor(name, dims, data)
	if err != nil {
		t.Fatal(err)
	}
	p, err := onnx.Encode(x, onnx.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// coreFoldCase is a model for TestFold and what folding leaves of it.
type coreFoldCase struct {
	name  string
	model func(t *testing.T) *onnx.Model
	left  []string // op types of the nodes that stay, in order
	runs  bool     // compare outputs in ONNX Runtime
}

func coreFoldCases() []coreFoldCase {
	w := func(t *testing.T) *onnxpb.TensorProto {
		return coreInit(t, "w", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 6})
	}
	return []coreFoldCase{
		{"transposed weight", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Transpose", "t", []string{"w"}, []string{"wt"}),
				coreNode("Add", "add", []string{"x", "wt"}, []string{"y"}),
			}, w(t))
		}, []string{"Add"}, true},
		{"computed weight chain", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Cast", "cast", []string{"i"}, []string{"f"}, testmodels.Int("to", int64(onnx.Float))),
				coreNode("Mul", "mul", []string{"f", "half"}, []string{"m"}),
				coreNode("Reshape", "reshape", []string{"m", "shape"}, []string{"r"}),
				coreNode("Mul", "scale", []string{"x", "r"}, []string{"y"}),
			}, coreInit(t, "i", []int64{6}, []int64{1, 2, 3, 4, 5, 6}), coreInit(t, "half", nil, []float32{0.5}), coreInit(t, "shape", []int64{2}, []int64{2, 3}))
		}, []string{"Mul"}, true},
		{"Shape of a fixed-shape input", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Shape", "shape", []string{"x"}, []string{"s"}),
				coreNode("Reshape", "flat", []string{"x", "minus"}, []string{"f"}),
				coreNode("Reshape", "back", []string{"f", "s"}, []string{"y"}),
			}, coreInit(t, "minus", []int64{1}, []int64{-1}))
		}, []string{"Reshape", "Reshape"}, true},
		{"float16 weight", func(t *testing.T) *onnx.Model {
			h := coreInit(t, "h", []int64{3, 2}, []float16.Float16{float16.Fromfloat32(1), float16.Fromfloat32(2), float16.Fromfloat32(3), float16.Fromfloat32(4), float16.Fromfloat32(5), float16.Fromfloat32(6)})
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Transpose", "t", []string{"h"}, []string{"ht"}),
				coreNode("Cast", "up", []string{"ht"}, []string{"wt"}, testmodels.Int("to", int64(onnx.Float))),
				coreNode("Add", "add", []string{"x", "wt"}, []string{"y"}),
			}, h)
		}, []string{"Add"}, true},
		{"random stays", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("RandomUniform", "rnd", nil, []string{"r"}, testmodels.Ints("shape", 2, 3), testmodels.Float("seed", 1)),
				coreNode("Add", "add", []string{"x", "r"}, []string{"y"}),
			})
		}, []string{"RandomUniform", "Add"}, false},
		{"other domain stays", func(t *testing.T) *onnx.Model {
			n := coreNode("Foo", "foo", []string{"w"}, []string{"f"})
			n.Domain = strRef("com.example")
			return coreFoldGraph([]*onnxpb.NodeProto{n, coreNode("Add", "add", []string{"x", "f"}, []string{"y"})}, w(t))
		}, []string{"Foo", "Add"}, false},
		{"large ConstantOfShape stays", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("ConstantOfShape", "big", []string{"dims"}, []string{"z"}),
				coreNode("ReduceSum", "sum", []string{"z"}, []string{"s"}),
				coreNode("Add", "add", []string{"x", "s"}, []string{"y"}),
			}, coreInit(t, "dims", []int64{2}, []int64{1024, 1024}))
		}, []string{"ConstantOfShape", "ReduceSum", "Add"}, true},
		{"small ConstantOfShape folds", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("ConstantOfShape", "small", []string{"dims"}, []string{"z"}),
				coreNode("Add", "add", []string{"x", "z"}, []string{"y"}),
			}, coreInit(t, "dims", []int64{2}, []int64{2, 3}))
		}, []string{"Add"}, true},
		{"node writing a graph output stays", func(t *testing.T) *onnx.Model {
			m := coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Transpose", "t", []string{"w"}, []string{"wt"}),
				coreNode("Add", "add", []string{"x", "wt"}, []string{"y"}),
			}, w(t))
			m.Graph().Output = append(m.Graph().Output, onnx.TensorType("wt", onnx.Float, onnx.Shape{}))
			return m
		}, []string{"Transpose", "Add"}, true},
		{"overridable initializer stays", func(t *testing.T) *onnx.Model {
			m := coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Transpose", "t", []string{"w"}, []string{"wt"}),
				coreNode("Add", "add", []string{"x", "wt"}, []string{"y"}),
			}, w(t))
			m.Graph().Input = append(m.Graph().Input, onnx.TensorType("w", onnx.Float, fixedShape([]int64{3, 2})))
			return m
		}, []string{"Transpose", "Add"}, false},
		{"dead constant nodes go", func(t *testing.T) *onnx.Model {
			return coreFoldGraph([]*onnxpb.NodeProto{
				coreNode("Transpose", "unused", []string{"w"}, []string{"wt"}),
				coreNode("Relu", "relu", []string{"x"}, []string{"y"}),
			}, w(t))
		}, []string{"Relu"}, true},
	}
}

func TestFold(t *testing.T) {
	ortest.Init(t)
	for _, tc := range coreFoldCases() {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.model(t)
			out, _, err := Normalize(context.Background(), m, Options{NoFoldBatchNorm: true})
			if err != nil {
				t.Fatalf("Normalize() = %v", err)
			}
			var left []string
			for _, n := range out.Graph().GetNode() {
				left = append(left, n.GetOpType())
			}
			if !reflect.DeepEqual(left, tc.left) {
				t.Errorf("Normalize() left nodes %v, want %v", left, tc.left)
			}
			if err := Check(out); err != nil {
				t.Errorf("Check(normalized) = %v", err)
			}
			if tc.runs {
				in := map[string]*onnx.Tensor{"x": coreRandom(t, "x", 2, 3)}
				if d, err := coreDiff(coreMustRun(t, m, in), coreMustRun(t, out, in)); err != nil || d != 0 {
					t.Errorf("outputs after Normalize: max difference %g, %v; want identical", d, err)
				}
			}
		})
	}
}

// TestFoldRemovesUnusedInitializers drops an initializer nothing reads.
func TestFoldRemovesUnusedInitializers(t *testing.T) {
	m := coreFoldGraph([]*onnxpb.NodeProto{coreNode("Relu", "relu", []string{"x"}, []string{"y"})}, coreInit(t, "w", []int64{1}, []float32{1}))
	out, rep, err := Normalize(context.Background(), m, Options{NoFoldBatchNorm: true})
	if err != nil || out.Initializer("w") != nil {
		t.Fatalf("Normalize() = %v, kept w: %v", err, out.Initializer("w") != nil)
	}
	if !strings.Contains(rep.String(), "removed 1 unused initializer") {
		t.Errorf("Normalize() report = %q, want the removed initializer", rep)
	}
}

// TestNormalizeCorpusReal normalizes the corpus's real trained models with
// zero Options and checks their outputs on seeded random input.
func TestNormalizeCorpusReal(t *testing.T) {
	ortest.Init(t)
	paths, _ := filepath.Glob(filepath.Join(testutil.Corpus(t, "models", "real"), "*.onnx"))
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			out, rep, err := Normalize(context.Background(), m, Options{NoFoldBatchNorm: true})
			if err != nil {
				t.Fatalf("Normalize(%s) = %v", p, err)
			}
			in := map[string]*onnx.Tensor{}
			for i, v := range m.Inputs() {
				dims := v.Shape.Static()
				for j := range dims {
					dims[j] = max(dims[j], 1)
				}
				x, err := onnx.Random(v.Name, v.Type, dims, uint64(i))
				if err != nil {
					t.Fatal(err)
				}
				in[v.Name] = x
			}
			d, err := coreDiff(coreMustRun(t, m, in), coreMustRun(t, out, in))
			if err != nil {
				t.Errorf("outputs of normalized %s: %v", p, err)
			}
			t.Logf("%s: %d nodes -> %d [%s]; max difference %g", filepath.Base(p), len(m.Graph().GetNode()), len(out.Graph().GetNode()), rep, d)
		})
	}
}
