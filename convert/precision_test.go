package convert

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// mixedModel writes tinynet with every float weight stored as float16 and
// Cast to float32 where it is read: mixed precision storage.
func mixedModel(t *testing.T) string {
	t.Helper()
	m := &onnx.Model{Proto: testmodels.TinyNet(1)}
	g := m.Graph()
	var inits []*onnxpb.TensorProto
	var casts []*onnxpb.NodeProto
	for _, init := range g.GetInitializer() {
		tn, err := onnx.Decode(init)
		if err != nil {
			t.Fatal(err)
		}
		f, ok := tn.Data.([]float32)
		if !ok {
			inits = append(inits, init)
			continue
		}
		h := make([]float16.Float16, len(f))
		for i, v := range f {
			h[i] = float16.Fromfloat32(v)
		}
		half, err := onnx.Encode(&onnx.Tensor{Name: init.GetName() + "_fp16", Type: onnx.Float16, Dims: tn.Dims, Data: h}, onnx.Raw)
		if err != nil {
			t.Fatal(err)
		}
		inits = append(inits, half)
		casts = append(casts, &onnxpb.NodeProto{OpType: proto.String("Cast"), Name: proto.String("cast_" + init.GetName()),
			Input: []string{init.GetName() + "_fp16"}, Output: []string{init.GetName()},
			Attribute: []*onnxpb.AttributeProto{testmodels.Int("to", int64(onnx.Float))}})
	}
	g.Initializer = inits
	g.Node = append(casts, g.Node...)
	p := filepath.Join(t.TempDir(), "mixed.onnx")
	if err := m.Save(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// A mixed-precision source gets an fp32 variant that computes in fp32 and an
// fp16 variant that computes in fp16, both checked against it; no label is
// false.
func TestRunMixedPrecisionSource(t *testing.T) {
	src := mixedModel(t)
	m, err := onnx.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	if p, why := normalize.SourcePrecision(m); p != normalize.PrecisionMixed {
		t.Fatalf("SourcePrecision(mixed tinynet) = %s (%s), want mixed", p, why)
	}
	repo := t.TempDir()
	res, err := Run(context.Background(), Config{Source: src, Repo: repo, FP16: fp16.Options{KeepIOTypes: true}, Variants: variants(t, "onnx-fp32", "onnx-fp16")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed()) > 0 {
		t.Fatalf("rows = %+v", res.Rows)
	}
	for _, c := range []struct {
		model string
		want  normalize.Precision
	}{{"mixed_onnx_fp32", normalize.PrecisionFP32}, {"mixed_onnx_fp16", normalize.PrecisionFP16}} {
		v, err := onnx.Load(filepath.Join(repo, c.model, "1", "model.onnx"))
		if err != nil {
			t.Fatal(err)
		}
		if p, why := normalize.SourcePrecision(v); p != c.want {
			t.Errorf("variant %s computes in %s (%s), want %s", c.model, p, why, c.want)
		}
	}
	// The fp32 variant computes what the original computes: its fp16 weights
	// widened exactly.
	in, err := onnx.Random("images", onnx.Float, []int64{2, 3, 32, 32}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := runModel(t, src, in)
	got := runModel(t, filepath.Join(repo, "mixed_onnx_fp32", "1", "model.onnx"), in)
	for i := range want {
		if d := want[i] - got[i]; d > 1e-6 || d < -1e-6 {
			t.Fatalf("fp32 variant output[%d] = %v, the original's %v", i, got[i], want[i])
		}
	}
}

func runModel(t *testing.T, path string, in *onnx.Tensor) []float32 {
	t.Helper()
	s, err := ort.NewSession(path, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.Run(context.Background(), map[string]*onnx.Tensor{"images": in}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out["probs"].Data.([]float32)
}
