package ort_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// unrunnable lists the conformance tests ONNX Runtime itself cannot run,
// with the text its error must contain. A listed test that starts passing
// fails, so the table stays true.
//
// The three pytorch-converted models declare opset 6 (IR 3); ONNX Runtime
// registers AveragePool, BatchNormalization and Gemm kernels only from
// opset 7 on, so session creation fails for them.
var unrunnable = map[string]string{
	"pytorch-converted/test_AvgPool2d":        "Could not find an implementation for AveragePool(1) node",
	"pytorch-converted/test_BatchNorm2d_eval": "Could not find an implementation for BatchNormalization(6) node",
	"pytorch-converted/test_Linear":           "Could not find an implementation for Gemm(6) node",
}

// nodeTest is one ONNX backend test directory.
type nodeTest struct {
	name string // path relative to onnx-node
	dir  string
}

func nodeTests(t testing.TB) []nodeTest {
	t.Helper()
	root := testutil.Corpus(t, "onnx-node")
	var tests []nodeTest
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if ort.IsFile(filepath.Join(p, "model.onnx")) && ort.IsDir(filepath.Join(p, "test_data_set_0")) {
			rel, _ := filepath.Rel(root, p)
			tests = append(tests, nodeTest{name: filepath.ToSlash(rel), dir: p})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(tests, func(i, j int) bool { return tests[i].name < tests[j].name })
	return tests
}

// testData reads input_i.pb / output_i.pb, keyed by the i-th non-initializer
// graph input and the i-th graph output.
func testData(t testing.TB, m *onnx.Model, dir string) (in, out map[string]*onnx.Tensor) {
	t.Helper()
	in, out = map[string]*onnx.Tensor{}, map[string]*onnx.Tensor{}
	for i, v := range m.Inputs() {
		p := filepath.Join(dir, "test_data_set_0", "input_"+strconv.Itoa(i)+".pb")
		if !ort.IsFile(p) {
			t.Fatalf("%s missing for input %q", p, v.Name)
		}
		in[v.Name] = ortest.ReadTensor(t, p)
	}
	for i, v := range m.Outputs() {
		p := filepath.Join(dir, "test_data_set_0", "output_"+strconv.Itoa(i)+".pb")
		if !ort.IsFile(p) {
			t.Fatalf("%s missing for output %q", p, v.Name)
		}
		out[v.Name] = ortest.ReadTensor(t, p)
	}
	return in, out
}

// TestConformance runs the ONNX backend node tests of the corpus through
// ONNX Runtime and compares with ONNX's defaults, rtol 1e-3 and atol 1e-7.
func TestConformance(t *testing.T) {
	ortest.Init(t)
	tests := nodeTests(t)
	if len(tests) == 0 {
		t.Fatal("no tests found under onnx-node")
	}
	seen := map[string]bool{}
	passed, failed := 0, 0
	for _, tc := range tests {
		seen[tc.name] = true
		ok := t.Run(tc.name, func(t *testing.T) {
			m, err := onnx.Load(filepath.Join(tc.dir, "model.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			in, want := testData(t, m, tc.dir)
			data, err := m.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			runs, err := runThrice(data, in)
			if msg, listed := unrunnable[tc.name]; listed {
				if err == nil || !strings.Contains(err.Error(), msg) {
					t.Fatalf("listed as unrunnable (%q) but Run = %v", msg, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, got := range runs {
				t.Run(runNames[i], func(t *testing.T) { compareAll(t, got, want, 1e-3, 1e-7) })
			}
		})
		switch _, listed := unrunnable[tc.name]; {
		case !ok:
			failed++
		case !listed:
			passed++
		}
	}
	for name := range unrunnable {
		if !seen[name] {
			t.Errorf("unrunnable lists %s, which is not in the corpus", name)
		}
	}
	t.Logf("%d of %d conformance tests passed, %d failed, %d listed as unrunnable by ONNX Runtime %s",
		passed, len(tests), failed, len(unrunnable), ort.Version())
}

func runOnce(model []byte, in map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	s, err := ort.NewSessionFromBytes(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Run(context.Background(), in, nil)
}

// runNames says how each of runThrice's runs got its output memory.
var runNames = []string{"allocated", "preallocated", "reused"}

// runThrice runs the model three times in one session: first with ONNX
// Runtime allocating the outputs, then with the outputs pre-allocated from
// the shapes of the first run, then into the memory of the second result.
func runThrice(model []byte, in map[string]*onnx.Tensor) ([]map[string]*onnx.Tensor, error) {
	s, err := ort.NewSessionFromBytes(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var runs []map[string]*onnx.Tensor
	for range 2 {
		got, err := s.Run(context.Background(), in, nil)
		if err != nil {
			return nil, err
		}
		runs = append(runs, got)
	}
	// Reusing a copy keeps the second result intact for comparison.
	old := map[string]*onnx.Tensor{}
	for name, t := range runs[1] {
		c := *t
		c.Data = cloneData(t.Data)
		old[name] = &c
	}
	got, err := s.RunReuse(context.Background(), in, nil, old)
	if err != nil {
		return nil, err
	}
	return append(runs, got), nil
}

func compareAll(t *testing.T, got, want map[string]*onnx.Tensor, rtol, atol float64) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("output %q missing", name)
			continue
		}
		if msg := closeTo(g, w, rtol, atol); msg != "" {
			t.Errorf("output %q: %s", name, msg)
		}
	}
}

// TestLightModels runs the full-topology CNNs of models/onnx-light with the
// upstream runner's input, x = arange(n).reshape(S)/n.
func TestLightModels(t *testing.T) {
	ortest.Init(t)
	dir := testutil.Corpus(t, "models", "onnx-light")
	paths, err := filepath.Glob(filepath.Join(dir, "light_*.onnx"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no light_*.onnx in %s (%v)", dir, err)
	}
	for _, p := range paths {
		name := strings.TrimSuffix(filepath.Base(p), ".onnx")
		t.Run(name, func(t *testing.T) {
			rtol := 1e-3
			if name == "light_densenet121" {
				rtol = 2e-3
			}
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			ins := m.Inputs()
			if len(ins) != 1 || ins[0].Type != onnx.Float {
				t.Fatalf("inputs = %v, want one float32 input", ins)
			}
			x := ortest.ArangeInput(ins[0])
			want := ortest.ReadTensor(t, filepath.Join(dir, name+"_output_0.pb"))
			s, err := ort.NewSession(p, ort.SessionOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, err := s.Run(context.Background(), map[string]*onnx.Tensor{x.Name: x}, nil)
			if err != nil {
				t.Fatal(err)
			}
			g := got[m.Outputs()[0].Name]
			if msg := closeTo(g, want, rtol, 1e-7); msg != "" {
				t.Errorf("output %q (shape %v, want shape %v): %s", g.Name, g.Dims, want.Dims, msg)
			}
		})
	}
}
