package normalize

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// precBN adds a BatchNormalization over c channels reading x, with seeded
// parameters (variances in [0.5, 1.5), some near zero with eps).
func precBN(b *testmodels.Builder, x string, c int64, seed int, attrs ...testmodels.Attr) string {
	scale := make([]float32, c)
	bias := make([]float32, c)
	mean := make([]float32, c)
	variance := make([]float32, c)
	for i := range scale {
		f := float32(i+seed) / float32(c)
		scale[i] = 0.5 + f
		bias[i] = 0.3 - f
		mean[i] = float32(math.Sin(float64(i + seed)))
		variance[i] = 0.5 + float32(math.Cos(float64(i*7+seed))*0.5)
	}
	variance[0] = 1e-4 // a nearly dead channel: s is large
	p := fmt.Sprintf("bn%d_", seed)
	return b.Node("BatchNormalization", []string{x,
		b.Init(p+"scale", []int64{c}, scale), b.Init(p+"bias", []int64{c}, bias),
		b.Init(p+"mean", []int64{c}, mean), b.Init(p+"var", []int64{c}, variance)}, attrs...)
}

// precBNCase is a BatchNormalization folding case.
type precBNCase struct {
	name   string
	build  func(b *testmodels.Builder, x string) string // returns the value to output
	opset  int64
	folded string   // the summary's "into ..." part, "" when nothing folds
	kept   []string // parts of the reasons for the kept ones
}

var precBNCases = []precBNCase{
	{"conv with bias", func(b *testmodels.Builder, x string) string {
		c := b.Node("Conv", []string{x, b.He("w", 27, 8, 3, 3, 3), b.RandNormal("b", 0.1, 8)}, testmodels.Ints("pads", 1, 1, 1, 1))
		return b.Node("Relu", []string{precBN(b, c, 8, 1)})
	}, 13, "into Conv", nil},
	{"conv without bias, epsilon", func(b *testmodels.Builder, x string) string {
		c := b.Node("Conv", []string{x, b.He("w", 27, 8, 3, 3, 3)})
		return precBN(b, c, 8, 2, testmodels.Float("epsilon", 1e-3))
	}, 9, "into Conv", nil},
	{"depthwise conv", func(b *testmodels.Builder, x string) string {
		c := b.Node("Conv", []string{x, b.He("w", 9, 3, 1, 3, 3)}, testmodels.Int("group", 3))
		return precBN(b, c, 3, 3)
	}, 13, "into Conv", nil},
	{"conv transpose", func(b *testmodels.Builder, x string) string {
		c := b.Node("ConvTranspose", []string{x, b.He("w", 27, 3, 6, 2, 2), b.RandNormal("b", 0.1, 6)}, testmodels.Ints("strides", 2, 2))
		return precBN(b, c, 6, 4)
	}, 11, "into ConvTranspose", nil},
	{"grouped conv transpose", func(b *testmodels.Builder, x string) string {
		c := b.Node("Conv", []string{x, b.He("w0", 27, 4, 3, 3, 3)})
		c = b.Node("ConvTranspose", []string{c, b.He("w", 18, 4, 3, 3, 3)}, testmodels.Int("group", 2), testmodels.Ints("strides", 2, 2))
		return precBN(b, c, 6, 5)
	}, 11, "into ConvTranspose", nil},
	{"gemm transB with C and beta", func(b *testmodels.Builder, x string) string {
		f := b.Node("Flatten", []string{x})
		g := b.Node("Gemm", []string{f, b.He("w", 768, 10, 768), b.RandNormal("c", 0.1, 10)},
			testmodels.Int("transB", 1), testmodels.Float("beta", 0.5), testmodels.Float("alpha", 2))
		return precBN(b, g, 10, 6)
	}, 13, "into Gemm", nil},
	{"gemm without C", func(b *testmodels.Builder, x string) string {
		f := b.Node("Flatten", []string{x})
		return precBN(b, b.Node("Gemm", []string{f, b.He("w", 768, 768, 10)}), 10, 7)
	}, 13, "into Gemm", nil},
	{"conv transpose, bias Add, BN (PaddlePaddle)", func(b *testmodels.Builder, x string) string {
		c := b.Node("ConvTranspose", []string{x, b.He("w", 27, 3, 6, 2, 2)}, testmodels.Ints("strides", 2, 2))
		a := b.Node("Add", []string{c, b.RandNormal("ab", 0.5, 1, 6, 1, 1)})
		return precBN(b, a, 6, 13)
	}, 11, "into ConvTranspose", nil},
	{"gemm, bias Add, BN", func(b *testmodels.Builder, x string) string {
		f := b.Node("Flatten", []string{x})
		g := b.Node("Gemm", []string{f, b.He("w", 768, 768, 10), b.RandNormal("c", 0.1, 1, 10)})
		return precBN(b, b.Node("Add", []string{b.RandNormal("ab", 0.5, 10), g}), 10, 14)
	}, 13, "into Gemm", nil},
	{"kept: Add along the wrong axis", func(b *testmodels.Builder, x string) string {
		c := b.Node("Conv", []string{x, b.He("w", 27, 16, 3, 3, 3)}, testmodels.Ints("pads", 1, 1, 1, 1))
		a := b.Node("Add", []string{c, b.RandNormal("ab", 0.5, 16)})
		return precBN(b, a, 16, 15)
	}, 13, "", []string{"not one value per channel of a rank-4 output"}},
	{"shared weights", func(b *testmodels.Builder, x string) string {
		w := b.He("w", 27, 8, 3, 3, 3)
		one := precBN(b, b.Node("Conv", []string{x, w}), 8, 8)
		two := precBN(b, b.Node("Conv", []string{x, w}), 8, 9)
		return b.Node("Add", []string{one, two})
	}, 13, "folded 2 BatchNormalization nodes into Conv", nil},
	{"kept: after Relu and on a read-twice Conv", func(b *testmodels.Builder, x string) string {
		r := precBN(b, b.Node("Relu", []string{x}), 3, 10)
		c := b.Node("Conv", []string{r, b.He("w", 27, 8, 3, 3, 3)})
		return b.Node("Add", []string{precBN(b, c, 8, 11), c})
	}, 13, "", []string{"comes from Relu Relu_1, not Conv", "has 2 readers"}},
	{"kept: training mode, computed scale", func(b *testmodels.Builder, x string) string {
		c := b.Node("Conv", []string{x, b.He("w", 27, 8, 3, 3, 3)})
		t := precBN(b, c, 8, 12, testmodels.Int("training_mode", 1))
		c2 := b.Node("Conv", []string{t, b.He("w2", 72, 8, 8, 1, 1)})
		s := b.Node("Abs", []string{b.RandNormal("s", 1, 8)})
		return b.Node("BatchNormalization", []string{c2, s, b.RandNormal("bb", 1, 8), b.RandNormal("m", 1, 8), b.Init("v", []int64{8}, make([]float32, 8))})
	}, 15, "", []string{"training mode", "scale \"Abs_"}},
}

func TestFoldBatchNorm(t *testing.T) {
	for _, tc := range precBNCases {
		t.Run(tc.name, func(t *testing.T) {
			b := testmodels.NewBuilder("bn", 3)
			x := b.Input("x", onnx.Float, "N", 3, 16, 16)
			tc.build(b, x)
			b.Rename("y")
			b.Output("y", onnx.Float)
			src := precModel(t, precUnranked(b.Model(tc.opset, 8)))
			m := clone(src)
			r := foldBatchNorms(m)
			got := r.summary()
			t.Logf("%s", got)
			if tc.folded == "" && r.count() != 0 || tc.folded != "" && !strings.Contains(got, tc.folded) {
				t.Errorf("foldBatchNorms() = %q; want %q", got, tc.folded)
			}
			if len(r.skipped) != len(tc.kept) {
				t.Errorf("foldBatchNorms() kept %d, want %d: %+v", len(r.skipped), len(tc.kept), r.skipped)
			}
			for _, k := range tc.kept {
				if !strings.Contains(got, k) {
					t.Errorf("foldBatchNorms() = %q; want a reason containing %q", got, k)
				}
			}
			if n := m.OpCounts()["BatchNormalization"]; n != len(tc.kept) {
				t.Errorf("%d BatchNormalization nodes left, want %d", n, len(tc.kept))
			}
			ix := onnx.NewIndex(m.Graph())
			for _, init := range m.Graph().GetInitializer() {
				if len(ix.Consumers[init.GetName()]) == 0 {
					t.Errorf("initializer %s is left without readers", init.GetName())
				}
			}
			if strings.Contains(tc.name, "training") {
				return // ONNX Runtime's CPU kernel refuses training mode
			}
			precCompareBN(t, src, m, precInputs(t, src, onnx.Undefined, 5))
		})
	}
}

// precCompareBN checks that folded computes what src does within 1e-5
// (relative to the output's magnitude, at least 1).
func precCompareBN(t testing.TB, src, folded *onnx.Model, in map[string]*onnx.Tensor) {
	t.Helper()
	want := precRun(t, src, in)
	got := precRun(t, folded, in)
	for name, w := range want {
		d, cos := precDiff(t, w, got[name])
		scale := math.Max(1, precMaxAbs(t, w))
		t.Logf("output %s: max abs %.3g (largest value %.3g), cosine %.9f", name, d, scale, cos)
		if d > 1e-5*scale {
			t.Errorf("output %s: max abs %.3g, want at most 1e-5×%.3g", name, d, scale)
		}
	}
}

func TestBatchNormPassOptions(t *testing.T) {
	b := testmodels.NewBuilder("bn", 3)
	x := b.Input("x", onnx.Float, "N", 3, 16, 16)
	precBNCases[0].build(b, x)
	b.Rename("y")
	b.Output("y", onnx.Float)
	src := precModel(t, precUnranked(b.Model(13, 8)))
	for _, tc := range []struct {
		opts    Options
		changed int
	}{{Options{}, 1}, {Options{NoFoldBatchNorm: true}, 0}} {
		m := clone(src)
		p, err := batchNormPass(context.Background(), m, tc.opts)
		if err != nil || p.Name != "batchnorm" || p.Changed != tc.changed {
			t.Errorf("batchNormPass(%+v) = %+v, %v; want %d changed", tc.opts, p, err, tc.changed)
		}
		if tc.changed == 1 && p.Summary != "folded 1 BatchNormalization nodes into Conv" {
			t.Errorf("batchNormPass summary = %q", p.Summary)
		}
	}
}

// precMaterialize turns ConstantOfShape nodes of constant shape into
// initializers (the onnx-light models store their weights so).
func precMaterialize(t testing.TB, m *onnx.Model) {
	t.Helper()
	g := m.Graph()
	ix := onnx.NewIndex(g)
	keep := g.Node[:0]
	for _, n := range g.Node {
		if n.GetOpType() != "ConstantOfShape" || ix.Initializers[n.GetInput()[0]] == nil {
			keep = append(keep, n)
			continue
		}
		sh := ix.Initializers[n.GetInput()[0]]
		if sh == nil {
			keep = append(keep, n)
			continue
		}
		st, err := onnx.Decode(sh)
		if err != nil {
			t.Fatal(err)
		}
		dims := st.Data.([]int64)
		cnt, _ := onnx.NumElements(dims)
		v := float32(0)
		if a := precAttr(n, "value"); a != nil {
			d, _ := onnx.Decode(a.GetT())
			v = d.Data.([]float32)[0]
		}
		data := make([]float32, cnt)
		for i := range data {
			data[i] = v
		}
		tp, err := onnx.Encode(&onnx.Tensor{Name: n.Output[0], Type: onnx.Float, Dims: dims, Data: data}, onnx.Raw)
		if err != nil {
			t.Fatal(err)
		}
		g.Initializer = append(g.Initializer, tp)
	}
	g.Node = keep
}

// TestFoldBatchNormRealModels folds the BatchNormalization nodes of real
// models and checks the outputs against the unfolded model on a seeded
// random input.
func TestFoldBatchNormRealModels(t *testing.T) {
	tests := []struct {
		path      func(t testing.TB) string
		prepare   func(t testing.TB, m *onnx.Model)
		shape     []int64 // of the one input; nil: the model's, dynamic dims 1
		minFolded int
	}{
		{func(t testing.TB) string { return testutil.NPMModel(t, "ch_PP-OCRv4_det_infer.onnx") }, precPrepConstants, []int64{1, 3, 320, 320}, 3},
		{func(t testing.TB) string { return testutil.NPMModel(t, "ch_ppocr_mobile_v2.0_cls_infer.onnx") }, precPrepConstants, []int64{1, 3, 48, 192}, 35},
		{func(t testing.TB) string { return testutil.NPMModel(t, "ch_PP-OCRv4_rec_infer.onnx") }, precPrepConstants, []int64{1, 3, 48, 320}, 1},
		{func(t testing.TB) string { return testutil.Corpus(t, "models", "onnx-light", "light_resnet50.onnx") }, precMaterialize, nil, 53},
		{func(t testing.TB) string { return testutil.Corpus(t, "models", "onnx-light", "light_densenet121.onnx") }, precMaterialize, nil, 1},
		{func(t testing.TB) string { return testutil.Corpus(t, "models", "real", "yolox_nano_3cls.onnx") }, nil, nil, 0},
	}
	for _, tc := range tests {
		path := tc.path(t)
		t.Run(filepath.Base(path), func(t *testing.T) {
			m, err := onnx.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.prepare != nil {
				tc.prepare(t, m)
			}
			src := clone(m)
			r := foldBatchNorms(m)
			t.Logf("%s: %d BatchNormalization nodes: %s", filepath.Base(path), r.count()+len(r.skipped), r.summary())
			if r.count() < tc.minFolded {
				t.Errorf("folded %d, want at least %d", r.count(), tc.minFolded)
			}
			in := precInputs(t, src, onnx.Undefined, 42)
			if tc.shape != nil {
				for name := range in {
					x, err := onnx.Random(name, onnx.Float, tc.shape, 42)
					if err != nil {
						t.Fatal(err)
					}
					in[name] = x
				}
			}
			precCompareBN(t, src, m, in)
		})
	}
}

// precPrepConstants turns Constant nodes into initializers (the
// constants pass does so before this one in Normalize).
func precPrepConstants(t testing.TB, m *onnx.Model) {
	t.Helper()
	n := precConstantsToInits(m)
	t.Logf("%d Constant nodes made initializers", n)
}

// TestFoldBatchNormBackendSuite runs ONNX's own BatchNormalization tests:
// each node is folded (and the output still matches the expected one) or
// kept with a reason.
func TestFoldBatchNormBackendSuite(t *testing.T) {
	suite := testutil.BackendSuite(t)
	dirs, _ := filepath.Glob(filepath.Join(suite, "*", "test_[Bb]atch[Nn]orm*"))
	if len(dirs) == 0 {
		t.Skip("no BatchNormalization tests in " + suite)
	}
	ortest.Init(t)
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			src := clone(m)
			r := foldBatchNorms(m)
			t.Logf("%s", r.summary())
			if r.count()+len(r.skipped) != src.OpCounts()["BatchNormalization"] {
				t.Errorf("folded %d and kept %d of %d", r.count(), len(r.skipped), src.OpCounts()["BatchNormalization"])
			}
			for _, k := range r.skipped {
				if k.reason == "" {
					t.Errorf("%s kept without a reason", k.node)
				}
			}
			if r.count() == 0 {
				return
			}
			in := map[string]*onnx.Tensor{}
			for i, v := range src.Inputs() {
				p := filepath.Join(dir, "test_data_set_0", fmt.Sprintf("input_%d.pb", i))
				if _, err := os.Stat(p); err != nil {
					t.Fatal(err)
				}
				in[v.Name] = ortest.ReadTensor(t, p)
			}
			precCompareBN(t, src, m, in)
		})
	}
}

// TestFoldBatchNormPPOCRFP16 is the failure folding fixes at its root:
// PP-OCRv4 det converted to float16 as it is loses its output (the
// BatchNormalization variances are clamped), folded first it keeps it.
func TestFoldBatchNormPPOCRFP16(t *testing.T) {
	m, err := onnx.Load(testutil.NPMModel(t, "ch_PP-OCRv4_det_infer.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	precConstantsToInits(m)
	x, err := onnx.Random("x", onnx.Float, []int64{1, 3, 320, 320}, 42)
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]*onnx.Tensor{"x": x}
	want := precRun(t, m, in)
	plain := precRun(t, precFP16(t, m, true), in)
	folded := clone(m)
	if r := foldBatchNorms(folded); r.count() != 3 {
		t.Fatalf("foldBatchNorms(PP-OCRv4 det) = %s; want 3 folded", r.summary())
	}
	got := precRun(t, precFP16(t, folded, true), in)
	for name, w := range want {
		d0, c0 := precDiff(t, w, plain[name])
		d, c := precDiff(t, w, got[name])
		t.Logf("output %s against fp32: fp16 as is max abs %.3g cosine %.6f; fp16 after folding max abs %.3g cosine %.6f", name, d0, c0, d, c)
		if d > 1e-3 || c < 0.99 {
			t.Errorf("output %s of the folded fp16 model: max abs %.3g, cosine %.6f; want at most 1e-3 and at least 0.99", name, d, c)
		}
	}
}
