package normalize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"google.golang.org/protobuf/proto"
)

// precQDQ is a hand-built explicitly quantized Conv: int8 weights through
// DequantizeLinear, the activation through QuantizeLinear/DequantizeLinear.
func precQDQ(t testing.TB) *onnx.Model {
	t.Helper()
	b := testmodels.NewBuilder("qdq", 3)
	x := b.Input("x", onnx.Float, 1, 3, 8, 8)
	s := b.Init("s", nil, []float32{0.02})
	z := b.Init("z", nil, []int8{0})
	q := b.Node("QuantizeLinear", []string{x, s, z})
	dq := b.Node("DequantizeLinear", []string{q, s, z})
	w := make([]int8, 4*3*3*3)
	for i := range w {
		w[i] = int8(i%17 - 8)
	}
	wq := b.Init("wq", []int64{4, 3, 3, 3}, w)
	ws := b.Init("ws", nil, []float32{0.01})
	wd := b.Node("DequantizeLinear", []string{wq, ws, z})
	b.Node("Conv", []string{dq, wd})
	b.Rename("y")
	b.Output("y", onnx.Float, 1, 4, 6, 6)
	return precModel(t, b.Model(13, 8))
}

// precUnknownHalf reads a float16 weight with an operator from another
// domain, whose types SourcePrecision cannot infer.
func precUnknownHalf(t testing.TB) *onnx.Model {
	t.Helper()
	b := testmodels.NewBuilder("unknown", 3)
	x := b.Input("x", onnx.Float16, 1, 8)
	w := b.RandNormal("w", 1, 8)
	f := b.Node("FusedThing", []string{x, w})
	b.Node("Cast", []string{f}, testmodels.Int("to", int64(onnx.Float)))
	b.Rename("y")
	b.Output("y", onnx.Float, 1, 8)
	p := b.Model(17, 8)
	p.Graph.Node[0].Domain = proto.String("com.example")
	p.Graph.Initializer[0] = precToHalf(t, p.Graph.Initializer[0], "w", false)
	return precModel(t, p)
}

func TestSourcePrecision(t *testing.T) {
	tiny := precModel(t, testmodels.TinyNet(1))
	tests := []struct {
		name   string
		model  func(t testing.TB) *onnx.Model
		want   Precision
		reason string // a part of the reason
	}{
		{"fp32 tinynet", func(testing.TB) *onnx.Model { return tiny }, PrecisionFP32, "are float32"},
		{"fp16 storage behind Casts", func(t testing.TB) *onnx.Model { return precMixedStorage(t, testmodels.TinyNet(1), false) },
			PrecisionMixed, "10 of 10 float weights are float16 and reach compute through Cast to float32"},
		{"bf16 storage behind Casts", func(t testing.TB) *onnx.Model { return precMixedStorage(t, testmodels.TinyNet(1), true) },
			PrecisionMixed, "10 of 10 float weights are bfloat16 and reach compute through Cast to float32"},
		{"fp16 weights read by an unknown op", precUnknownHalf, PrecisionFP16, "1 of 1 float weights are float16, 1 of them read directly"},
		{"fp16 compute between Casts", precMixedCompute, PrecisionMixed, "2 of 5 compute nodes run in float16 between Casts"},
		{"convert/fp16 keeping fp32 I/O", func(t testing.TB) *onnx.Model { return precFP16(t, tiny, true) }, PrecisionFP16, "compute nodes run in float16"},
		{"convert/fp16 with fp16 I/O", func(t testing.TB) *onnx.Model { return precFP16(t, tiny, false) }, PrecisionFP16, "compute nodes run in float16"},
		{"resnetish fp16", func(t testing.TB) *onnx.Model {
			return precFP16(t, precModel(t, testmodels.ResNetish(16, 1)), true)
		}, PrecisionFP16, "float weights are float16"},
		{"hand-built Q/DQ", precQDQ, PrecisionINT8, "1 QuantizeLinear; 1 8-bit weights feed DequantizeLinear"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := SourcePrecision(tc.model(t))
			if got != tc.want || !strings.Contains(reason, tc.reason) {
				t.Errorf("SourcePrecision() = %s, %q; want %s, reason containing %q", got, reason, tc.want, tc.reason)
			}
		})
	}
}

// TestSourcePrecisionRealModels runs on the real models that are present
// and logs what each is; all of them are published as float32.
func TestSourcePrecisionRealModels(t *testing.T) {
	var paths []string
	real, _ := filepath.Glob(filepath.Join(testutil.CorpusPath(t, "models", "real"), "*.onnx"))
	paths = append(paths, real...)
	npm, _ := filepath.Glob(filepath.Join(testutil.RepoRoot(t), ".cache", "npm-models", "*.onnx"))
	paths = append(paths, npm...)
	if len(paths) == 0 {
		t.Skip("no real models: the shared corpus and .cache/npm-models (make models) are absent")
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			got, reason := SourcePrecision(m)
			t.Logf("%s: %s (%s)", filepath.Base(p), got, reason)
			if got != PrecisionFP32 {
				t.Errorf("SourcePrecision(%s) = %s, %q; want fp32", p, got, reason)
			}
			h := precFP16(t, m, true)
			if got, reason := SourcePrecision(h); got != PrecisionFP16 {
				t.Errorf("SourcePrecision(fp16 of %s) = %s, %q; want fp16", p, got, reason)
			}
		})
	}
	demo := filepath.Join(testutil.RepoRoot(t), ".cache", "demo", "calib", "model.int8.onnx")
	if _, err := os.Stat(demo); err == nil {
		m, err := onnx.Load(demo)
		if err != nil {
			t.Fatal(err)
		}
		got, reason := SourcePrecision(m)
		t.Logf("model.int8.onnx: %s (%s)", got, reason)
		if got != PrecisionINT8 {
			t.Errorf("SourcePrecision(%s) = %s, %q; want int8", demo, got, reason)
		}
	}
}
