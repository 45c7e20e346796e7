package fp16

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

// chainModel is y = op(x · w) for one op with a one-element weight w:
// x · w is a Mul node "scale", op a node named "op".
func chainModel(op string, w float32) *onnx.Model {
	b := testmodels.NewBuilder("chain", 1)
	x := b.Input("x", onnx.Float, 1, 4)
	wn := b.Init("w", []int64{1}, []float32{w})
	b.Node("Mul", []string{x, wn})
	b.Rename("scaled")
	b.Node(op, []string{"scaled"})
	b.Rename("y")
	g := b.Model(13, 7)
	g.Graph.Node[0].Name = &[]string{"scale"}[0]
	g.Graph.Node[1].Name = &[]string{"op"}[0]
	outDims := []any{1, 4}
	if strings.HasPrefix(op, "Reduce") {
		outDims = []any{1, 1}
	}
	b.Output("y", onnx.Float, outDims...)
	return &onnx.Model{Proto: g}
}

func TestAnalyze(t *testing.T) {
	initORT(t)
	for _, tc := range []struct {
		name string
		op   string
		w    float32
		x    []float32
		kept map[string]string // node → text its reason must contain
	}{
		{"in range", "Relu", 2, []float32{1, -2, 3, 4}, nil},
		{"weight beyond fp16", "Relu", 1e6, []float32{1e-3, 0, 0, 0}, map[string]string{
			"scale": "input 1 (w) up to 1e+06 exceeds float16's 65504"}},
		{"activation overflow", "Relu", 1000, []float32{30, 1, 1, 1}, map[string]string{
			"scale": "activations output scaled up to 3e+04 exceed 16384",
			"op":    "activations input 0 (scaled) up to 3e+04 exceed 16384"}},
		{"underflow", "Relu", 1e-6, []float32{1, 2, 3, 4}, map[string]string{
			"scale": "output scaled have 100% of their non-zero values below float16's smallest normal",
			"op":    "input 0 (scaled) have 100%"}},
		{"squares overflow", "ReduceSumSquare", 1, []float32{200, 1, 1, 1}, map[string]string{
			"op": "activations input 0 (scaled) up to 200 exceed 128"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := chainModel(tc.op, tc.w)
			x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{1, 4}, Data: tc.x}
			a, err := Analyze(context.Background(), m, []map[string]*onnx.Tensor{{"x": x}}, AnalyzeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, k := range a.Kept {
				got[k.Node] = k.Reason
			}
			if len(got) != len(tc.kept) {
				t.Errorf("Analyze kept %q, want %d nodes (%v)", got, len(tc.kept), tc.kept)
			}
			for node, want := range tc.kept {
				if !strings.Contains(got[node], want) {
					t.Errorf("reason for %s = %q, want it to contain %q", node, got[node], want)
				}
			}
			h, rep, err := Convert(m, Options{KeepIOTypes: true, Analysis: a})
			if err != nil {
				t.Fatal(err)
			}
			for node := range tc.kept {
				if !contains(rep.BlockedNodes, node) {
					t.Errorf("Convert with the analysis: BlockedNodes = %v, want %s among them", rep.BlockedNodes, node)
				}
			}
			want, err := runModel(m, map[string]*onnx.Tensor{"x": x})
			if err != nil {
				t.Fatal(err)
			}
			out, err := runModel(h, map[string]*onnx.Tensor{"x": x})
			if err != nil {
				t.Fatalf("running the fp16 model: %v", err)
			}
			if msg := suiteMismatch(t, out["y"], want["y"]); msg != "" {
				t.Errorf("fp16 with the analysis: y %s", msg)
			}
		})
	}
}

func TestAnalyzeRefusals(t *testing.T) {
	initORT(t)
	m := chainModel("Relu", 2)
	x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{1, 4}, Data: []float32{1, 2, 3, 4}}
	sample := []map[string]*onnx.Tensor{{"x": x}}
	for _, tc := range []struct {
		name    string
		samples []map[string]*onnx.Tensor
		opts    AnalyzeOptions
		want    string
	}{
		{"no samples", nil, AnalyzeOptions{}, ErrNoSamples.Error()},
		{"activation limit", sample, AnalyzeOptions{MaxActivation: 1e5}, "MaxActivation 100000"},
		{"underflow share", sample, AnalyzeOptions{MaxUnderflow: 2}, "underflow shares"},
		{"missing input", []map[string]*onnx.Tensor{{}}, AnalyzeOptions{}, "running sample 0"},
	} {
		_, err := Analyze(context.Background(), m, tc.samples, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Analyze(%s) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	other := &Analysis{Kept: []KeptNode{{Node: "conv_bn_3", Op: "BatchNormalization"}}}
	if _, _, err := Convert(m, Options{Analysis: other}); err == nil || !strings.Contains(err.Error(), "conv_bn_3") {
		t.Errorf("Convert with another model's analysis = %v, want an error naming conv_bn_3", err)
	}
	if _, err := Analyze(context.Background(), m, sample, AnalyzeOptions{}); errors.Is(err, ErrNoSamples) {
		t.Errorf("Analyze with a sample = %v", err)
	}
}

// BenchmarkAnalyze compares Analyze (one sample of batch 1) plus Convert
// of a ~100 MB model with onnx.Load plus Save of the same model, side by
// side in one loop, and reports analyze+convert/base.
func BenchmarkAnalyze(b *testing.B) {
	initORT(b)
	dir := b.TempDir()
	path := filepath.Join(dir, "wide100.onnx")
	if err := (&onnx.Model{Proto: testmodels.Wide(100, 7)}).Save(path); err != nil {
		b.Fatal(err)
	}
	m, err := onnx.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	x, err := onnx.Random("x", onnx.Float, []int64{1, 1024}, 1)
	if err != nil {
		b.Fatal(err)
	}
	samples := []map[string]*onnx.Tensor{{"x": x}}
	out := filepath.Join(dir, "out.onnx")
	var base, analyzed time.Duration
	for i := 0; i < b.N; i++ {
		runtime.GC()
		t0 := time.Now()
		l, err := onnx.Load(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Save(out); err != nil {
			b.Fatal(err)
		}
		base += time.Since(t0)
		runtime.GC()
		t0 = time.Now()
		a, err := Analyze(context.Background(), m, samples, AnalyzeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := Convert(m, Options{KeepIOTypes: true, Analysis: a}); err != nil {
			b.Fatal(err)
		}
		analyzed += time.Since(t0)
	}
	os.Remove(out)
	b.ReportMetric(float64(base.Milliseconds())/float64(b.N), "load+save-ms")
	b.ReportMetric(float64(analyzed.Milliseconds())/float64(b.N), "analyze+convert-ms")
	b.ReportMetric(float64(analyzed)/float64(base), "analyze/base")
}
