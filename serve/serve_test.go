package serve

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/internal/trtexec/trtexectest"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/serve/report"
)

// testRepo writes a repository with the tinynet model as an fp32 ONNX
// model and, when plan is set, a TensorRT plan of the same source (the
// double's dummy engine), with a kiln.json that records both.
func testRepo(t testing.TB, plan bool) (dir, src string) {
	t.Helper()
	return testRepoOf(t, testmodels.TinyNet(1), plan)
}

// testRepoOf is testRepo for another model, named tinynet all the same.
func testRepoOf(t testing.TB, model *onnxpb.ModelProto, plan bool) (dir, src string) {
	t.Helper()
	ortest.Init(t)
	dir = t.TempDir()
	src = filepath.Join(t.TempDir(), "tinynet.onnx")
	m := &onnx.Model{Proto: model}
	if err := m.Save(src); err != nil {
		t.Fatal(err)
	}
	sig, err := pbtxt.SignatureFromONNX(m)
	if err != nil {
		t.Fatal(err)
	}
	digest, _, err := manifest.DigestFile(src)
	if err != nil {
		t.Fatal(err)
	}
	man := manifest.New("kiln test")
	add := func(v manifest.Variant, platform, path string) {
		name := v.ModelName("tinynet")
		cfg, err := pbtxt.Generate(sig, pbtxt.GenerateOptions{Name: name, Platform: platform, MaxBatchSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := pbtxt.WriteModel(dir, pbtxt.WriteSpec{Config: cfg, ModelPath: path}); err != nil {
			t.Fatal(err)
		}
		man.Put(&manifest.Model{Name: name, Variant: v, Source: digest, Version: 1, Files: []manifest.File{}, Status: manifest.StatusOK,
			Inputs: pbtxt.ManifestTensors(sig.Inputs), Outputs: pbtxt.ManifestTensors(sig.Outputs)})
	}
	add(manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: manifest.FP32, MaxBatch: 4}, pbtxt.PlatformONNX, src)
	if plan {
		p := filepath.Join(t.TempDir(), "model.plan")
		if err := os.WriteFile(p, []byte(trtexectest.PlanContent), 0o644); err != nil {
			t.Fatal(err)
		}
		add(manifest.Variant{Runtime: manifest.RuntimeTRT, Precision: manifest.FP16, MaxBatch: 4}, pbtxt.PlatformTensorRT, p)
	}
	data, err := man.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, src
}

func verdicts(rep *report.Report) map[string]report.Verdict {
	out := map[string]report.Verdict{}
	for _, m := range rep.Models {
		out[m.Name] = m.Verdict
	}
	return out
}

// Without trtexec a plan is "not checked", never passed, and the report
// says why; the ONNX model is still checked.
func TestPlanWithoutTrtexecIsNotChecked(t *testing.T) {
	dir, _ := testRepo(t, true)
	rep, err := Run(context.Background(), Config{Repository: dir, Perf: PerfConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	got := verdicts(rep)
	if got["tinynet_onnx_fp32_b4"] != report.Pass || got["tinynet_trt_fp16_b4"] != report.NotChecked {
		t.Fatalf("verdicts = %v, want the ONNX model passed and the plan not checked", got)
	}
	for _, m := range rep.Models {
		if m.Name == "tinynet_trt_fp16_b4" && !strings.Contains(m.Reason, "needs GPU/TensorRT") {
			t.Errorf("plan reason = %q, want it to say it needs GPU/TensorRT", m.Reason)
		}
	}
	if rep.Verdict != report.NotChecked || rep.ExitCode() != 4 {
		t.Errorf("report verdict %s exit %d, want not-checked and 4", rep.Verdict, rep.ExitCode())
	}
}

// Through the trtexec test double (which replays the corpus's real
// --loadEngine log and returns the outputs this test gives it), a plan whose
// outputs match the reference passes and one whose outputs are off fails;
// its timing comes from the replayed log's performance summary.
func TestPlanThroughTrtexecDouble(t *testing.T) {
	dir, src := testRepo(t, true)
	cfg := Config{Repository: dir, Feed: check.FeedSpec{Samples: 1, Seed: 3}, Perf: PerfConfig{Batches: []int{1}, Concurrency: []int{1}, Window: 20 * time.Millisecond}}
	// The reference's outputs on the one random feed the check will use.
	want := referenceOutputs(t, src, cfg.Feed)
	for _, tc := range []struct {
		name    string
		reverse bool
		want    report.Verdict
	}{{"same outputs", false, report.Pass}, {"outputs off", true, report.Fail}} {
		t.Run(tc.name, func(t *testing.T) {
			outputs := exportOutputs(t, want, tc.reverse)
			exe, _ := trtexectest.Double{Log: "trt10.16_result-06.log", Outputs: outputs}.Install(t)
			rep, err := Run(context.Background(), cfg, WithRuntime(pbtxt.PlatformTensorRT, Trtexec{Tool: &trtexec.Tool{Path: exe}}))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range rep.Models {
				if m.Platform != pbtxt.PlatformTensorRT {
					continue
				}
				if m.Verdict != tc.want {
					t.Fatalf("plan verdict = %s (%s) %+v, want %s", m.Verdict, m.Reason, m.Failures, tc.want)
				}
				if m.Perf == nil || len(m.Perf.Points) != 1 || m.Perf.Points[0].LatencyP50US <= 0 {
					t.Errorf("plan perf = %+v, want one point from trtexec's summary", m.Perf)
				}
			}
		})
	}
}

// referenceOutputs runs the source on the feeds spec gives.
func referenceOutputs(t *testing.T, src string, spec check.FeedSpec) map[string]*onnx.Tensor {
	t.Helper()
	s, err := ort.NewSession(src, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	spec.Inputs = ort.ValueInfos(s.Inputs())
	feeds, _, err := check.Feeds(context.Background(), spec)
	if err != nil || len(feeds) != 1 {
		t.Fatalf("Feeds = %d feeds, %v; want 1", len(feeds), err)
	}
	out, err := s.Run(context.Background(), feeds[0].Tensors, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// exportOutputs writes outs in trtexec's --exportOutput layout, each
// output's values in reverse order when reverse is set.
func exportOutputs(t *testing.T, outs map[string]*onnx.Tensor, reverse bool) string {
	t.Helper()
	var list []trtexec.ExportedOutput
	for _, tn := range outs {
		d := append([]float32(nil), tn.Data.([]float32)...)
		if reverse {
			slices.Reverse(d)
		}
		e, err := trtexec.ExportedOutputFrom(&onnx.Tensor{Name: tn.Name, Type: tn.Type, Dims: tn.Dims, Data: d})
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, e)
	}
	p := filepath.Join(t.TempDir(), "outputs.json")
	if err := os.WriteFile(p, trtexec.FormatExportOutput(list), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
