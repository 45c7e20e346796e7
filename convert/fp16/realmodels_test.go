package fp16

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// scans are the two text scans of the real-image cache.
var scans = []string{"page.png", "text.png"}

// scanSamples preprocesses the text scans for the model input named input.
func scanSamples(t *testing.T, input, spec string) []map[string]*onnx.Tensor {
	t.Helper()
	p, err := dataset.ParsePreprocess(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := testutil.Images(t)
	var out []map[string]*onnx.Tensor
	for _, name := range scans {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		x, err := p.Apply(data, input)
		if err != nil {
			t.Fatalf("preprocessing %s: %v", name, err)
		}
		x.Dims = append([]int64{1}, x.Dims...)
		out = append(out, map[string]*onnx.Tensor{input: x})
	}
	return out
}

// cosines runs ref and got on every sample and returns the mean cosine of
// each output, measured with check's Accumulator.
func cosines(t *testing.T, ref, got *onnx.Model, samples []map[string]*onnx.Tensor) map[string]check.Metrics {
	t.Helper()
	acc := map[string]*check.Accumulator{}
	for i, in := range samples {
		want, err := runModel(ref, in)
		if err != nil {
			t.Fatalf("running the fp32 model: %v", err)
		}
		have, err := runModel(got, in)
		if err != nil {
			t.Fatalf("running the fp16 model: %v", err)
		}
		for name, w := range want {
			if acc[name] == nil {
				acc[name] = check.NewAccumulator(name, check.KindOther, check.Thresholds{})
			}
			if err := acc[name].Add(w, have[name], []string{scans[i%len(scans)]}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := map[string]check.Metrics{}
	for name, a := range acc {
		out[name] = a.Metrics()
	}
	return out
}

// TestPPOCRv4DetAnalyze: the plain rewrite of PP-OCRv4 det clamps
// BatchNormalization variances above 65504 (cosine about 0.6 against
// float32); with Analyze on the two text scans the BatchNormalization
// nodes stay float32 and the cosine is at least 0.999, without a
// hand-written block list.
func TestPPOCRv4DetAnalyze(t *testing.T) {
	initORT(t)
	m, err := onnx.Load(testutil.NPMModel(t, "ch_PP-OCRv4_det_infer.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	samples := scanSamples(t, m.Inputs()[0].Name, "resize=640x640,scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225")
	plain, prep, err := Convert(m, Options{KeepIOTypes: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, mt := range cosines(t, m, plain, samples) {
		t.Logf("plain rewrite, output %q: cosine %.6f (worst %.6f), %d tensors clamped", name, mt.Cosine, mt.WorstCosine, len(prep.Clamped))
	}
	a, err := Analyze(context.Background(), m, samples, AnalyzeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range a.Kept {
		t.Logf("kept: %s", k.Reason)
	}
	h, rep, err := Convert(m, Options{KeepIOTypes: true, Analysis: a})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range rep.Warnings {
		t.Logf("warning: %s", w)
	}
	for name, mt := range cosines(t, m, h, samples) {
		t.Logf("with the analysis, output %q: cosine %.6f (worst %.6f, max abs %.3g)", name, mt.Cosine, mt.WorstCosine, mt.MaxAbs)
		if mt.WorstCosine < fp16MinCosine {
			t.Errorf("output %q: worst cosine %.6f, want >= %g", name, mt.WorstCosine, fp16MinCosine)
		}
	}
	if len(rep.Clamped) > 0 && clampedAbove(rep) {
		t.Errorf("values above 65504 still clamped: %+v", rep.Clamped)
	}
}

func clampedAbove(rep *Report) bool {
	for _, c := range rep.Clamped {
		if c.Clamped > 0 {
			return true
		}
	}
	return false
}

// TestPPOCRv4Rec: the float16 PP-OCRv4 recognizer loads at ONNX Runtime's
// default (highest) optimization level, where its LayerNorm patterns are
// fused (see powRule), and matches float32 on a seeded random input and
// on the two text scans.
func TestPPOCRv4Rec(t *testing.T) {
	initORT(t)
	m, err := onnx.Load(testutil.NPMModel(t, "ch_PP-OCRv4_rec_infer.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	h, rep, err := Convert(m, Options{KeepIOTypes: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("blocked %v", rep.BlockedNodes)
	input := m.Inputs()[0].Name
	x, err := onnx.Random(input, onnx.Float, []int64{1, 3, 48, 320}, 1)
	if err != nil {
		t.Fatal(err)
	}
	samples := append([]map[string]*onnx.Tensor{{input: x}},
		scanSamples(t, input, "resize=48x320,scale=1/255,mean=0.5,std=0.5")...)
	for name, mt := range cosines(t, m, h, samples) {
		t.Logf("output %q: cosine %.6f (worst %.6f, max abs %.3g)", name, mt.Cosine, mt.WorstCosine, mt.MaxAbs)
		if mt.WorstCosine < fp16MinCosine {
			t.Errorf("output %q: worst cosine %.6f, want >= %g", name, mt.WorstCosine, fp16MinCosine)
		}
	}
}
