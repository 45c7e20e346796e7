package normalize

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"google.golang.org/protobuf/proto"
)

// coreTol is how far a normalized model's float outputs may be from the
// original's: absolute or relative 1e-6.
const coreTol = 1e-6

// coreRun runs m on inputs in ONNX Runtime and returns every output. The
// model goes through a file: ONNX Runtime 1.24 refuses some models from
// bytes that it loads from a file (Silero VAD's large Constant nodes in
// If branches).
func coreRun(m *onnx.Model, inputs map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	dir, err := os.MkdirTemp("", "normalize-core")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "model.onnx")
	if err := m.Save(path); err != nil {
		return nil, err
	}
	s, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: 1, InterOpThreads: 1})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Run(context.Background(), inputs, nil)
}

// coreMustRun is coreRun for models that must run.
func coreMustRun(t testing.TB, m *onnx.Model, inputs map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	out, err := coreRun(m, inputs)
	if err != nil {
		t.Fatalf("running %s: %v", m.Path, err)
	}
	return out
}

// coreDiff compares two runs' outputs and returns the largest float
// difference, or an error naming the first output that differs beyond
// coreTol (or in type, shape or a non-float value).
func coreDiff(want, got map[string]*onnx.Tensor) (float64, error) {
	worst := 0.0
	if len(want) != len(got) {
		return 0, fmt.Errorf("%d outputs, want %d", len(got), len(want))
	}
	for name, w := range want {
		g := got[name]
		if g == nil {
			return 0, fmt.Errorf("output %s missing", name)
		}
		if g.Type != w.Type || !reflect.DeepEqual(coreDims(g.Dims), coreDims(w.Dims)) {
			return 0, fmt.Errorf("output %s is %s%v, want %s%v", name, g.Type, g.Dims, w.Type, w.Dims)
		}
		if w.Type != onnx.Float && w.Type != onnx.Double && w.Type != onnx.Float16 && w.Type != onnx.BFloat16 {
			if !reflect.DeepEqual(g.Data, w.Data) {
				return 0, fmt.Errorf("output %s differs", name)
			}
			continue
		}
		wf, err1 := w.Float64s()
		gf, err2 := g.Float64s()
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("output %s: %v %v", name, err1, err2)
		}
		for i := range wf {
			a, b := wf[i], gf[i]
			if math.IsNaN(a) && math.IsNaN(b) || a == b {
				continue
			}
			d := math.Abs(a - b)
			worst = max(worst, d)
			if !(d <= coreTol || d <= coreTol*math.Abs(a)) {
				return worst, fmt.Errorf("output %s[%d] = %g, want %g", name, i, b, a)
			}
		}
	}
	return worst, nil
}

func coreDims(d []int64) []int64 {
	if len(d) == 0 {
		return nil
	}
	return d
}

// coreReadTensor reads a serialized TensorProto, with an error rather than
// a failed test (some backend tests feed sequences, which are not tensors).
func coreReadTensor(path string) (*onnx.Tensor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := &onnxpb.TensorProto{}
	if err := proto.Unmarshal(b, p); err != nil {
		return nil, err
	}
	if len(p.ProtoReflect().GetUnknown()) > 0 {
		return nil, fmt.Errorf("%s is not a TensorProto", path)
	}
	return onnx.Decode(p)
}

// coreBackendInputs reads test_data_set_0's inputs of a backend test,
// bound to the model's inputs in order.
func coreBackendInputs(dir string, m *onnx.Model) (map[string]*onnx.Tensor, error) {
	ins := m.Inputs()
	out := map[string]*onnx.Tensor{}
	for i, in := range ins {
		if in.Kind != "tensor" {
			return nil, fmt.Errorf("input %s is a %s", in.Name, in.Kind)
		}
		t, err := coreReadTensor(filepath.Join(dir, "test_data_set_0", fmt.Sprintf("input_%d.pb", i)))
		if err != nil {
			return nil, err
		}
		t.Name = in.Name
		out[in.Name] = t
	}
	return out, nil
}

// coreModel wraps a builder's graph into a model of the given opset.
func coreModel(b *testmodels.Builder, opset int64) *onnx.Model {
	return &onnx.Model{Proto: b.Model(opset, 8)}
}

// coreNode builds a node.
func coreNode(op, name string, in, out []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: &op, Name: &name, Input: in, Output: out, Attribute: attrs}
}

// coreOpCount counts the main graph's nodes of op.
func coreOpCount(m *onnx.Model, op string) int {
	n := 0
	for _, nd := range m.Graph().GetNode() {
		if nd.GetOpType() == op {
			n++
		}
	}
	return n
}

// coreRandom is a seeded random float32 tensor.
func coreRandom(t testing.TB, name string, dims ...int64) *onnx.Tensor {
	t.Helper()
	x, err := onnx.Random(name, onnx.Float, dims, 42)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
