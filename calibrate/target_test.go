package calibrate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

func TestParseTarget(t *testing.T) {
	tests := []struct {
		spec string
		want Target
		err  string
	}{
		{"cosine=0.99,top1=0.98", Target{{Metric: "cosine", Min: 0.99}, {Metric: "top1", Min: 0.98}}, ""},
		{" min_cosine = 0.95 , top5=1", Target{{Metric: "min_cosine", Min: 0.95}, {Metric: "top5", Min: 1}}, ""},
		{"probs:cosine=0.99,top1=0.98", Target{{Output: "probs", Metric: "cosine", Min: 0.99}, {Output: "probs", Metric: "top1", Min: 0.98}}, ""},
		{"cosine=0.9,logits:0:top1=0.5,*:top5=0.9", Target{{Metric: "cosine", Min: 0.9}, {Output: "logits:0", Metric: "top1", Min: 0.5}, {Metric: "top5", Min: 0.9}}, ""},
		{"cosine=-1", Target{{Metric: "cosine", Min: -1}}, ""},
		{"scores:agreement=0.95", Target{{Output: "scores", Metric: "agreement", Min: 0.95}}, ""},
		{"agreement=1.2", nil, "agreement=1.2: want a value in [0, 1]"},
		{"accuracy=0.9", nil, `unknown metric "accuracy"`},
		{"top1=1.5", nil, "top1=1.5: want a value in [0, 1]"},
		{"top1=-0.1", nil, "want a value in [0, 1]"},
		{"cosine=NaN", nil, "want a value in [-1, 1]"},
		{"cosine=high", nil, `"high" is not a number`},
		{"cosine", nil, "want METRIC=VALUE"},
		{"", nil, "want METRIC=VALUE"},
		{":cosine=0.9", nil, "empty output name"},
		{"cosine=0.9,cosine=0.8", nil, "cosine is given twice"},
		{"x:cosine=0.9,cosine=0.8", nil, "x:cosine is given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseTarget(tt.spec)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseTarget(%q) error = %v, want %q", tt.spec, err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseTarget(%q) = %+v, %v, want %+v", tt.spec, got, err, tt.want)
			}
			if again, err := ParseTarget(got.String()); err != nil || !reflect.DeepEqual(again, got) {
				t.Errorf("ParseTarget(%q) = %+v, %v, want %+v", got.String(), again, err, got)
			}
		})
	}
}

// A parsed target is valid and reads back from its String unchanged.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"cosine=0.99,top1=0.98", "probs:cosine=0.99,top1=0.98,*:min_cosine=0.9",
		"a:b:top5=1e-3", "x=y:cosine=0x1p-1", "cosine=-0", " top1 = .5 ", "cosine=0.9,,top1=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		tg, err := ParseTarget(spec)
		if err != nil {
			return
		}
		if err := tg.Validate(); err != nil {
			t.Fatalf("ParseTarget(%q) = %+v, which is invalid: %v", spec, tg, err)
		}
		again, err := ParseTarget(tg.String())
		if err != nil || !reflect.DeepEqual(again, tg) {
			t.Fatalf("ParseTarget(%q) = %+v, %v, want %+v (from %q)", tg.String(), again, err, tg, spec)
		}
	})
}

// outlierModel is x [N,16] -> Gemm_1 -> Gemm_2 -> Gemm_3 -> logits [N,10],
// where channel 0 of Gemm_1's output is 1000 times the others and Gemm_2
// weighs it down as much: per-tensor int8 on Gemm_2's input rounds every
// other channel to (almost) zero, so plain int8 is far from fp32, and
// keeping Gemm_2 in fp32 brings it close.
func outlierModel() *onnxpb.ModelProto {
	b := testmodels.NewBuilder("outlier", 5)
	x := b.Input("x", onnx.Float, "N", 16)
	w1 := make([]float32, 16*32)
	w2 := make([]float32, 32*32)
	for i := range w1 {
		w1[i] = float32((i*37)%17-8) / 20
		if i%32 == 0 {
			w1[i] *= 1000
		}
	}
	for i := range w2 {
		w2[i] = float32((i*53)%19-9) / 25
		if i < 32 {
			w2[i] /= 1000
		}
	}
	h := b.Node("Gemm", []string{x, b.Init("w1", []int64{16, 32}, w1)})
	h = b.Node("Gemm", []string{h, b.Init("w2", []int64{32, 32}, w2)})
	b.Node("Gemm", []string{h, b.He("w3", 32, 32, 10)})
	b.Rename("logits")
	b.Output("logits", onnx.Float, "N", 10)
	return b.Model(13, 7)
}

// runOutlier calibrates outlierModel with minmax ranges towards target.
func runOutlier(t *testing.T, target string) (string, *Report, error) {
	t.Helper()
	initORT(t)
	dir := t.TempDir()
	model := writeModel(t, dir, "outlier.onnx", outlierModel())
	npy := writeNpy(t, dir, "x", 48, []int64{16}, 9)
	tg, err := ParseTarget(target)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	rep, err := Run(context.Background(), Config{Model: model, Data: dataset.Spec{Path: npy}, Method: MinMax, Batch: 8, Target: tg}, out)
	return out, rep, err
}

func TestRunTargetKeepsWorstLayer(t *testing.T) {
	out, rep, err := runOutlier(t, "cosine=0.995,min_cosine=0.99")
	if err != nil {
		t.Fatal(err)
	}
	tr := rep.Target
	if tr == nil || !tr.Met || len(tr.Steps) < 2 || len(tr.Steps[0].Missed) == 0 {
		t.Fatalf("Run(target).Target = %+v, want met after missing at step 0", tr)
	}
	t.Logf("cosine %.6f before, %.6f after; kept %v; int8 share %.3f", tr.Steps[0].Outputs[0].Cosine, rep.Accuracy.Outputs[0].Cosine, tr.Kept, tr.Int8Share)
	if len(tr.Kept) != 1 || tr.Kept[0].Node != "Gemm_2" || tr.Best != len(tr.Steps)-1 {
		t.Errorf("kept %v at step %d of %d, want Gemm_2 first, the last step", tr.Kept, tr.Best, len(tr.Steps)-1)
	}
	// Gemm_2 is 32x32 of the 16x32+32x32+32x10 multiply-accumulates.
	if want := 1 - 1024.0/(512+1024+320); len(tr.Kept) == 1 && (tr.Int8Share < want-1e-9 || tr.Int8Share > want+1e-9) {
		t.Errorf("int8 share = %v, want %v", tr.Int8Share, want)
	}
	if rep.Baseline == nil || rep.Accuracy.Outputs[0].Cosine < 0.995 || rep.Baseline.Outputs[0].Cosine >= 0.995 {
		t.Errorf("baseline %v, accuracy %v: want the step-0 baseline below the target and the accuracy above", rep.Baseline, rep.Accuracy)
	}
	m, err := onnx.Load(filepath.Join(out, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m.Graph().GetNode() {
		if n.GetName() == "Gemm_2" && strings.HasSuffix(n.GetInput()[0], "_dequantized") {
			t.Errorf("model.int8.onnx quantizes Gemm_2's input %s", n.GetInput()[0])
		}
	}
	written, err := readReport(filepath.Join(out, ReportJSON))
	if err != nil || written.Target == nil || !written.Target.Met {
		t.Errorf("report.json target = %+v, %v, want it met", written, err)
	}
	md, _ := os.ReadFile(filepath.Join(out, ReportMD))
	if !strings.Contains(string(md), "## Accuracy target `cosine=0.995,min_cosine=0.99`") || !strings.Contains(string(md), "`Gemm_2`") {
		t.Errorf("report.md has no target section naming Gemm_2:\n%s", md)
	}
	// What convert records in kiln.json.
	co, err := ReadOutput(out)
	if c := co.Calibration; err != nil || c.Target != "cosine=0.995,min_cosine=0.99" || !slices.Equal(c.KeptFP32, []string{"Gemm_2"}) || c.Int8Share != tr.Int8Share {
		t.Errorf("ReadOutput calibration = %+v, %v, want the target, Gemm_2 kept and the int8 share", co.Calibration, err)
	}
}

func TestRunTargetNotMet(t *testing.T) {
	out, rep, err := runOutlier(t, "cosine=1")
	var te *TargetError
	if !errors.As(err, &te) || rep != nil {
		t.Fatalf("Run(cosine=1) = %v, %v, want a *TargetError", rep, err)
	}
	tr := te.Report.Target
	if tr.Met || len(tr.Steps) < 2 || te.Report.Accuracy == nil || len(tr.Steps[tr.Best].Missed) == 0 {
		t.Fatalf("TargetError.Report.Target = %+v, want the steps and the best reached", tr)
	}
	if len(te.Report.Quantization.Layers) == 0 {
		t.Errorf("the best reached keeps every layer in fp32, want one int8 layer left")
	}
	if !strings.Contains(err.Error(), "accuracy target cosine=1 not met") || !strings.Contains(err.Error(), "logits cosine") {
		t.Errorf("error = %q, want the target and the best reached", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("Run wrote %s for a target it did not meet (%v)", out, err)
	}
}

func TestRunTargetErrors(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	model := writeModel(t, dir, "outlier.onnx", outlierModel())
	npy := writeNpy(t, dir, "x", 16, []int64{16}, 9)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown output", Config{Target: Target{{Output: "probs", Metric: "cosine", Min: 0.9}}}, `no output "probs" (its outputs: logits)`},
		{"no validation", Config{Target: Target{{Metric: "cosine", Min: 0.9}}, Validation: -1}, "needs validation samples"},
		{"no validation samples", Config{Target: Target{{Metric: "cosine", Min: 0.9}}, CalibShare: 16}, "needs validation samples"},
		{"bad metric", Config{Target: Target{{Metric: "cos", Min: 0.9}}}, `unknown metric "cos"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Model, cfg.Data = model, dataset.Spec{Path: npy}
			_, err := Run(context.Background(), cfg, filepath.Join(dir, "out"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run(%s) error = %v, want %q", tt.name, err, tt.want)
			}
		})
	}
}

func TestTargetMissed(t *testing.T) {
	acc := &Accuracy{Outputs: []OutputAccuracy{
		{Output: "boxes", Cosine: 0.999, MinCosine: 0.98},
		{Output: "probs", Cosine: 0.97, MinCosine: 0.9, Classifier: true, Top1: 0.95, Top5: 1},
	}}
	tests := []struct {
		spec string
		want []Miss
		err  string
	}{
		{"cosine=0.99", []Miss{{Output: "probs", Metric: "cosine", Min: 0.99, Got: 0.97}}, ""},
		{"top1=0.9,top5=1,boxes:min_cosine=0.95", nil, ""},
		{"min_cosine=0.95", []Miss{{Output: "probs", Metric: "min_cosine", Min: 0.95, Got: 0.9}}, ""},
		{"boxes:top1=0.9", nil, `output "boxes" is not a classifier`},
	}
	for _, tt := range tests {
		tg, err := ParseTarget(tt.spec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tg.missed(acc)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("missed(%s) error = %v, want %q", tt.spec, err, tt.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("missed(%s) = %+v, %v, want %+v", tt.spec, got, err, tt.want)
		}
	}
	if _, err := (Target{{Metric: "top5", Min: 0.9}}).missed(&Accuracy{Outputs: acc.Outputs[:1]}); err == nil || !strings.Contains(err.Error(), "no output is a classifier") {
		t.Errorf("top5 without a classifier output: error %v", err)
	}
}

// RunCached keys a calibration by its target too; an empty one is none.
func TestCacheKeyTarget(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.onnx")
	if err := os.WriteFile(model, []byte("model"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := Config{Model: model, Data: dataset.Spec{Path: dir}}
	keys := map[string]string{}
	for name, tg := range map[string]Target{"nil": nil, "empty": {}, "cosine": {{Metric: MetricCosine, Min: 0.99}}, "top1": {{Metric: MetricTop1, Min: 0.99}}} {
		c := base
		c.Target = tg
		k, err := cacheKey(c)
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = string(k)
	}
	if keys["nil"] != keys["empty"] || keys["nil"] == keys["cosine"] || keys["cosine"] == keys["top1"] {
		t.Errorf("cacheKey by target = %v, want nil = empty and the others apart", keys)
	}
}

func TestTargetChange(t *testing.T) {
	a, b, c := Layer{Op: "Conv", Output: "a"}, Layer{Op: "Conv", Output: "b"}, Layer{Op: "Add", Output: "c"}
	r := &TargetReport{Steps: []TargetStep{{}, {Kept: []Layer{a}}, {Kept: []Layer{a, b, c}}, {Kept: []Layer{a, b}}}}
	for i, want := range [][2][]Layer{{nil, nil}, {{a}, nil}, {{b, c}, nil}, {nil, {c}}} {
		added, dropped := r.Change(i)
		if !reflect.DeepEqual(added, want[0]) || !reflect.DeepEqual(dropped, want[1]) {
			t.Errorf("Change(%d) = %v, %v, want %v, %v", i, added, dropped, want[0], want[1])
		}
	}
}
