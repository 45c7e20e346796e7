package fp16

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"os"
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

// What ONNX Runtime's CPU provider checks here (measured with 1.24.1): it
// loads every float16 model of the corpus, although it has float16 kernels
// for few operators, because its mandatory InsertCastTransformer (run at
// every optimization level, "disabled" included) wraps each float16 node
// without a CPU kernel in Casts to float32, and then drops the
// float32→float16→float32 Cast pairs this creates. The arithmetic therefore
// runs in float32: these tests check the rewritten graph (types, Casts,
// blocked nodes, converted and clamped weights, float16 inputs rounding),
// not float16 accumulation, which only a GPU run (CUDA or TensorRT) shows.
// Operators with no float16 input to cast from (RandomNormal) fail to load
// ("Could not find an implementation"); block them for CPU runs.
//
// Tolerances of the float16 variants against the float32 reference outputs
// stored in the corpus. Values are compared elementwise as
// |got-want| <= fp16RTol*|want| + fp16ATol*max(1, max|want|): float16 has
// an 11-bit significand (relative rounding 4.9e-4 per operation), and a
// few roundings per operator plus accumulation give errors of a few 1e-3
// relative; the absolute part is scaled by the output's magnitude because
// sums that cancel (MatMul, Conv) have errors proportional to their terms,
// not to their result. Deep networks accumulate more and are judged by
// cosine similarity and top-1 agreement instead, as serve does for int8.
const (
	fp16RTol      = 1e-2
	fp16ATol      = 2e-3
	fp16MinCosine = 0.999
)

// fp16NotApplicable lists the corpus node tests the float16 rewrite does
// not apply to, with the reason and the error or warning that shows it.
var fp16NotApplicable = map[string]struct{ reason, shows string }{
	"test_cast_FLOAT16_to_FLOAT": {"the model already has a float16 input", "already uses float16"},
	"test_cast_FLOAT_to_FLOAT16": {"the model already casts to float16", "already uses float16"},
	"test_dynamicquantizelinear": {"DynamicQuantizeLinear has no float16 type", "nothing was converted"},
}

// fp16Unrunnable lists converted models ONNX Runtime cannot run on the
// CPU, with the text its error must contain; the float32 originals fail
// the same way (ort's conformance test lists them).
var fp16Unrunnable = map[string]string{
	"pytorch-converted/test_AvgPool2d":        "Failed to find kernel for AveragePool(1)",
	"pytorch-converted/test_BatchNorm2d_eval": "Failed to find kernel for BatchNormalization(6)",
	"pytorch-converted/test_Linear":           "Failed to find kernel for Gemm(6)",
}

func initORT(t testing.TB) { ortest.Init(t) }

func readTensorFile(t testing.TB, path string) *onnx.Tensor { return ortest.ReadTensor(t, path) }

func runModel(m *onnx.Model, in map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	data, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	s, err := ort.NewSessionFromBytes(data, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Run(context.Background(), in, nil)
}

// errStats measures got against want.
type errStats struct {
	maxAbs, maxRel, cosine, scale float64
	bad                           int // elements outside the elementwise tolerance
	n                             int
	top1                          bool
}

func (e errStats) String() string {
	return fmt.Sprintf("max abs %.3g, max rel %.3g (of max|want| %.3g), cosine %.6f, %d/%d outside tolerance, top-1 same %v",
		e.maxAbs, e.maxRel, e.scale, e.cosine, e.bad, e.n, e.top1)
}

// float64Pair returns got's and want's values as float64s.
func float64Pair(t testing.TB, got, want *onnx.Tensor) (g, w []float64) {
	t.Helper()
	g, err := got.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	if w, err = want.Float64s(); err != nil {
		t.Fatal(err)
	}
	return g, w
}

func compareFP16(t testing.TB, got, want *onnx.Tensor) errStats {
	t.Helper()
	g, w := float64Pair(t, got, want)
	if len(g) != len(w) {
		t.Fatalf("%d elements, want %d", len(g), len(w))
	}
	var s errStats
	s.n = len(w)
	for _, v := range w {
		s.scale = math.Max(s.scale, math.Abs(v))
	}
	var dot, gg, ww float64
	gi, wi := 0, 0
	for i := range w {
		if math.IsNaN(w[i]) || math.IsInf(w[i], 0) {
			if !(math.IsNaN(w[i]) && math.IsNaN(g[i])) && g[i] != w[i] {
				s.bad++
			}
			continue
		}
		d := math.Abs(g[i] - w[i])
		s.maxAbs = math.Max(s.maxAbs, d)
		s.maxRel = math.Max(s.maxRel, d/math.Max(math.Abs(w[i]), 1e-6))
		if !(d <= fp16RTol*math.Abs(w[i])+fp16ATol*math.Max(1, s.scale)) {
			s.bad++
		}
		dot, gg, ww = dot+g[i]*w[i], gg+g[i]*g[i], ww+w[i]*w[i]
		if g[i] > g[gi] {
			gi = i
		}
		if w[i] > w[wi] {
			wi = i
		}
	}
	s.cosine = 1
	if gg > 0 && ww > 0 {
		s.cosine = dot / math.Sqrt(gg*ww)
	} else if gg != ww {
		s.cosine = 0
	}
	s.top1 = gi == wi
	return s
}

type nodeCase struct{ name, dir string }

func corpusNodeTests(t testing.TB) []nodeCase {
	root := testutil.Corpus(t, "onnx-node")
	var out []nodeCase
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if _, err := os.Stat(filepath.Join(p, "model.onnx")); err == nil {
				rel, _ := filepath.Rel(root, p)
				out = append(out, nodeCase{filepath.ToSlash(rel), p})
			}
		}
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func ioTypes(m *onnx.Model) string {
	var s []string
	for _, v := range append(m.Inputs(), m.Outputs()...) {
		s = append(s, v.String())
	}
	return strings.Join(s, " ")
}

// TestCorpusNodeTests converts every ONNX backend test of the corpus,
// runs the float16 model in ONNX Runtime and compares with the stored
// float32 outputs.
func TestCorpusNodeTests(t *testing.T) {
	initORT(t)
	tests := corpusNodeTests(t)
	seen := map[string]bool{}
	for _, tc := range tests {
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			m, err := onnx.Load(filepath.Join(tc.dir, "model.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			h, rep, err := Convert(m, Options{KeepIOTypes: true})
			na, listed := fp16NotApplicable[tc.name]
			if listed {
				msg := ""
				if err != nil {
					msg = err.Error()
				} else {
					msg = strings.Join(rep.Warnings, "; ")
				}
				if !strings.Contains(msg, na.shows) {
					t.Fatalf("listed as not applicable (%s), want %q in the result; Convert = %v, warnings %q", na.reason, na.shows, err, msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Convert = %v", err)
			}
			if got, want := ioTypes(h), ioTypes(m); got != want {
				t.Errorf("graph I/O with KeepIOTypes = %s, want %s", got, want)
			}
			in, want := map[string]*onnx.Tensor{}, map[string]*onnx.Tensor{}
			for i, v := range m.Inputs() {
				in[v.Name] = readTensorFile(t, filepath.Join(tc.dir, "test_data_set_0", "input_"+strconv.Itoa(i)+".pb"))
			}
			for i, v := range m.Outputs() {
				want[v.Name] = readTensorFile(t, filepath.Join(tc.dir, "test_data_set_0", "output_"+strconv.Itoa(i)+".pb"))
			}
			got, err := runModel(h, in)
			if msg, listed := fp16Unrunnable[tc.name]; listed {
				if err == nil || !strings.Contains(err.Error(), msg) {
					t.Fatalf("listed as unrunnable (%q) but Run = %v", msg, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("running the fp16 model: %v\nreport %+v", err, rep)
			}
			worstBad := 0
			for name, w := range want {
				g, ok := got[name]
				if !ok {
					t.Fatalf("output %q missing", name)
				}
				if !w.Type.IsFloat() {
					// Quantized outputs may move by one step: x/scale is
					// rounded in float16 before it is rounded to an integer.
					if d := maxIntDiff(t, g, w); d > 1 {
						t.Errorf("output %q = %v, want %v (±1)", name, g.Data, w.Data)
					}
					continue
				}
				st := compareFP16(t, g, w)
				t.Logf("output %q: %s (blocked %v, casts +%d -%d)", name, st, rep.BlockedNodes, rep.CastsInserted, rep.CastsRemoved)
				worstBad = max(worstBad, st.bad)
			}
			if worstBad > 0 {
				t.Errorf("outside the fp16 tolerance (rtol %g, atol %g·max(1,max|want|))", fp16RTol, fp16ATol)
			}
		})
	}
	for name := range fp16Unrunnable {
		if !seen[name] {
			t.Errorf("%s is listed but not in the corpus", name)
		}
	}
	for name := range fp16NotApplicable {
		if !seen[name] {
			t.Errorf("%s is listed but not in the corpus", name)
		}
	}
}

func maxIntDiff(t testing.TB, got, want *onnx.Tensor) float64 {
	g, w := float64Pair(t, got, want)
	if got.Type != want.Type || len(g) != len(w) {
		t.Fatalf("got %s[%d], want %s[%d]", got.Type, len(g), want.Type, len(w))
	}
	d := 0.0
	for i := range w {
		d = math.Max(d, math.Abs(g[i]-w[i]))
	}
	return d
}

// arangeInput is the onnx-light runner's input: x = arange(n).reshape(S)/n.
func arangeInput(v onnx.ValueInfo) *onnx.Tensor { return ortest.ArangeInput(v) }

// TestNetworks converts whole networks: the six onnx-light CNNs of
// the corpus (compared with their stored float32 output) and kiln's
// tinynet (compared with its float32 run).
func TestNetworks(t *testing.T) {
	initORT(t)
	dir := testutil.Corpus(t, "models", "onnx-light")
	paths, _ := filepath.Glob(filepath.Join(dir, "light_*.onnx"))
	if len(paths) != 6 {
		t.Fatalf("found %d onnx-light models, want 6", len(paths))
	}
	paths = append(paths, filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx"))
	for _, p := range paths {
		name := strings.TrimSuffix(filepath.Base(p), ".onnx")
		t.Run(name, func(t *testing.T) {
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			ins := m.Inputs()
			x := arangeInput(ins[0])
			in := map[string]*onnx.Tensor{x.Name: x}
			var want *onnx.Tensor
			if name == "tinynet" {
				ref, err := runModel(m, in)
				if err != nil {
					t.Fatal(err)
				}
				want = ref[m.Outputs()[0].Name]
			} else {
				want = readTensorFile(t, filepath.Join(dir, name+"_output_0.pb"))
			}
			h, rep, err := Convert(m, Options{KeepIOTypes: true})
			if err != nil {
				t.Fatalf("Convert = %v", err)
			}
			if got, want := ioTypes(h), ioTypes(m); got != want {
				t.Errorf("graph I/O with KeepIOTypes = %s, want %s", got, want)
			}
			got, err := runModel(h, in)
			if err != nil {
				t.Fatalf("running the fp16 model: %v", err)
			}
			st := compareFP16(t, got[m.Outputs()[0].Name], want)
			t.Logf("%s: %s; %d tensors converted, %d kept, casts +%d -%d, %d clamped tensors",
				name, st, rep.ConvertedInitializers, rep.KeptInitializers, rep.CastsInserted, rep.CastsRemoved, len(rep.Clamped))
			if st.cosine < fp16MinCosine || !st.top1 {
				t.Errorf("cosine %.6f (want >= %g), top-1 same %v", st.cosine, fp16MinCosine, st.top1)
			}
		})
	}
}
