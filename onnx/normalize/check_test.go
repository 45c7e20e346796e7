package normalize

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// coreSuiteDir is where Debian installs the backend suite; TestCheckCorpus
// adds it when present (testutil.BackendSuite would skip the whole test).
const coreSuiteDir = "/usr/share/libonnx-testdata/data"

// coreCheckModel is a valid model: x -> Add(x, w) -> Relu -> y.
func coreCheckModel() *onnx.Model {
	b := testmodels.NewBuilder("check", 1)
	x := b.Input("x", onnx.Float, 1, 4)
	w := b.Init("w", []int64{1, 4}, []float32{1, 2, 3, 4})
	s := b.Node("Add", []string{x, w})
	b.Node("Relu", []string{s})
	b.Rename("y")
	b.Output("y", onnx.Float, 1, 4)
	return coreModel(b, 13)
}

// coreIfBody is a then/else branch that returns outer value v.
func coreIfBody(name, v string) *onnxpb.AttributeProto {
	g := &onnxpb.GraphProto{Name: strRef(name), Node: []*onnxpb.NodeProto{coreNode("Identity", name+"_id", []string{v}, []string{name + "_out"})}}
	g.Output = []*onnxpb.ValueInfoProto{onnx.TensorType(name+"_out", onnx.Float, onnx.Shape{})}
	return &onnxpb.AttributeProto{Name: strRef(name), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: g}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(m *onnx.Model)
		reason string // "" for a valid model
	}{
		{"valid", func(*onnx.Model) {}, ""},
		{"no opset_import", func(m *onnx.Model) { m.Proto.OpsetImport = nil }, "no opset_import"},
		{"no graph", func(m *onnx.Model) { m.Proto.Graph = nil }, "no graph"},
		{"input twice", func(m *onnx.Model) { g := m.Graph(); g.Input = append(g.Input, g.Input[0]) }, `graph input "x" is listed twice`},
		{"initializer twice", func(m *onnx.Model) { g := m.Graph(); g.Initializer = append(g.Initializer, g.Initializer[0]) }, `initializer "w" is defined twice`},
		{"output written twice", func(m *onnx.Model) {
			g := m.Graph()
			g.Node = append(g.Node, coreNode("Neg", "again", []string{"x"}, []string{"y"}))
		}, `node "again" (Neg) writes "y", which node`},
		{"node writes an input", func(m *onnx.Model) { m.Graph().Node[1].Output[0] = "x" }, `writes "x", which a graph input already defines`},
		{"undefined input", func(m *onnx.Model) { m.Graph().Node[0].Input[1] = "nowhere" }, `(Add) reads "nowhere", which nothing defines`},
		{"cycle", func(m *onnx.Model) {
			g := m.Graph()
			g.Node[0].Input[0] = "y" // Add reads Relu's output, Relu reads Add's
		}, "cycle"},
		{"output nothing produces", func(m *onnx.Model) { m.Graph().Output[0].Name = strRef("z") }, `graph output "z" is produced by no node`},
		{"initializer type differs from input", func(m *onnx.Model) {
			g := m.Graph()
			g.Input = append(g.Input, onnx.TensorType("w", onnx.Int64, onnx.Shape{}))
		}, `initializer "w" is float32 but the graph input of that name is int64`},
		{"value_info type differs from initializer", func(m *onnx.Model) {
			g := m.Graph()
			g.ValueInfo = append(g.ValueInfo, onnx.TensorType("w", onnx.Float16, onnx.Shape{}))
		}, `initializer "w" is float32 but its value_info says float16`},
		{"subgraph reads outer values", func(m *onnx.Model) {
			g := m.Graph()
			g.Initializer = append(g.Initializer, &onnxpb.TensorProto{Name: strRef("c"), DataType: ptrInt32(int32(onnx.Bool)), Int32Data: []int32{1}})
			g.Node = append(g.Node, coreNode("If", "if", []string{"c"}, []string{"branch"}, coreIfBody("then_branch", "x"), coreIfBody("else_branch", "w")))
		}, ""},
		{"subgraph returns an outer value", func(m *onnx.Model) {
			g := m.Graph()
			g.Initializer = append(g.Initializer, &onnxpb.TensorProto{Name: strRef("c"), DataType: ptrInt32(int32(onnx.Bool)), Int32Data: []int32{1}})
			passThrough := coreIfBody("else_branch", "w")
			passThrough.G.Node = nil
			passThrough.G.Output[0].Name = strRef("w")
			g.Node = append(g.Node, coreNode("If", "if", []string{"c"}, []string{"branch"}, coreIfBody("then_branch", "x"), passThrough))
		}, `subgraph "else_branch" returns "w" of an enclosing graph directly`},
		{"subgraph reads an undefined value", func(m *onnx.Model) {
			g := m.Graph()
			g.Initializer = append(g.Initializer, &onnxpb.TensorProto{Name: strRef("c"), DataType: ptrInt32(int32(onnx.Bool)), Int32Data: []int32{1}})
			g.Node = append(g.Node, coreNode("If", "if", []string{"c"}, []string{"branch"}, coreIfBody("then_branch", "x"), coreIfBody("else_branch", "ghost")))
		}, `node "else_branch_id" (Identity) reads "ghost", which nothing defines`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := coreCheckModel()
			tc.edit(m)
			err := Check(m)
			if tc.reason == "" {
				if err != nil {
					t.Errorf("Check() = %v, want nil", err)
				}
				return
			}
			var ce *CheckError
			if !errors.As(err, &ce) || !strings.Contains(ce.Reason, tc.reason) {
				t.Errorf("Check() = %v, want a *CheckError with %q", err, tc.reason)
			}
		})
	}
}

// TestCheckCorpus checks that every real model passes: the corpus's CNN
// graphs and real trained models, its operator tests, the npm models and
// the whole backend suite.
func TestCheckCorpus(t *testing.T) {
	var paths []string
	for _, pattern := range []string{"models/*/*.onnx", "models/*/*/*/*.onnx", "onnx-node/*/model.onnx", "onnx-node/*/*/model.onnx"} {
		p, _ := filepath.Glob(testutil.CorpusPath(t, pattern))
		paths = append(paths, p...)
	}
	npm, _ := filepath.Glob(filepath.Join(testutil.RepoRoot(t), ".cache", "npm-models", "*.onnx"))
	paths = append(paths, npm...)
	if _, err := os.Stat(coreSuiteDir); err == nil {
		suite, _ := filepath.Glob(filepath.Join(testutil.BackendSuite(t), "*", "*", "model.onnx"))
		paths = append(paths, suite...)
	}
	if len(paths) == 0 {
		t.Skip("no corpus, npm models or backend suite here")
	}
	for _, p := range paths {
		m, err := onnx.Load(p)
		if err != nil {
			t.Errorf("onnx.Load(%s) = %v", p, err)
			continue
		}
		if err := Check(m); err != nil {
			t.Errorf("Check(%s) = %v, want nil", p, err)
		}
	}
	t.Logf("Check passed %d real models", len(paths))
}

// TestCheckTruncated cuts the last 6 bytes off a real model, which hold
// its only opset_import entry (field 8, written after the graph): the
// model still parses, and Check refuses it with the reason.
func TestCheckTruncated(t *testing.T) {
	path := testutil.Corpus(t, "models", "real", "blazeface_front_128.onnx")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := onnx.Parse(data, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(whole); err != nil {
		t.Fatalf("Check(%s) = %v, want nil", path, err)
	}
	cut, err := onnx.Parse(data[:len(data)-6], "")
	if err != nil {
		t.Fatalf("onnx.Parse(%s less 6 bytes) = %v, want a model without opset_import", path, err)
	}
	cut.Path = path
	var ce *CheckError
	if err := Check(cut); !errors.As(err, &ce) || !strings.Contains(ce.Reason, "no opset_import") {
		t.Fatalf("Check(%s less 6 bytes) = %v, want the missing opset_import", path, err)
	}
	if !strings.Contains(ce.Error(), path) {
		t.Errorf("CheckError.Error() = %q, want it to name %s", ce.Error(), path)
	}
}
