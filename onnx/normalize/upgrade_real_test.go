package normalize

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// upgSuiteInputs reads test_data_set_0's inputs of a backend-suite model,
// in the order of the model's inputs; ok is false when one is not a
// plain tensor (sequences, optionals).
func upgSuiteInputs(dir string, m *onnx.Model) (map[string]*onnx.Tensor, bool) {
	ins := m.Inputs()
	feeds := map[string]*onnx.Tensor{}
	for i, v := range ins {
		if v.Kind != "tensor" {
			return nil, false
		}
		b, err := os.ReadFile(filepath.Join(dir, "test_data_set_0", fmt.Sprintf("input_%d.pb", i)))
		if err != nil {
			return nil, false
		}
		p := &onnxpb.TensorProto{}
		if proto.Unmarshal(b, p) != nil {
			return nil, false
		}
		t, err := onnx.Decode(p)
		if err != nil {
			return nil, false
		}
		t.Name = v.Name
		feeds[v.Name] = t
	}
	return feeds, true
}

// upgSuiteOutputs reads test_data_set_0's expected outputs, named after
// the model's outputs.
func upgSuiteOutputs(dir string, m *onnx.Model) (map[string]*onnx.Tensor, bool) {
	out := map[string]*onnx.Tensor{}
	for i, v := range m.Outputs() {
		b, err := os.ReadFile(filepath.Join(dir, "test_data_set_0", fmt.Sprintf("output_%d.pb", i)))
		if err != nil || v.Kind != "tensor" {
			return nil, false
		}
		p := &onnxpb.TensorProto{}
		if proto.Unmarshal(b, p) != nil {
			return nil, false
		}
		t, err := onnx.Decode(p)
		if err != nil {
			return nil, false
		}
		t.Name = v.Name
		out[v.Name] = t
	}
	return out, true
}

// TestBackendSuiteUpgrade upgrades every backend-suite model below opset
// 13 that ONNX Runtime runs as given to opset 13 (and every one below 17
// to 17): the upgraded model must run and match, or be refused with an
// error naming the node's operator.
func TestBackendSuiteUpgrade(t *testing.T) {
	root := testutil.BackendSuite(t)
	ortest.Init(t)
	for _, to := range []int64{13, 17} {
		t.Run(fmt.Sprint(to), func(t *testing.T) { upgSuite(t, root, to) })
	}
}

func upgSuite(t *testing.T, root string, to int64) {
	var paths []string
	for _, d := range []string{"node", "pytorch-converted", "pytorch-operator", "simple"} {
		p, _ := filepath.Glob(filepath.Join(root, d, "*", "model.onnx"))
		paths = append(paths, p...)
	}
	var below, matched int
	var notRun, matchedExpected []string
	refused := map[string][]string{}
	for _, p := range paths {
		name := filepath.Base(filepath.Dir(p))
		m, err := onnx.Load(p)
		if err != nil || m.Opset() == 0 || m.Opset() >= to {
			continue
		}
		below++
		feeds, ok := upgSuiteInputs(filepath.Dir(p), m)
		if !ok {
			notRun = append(notRun, name+" (input not a tensor)")
			continue
		}
		want, err := upgRun(t, m, feeds)
		asGiven := err == nil
		if !asGiven {
			// ONNX Runtime has no kernel for some opset-6 operators
			// (Add with broadcast, AveragePool, BatchNormalization,
			// PRelu): the upgraded model is held to the suite's
			// expected outputs instead, at the suite's own tolerance.
			if want, ok = upgSuiteOutputs(filepath.Dir(p), m); !ok {
				notRun = append(notRun, name+" (outputs not tensors)")
				continue
			}
		}
		up, _, err := Upgrade(m, to)
		var ne *upgNodeError
		if errors.As(err, &ne) {
			refused[ne.Op] = append(refused[ne.Op], name)
			t.Logf("%s refused: %v", name, err)
			continue
		}
		if err != nil {
			t.Errorf("%s: Upgrade = %v, want an upgrade or a refusal naming the node", name, err)
			continue
		}
		got, err := upgRun(t, up, feeds)
		switch {
		case err != nil && !asGiven:
			notRun = append(notRun, name)
		case err != nil:
			t.Errorf("%s (opset %d): upgraded model does not run: %v", name, m.Opset(), err)
		case asGiven:
			if d := upgDiff(want, got, 1e-5); d != "" {
				t.Errorf("%s (opset %d): upgraded model differs: %s", name, m.Opset(), d)
				continue
			}
			matched++
		default:
			if d := upgDiff(want, got, 1e-3); d != "" {
				t.Errorf("%s (opset %d, not run by ONNX Runtime as given): upgraded model differs from the expected outputs: %s", name, m.Opset(), d)
				continue
			}
			matchedExpected = append(matchedExpected, name)
		}
	}
	var ops []string
	nref := 0
	for op, ms := range refused {
		ops = append(ops, fmt.Sprintf("%s ×%d (%s)", op, len(ms), strings.Join(ms, ", ")))
		nref += len(ms)
	}
	sort.Strings(ops)
	t.Logf("%d models below opset %d: %d upgraded and matching the original, %d refused: %s",
		below, to, matched, nref, strings.Join(ops, "; "))
	t.Logf("%d not run by ONNX Runtime as given, upgraded and matching the suite's expected outputs: %s", len(matchedExpected), strings.Join(matchedExpected, ", "))
	t.Logf("%d run neither as given nor upgraded: %s", len(notRun), strings.Join(notRun, ", "))
	if matched == 0 {
		t.Errorf("no model was upgraded")
	}
}

// TestUpgradePPOCR upgrades the real PP-OCR models (rec and cls at opset
// 9, det at 11) to 13 and holds them to the originals on seeded random
// inputs.
func TestUpgradePPOCR(t *testing.T) {
	for _, c := range []struct {
		file string
		dims []int64
	}{
		{"ch_PP-OCRv4_rec_infer.onnx", []int64{1, 3, 48, 320}},
		{"ch_ppocr_mobile_v2.0_cls_infer.onnx", []int64{1, 3, 48, 192}},
		{"ch_PP-OCRv4_det_infer.onnx", []int64{1, 3, 320, 320}},
	} {
		t.Run(c.file, func(t *testing.T) {
			p := testutil.NPMModel(t, c.file)
			ortest.Init(t)
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			ins := m.Inputs()
			if len(ins) != 1 {
				t.Fatalf("%s has %d inputs, want 1", c.file, len(ins))
			}
			x, err := onnx.Random(ins[0].Name, onnx.Float, c.dims, 7)
			if err != nil {
				t.Fatal(err)
			}
			feeds := map[string]*onnx.Tensor{x.Name: x}
			want, err := upgRun(t, m, feeds)
			if err != nil {
				t.Fatalf("original: %v", err)
			}
			up, p13, err := Upgrade(m, 13)
			if err != nil {
				t.Fatalf("Upgrade(%s, 13) = %v", c.file, err)
			}
			t.Logf("%s: %s", c.file, p13.Summary)
			got, err := upgRun(t, up, feeds)
			if err != nil {
				t.Fatalf("upgraded: %v", err)
			}
			if d := upgDiff(want, got, 1e-5); d != "" {
				t.Errorf("%s upgraded to 13: %s", c.file, d)
			}
		})
	}
}

// TestUpgradeCorpus upgrades the shared corpus's real and onnx-light
// models (opsets 8 to 12) to 13 and to 17 and holds them to the originals
// on seeded random inputs.
func TestUpgradeCorpus(t *testing.T) {
	var paths []string
	for _, d := range []string{"real", "onnx-light"} {
		p, _ := filepath.Glob(filepath.Join(testutil.Corpus(t, "models", d), "*.onnx"))
		paths = append(paths, p...)
	}
	ortest.Init(t)
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			feeds := map[string]*onnx.Tensor{}
			for i, v := range m.Inputs() {
				dims := v.Shape.Static()
				for j := range dims {
					dims[j] = max(dims[j], 1)
				}
				x, err := onnx.Random(v.Name, v.Type, dims, uint64(i+1))
				if err != nil {
					t.Fatal(err)
				}
				feeds[v.Name] = x
			}
			want, err := upgRun(t, m, feeds)
			if err != nil {
				t.Fatalf("original: %v", err)
			}
			for _, to := range []int64{13, 17} {
				up, pass, err := Upgrade(m, to)
				if err != nil {
					t.Fatalf("Upgrade(%d) = %v", to, err)
				}
				t.Logf("opset %d: %s", m.Opset(), pass.Summary)
				got, err := upgRun(t, up, feeds)
				if err != nil {
					t.Fatalf("upgraded to %d: %v", to, err)
				}
				if d := upgDiff(want, got, 1e-5); d != "" {
					t.Errorf("upgraded to %d: %s", to, d)
				}
			}
		})
	}
}
