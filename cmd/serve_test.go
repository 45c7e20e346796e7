package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/x448/float16"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

// servedRepo converts the testdata model into fp32, fp16 and int8 ONNX
// variants calibrated on samples, and returns the repository and the
// calibration directory.
func servedRepo(t *testing.T) (repo, calib string) {
	t.Helper()
	t.Setenv("PATH", t.TempDir()) // no trtexec, even on a GPU machine
	dir := t.TempDir()
	npy := writeSamples(t, dir, 48)
	calib, repo = filepath.Join(dir, "calib"), filepath.Join(dir, "repo")
	if _, errOut, code := run(t, "calibrate", tinynetPath, "--data", npy, "-o", calib, "--progress", "none"); code != 0 {
		t.Fatalf("calibrate = exit %d: %s", code, errOut)
	}
	if _, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "--precision", "fp32,fp16,int8", "--calib-dir", calib, "--progress", "none"); code != 0 {
		t.Fatalf("convert = exit %d: %s", code, errOut)
	}
	return repo, calib
}

// serveReport is the part of report.json the tests read.
type serveReport struct {
	Verdict string
	Data    struct{ Kind string }
	Models  []struct {
		Name, Verdict, Reason string
		Outputs               []struct {
			Output, Kind string
			Samples      int
			Cosine       float64
			WorstCosine  float64 `json:"worst_cosine"`
			Top1         float64 `json:"top1_agreement"`
			MaxAbs       float64 `json:"max_abs_error"`
		}
		Failures []struct {
			Output, Metric, Sample string
			Value, Threshold       float64
		}
		Perf *struct {
			Points []struct{ Concurrency, Batch, Requests int }
		}
	}
}

func readServeReport(t *testing.T, dir string) serveReport {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r serveReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestServeRepositoryPassesThenCatchesPerturbedWeights(t *testing.T) {
	repo, calib := servedRepo(t)
	out := t.TempDir()
	stdout, errOut, code := run(t, "serve", repo, "--calib-dir", calib, "--window", "50ms", "--concurrency", "1,2", "-o", out)
	if code != 0 {
		t.Fatalf("serve of a fresh repository = exit %d\n%s\n%s", code, stdout, errOut)
	}
	r := readServeReport(t, out)
	if r.Verdict != "pass" || r.Data.Kind != "validation-split" || len(r.Models) != 3 {
		t.Fatalf("report = verdict %s, data %s, %d models; want pass on the validation split, 3 models", r.Verdict, r.Data.Kind, len(r.Models))
	}
	for _, m := range r.Models {
		// Concurrency 1 and 2 at batch 1 and at the config's max_batch_size (Triton's default, 4).
		if m.Verdict != "pass" || m.Perf == nil || len(m.Perf.Points) != 4 || m.Perf.Points[0].Requests == 0 || m.Perf.Points[3].Batch != 4 {
			t.Errorf("model %s = %s (%s), perf %+v; want pass with 4 timed points", m.Name, m.Verdict, m.Reason, m.Perf)
		}
	}
	for _, f := range []string{"report.md", "report.html", "tinynet_onnx_fp16.b1.perf.csv", "tinynet_onnx_fp16.b4.perf.csv"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("serve -o wrote no %s: %v", f, err)
		}
	}
	m, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := check.ReadRecord(m.Model("tinynet_onnx_fp16").Checks)
	if err != nil || rec == nil || rec.By != "serve" || rec.Verdict != check.VerdictPass || rec.Data.Kind != check.DataValidation {
		t.Errorf("kiln.json checks of the fp16 variant = %+v, %v; want serve's pass on the validation split", rec, err)
	}

	// Negate the fp16 variant's classifier weights: its outputs are no
	// longer the model's, and serve must say so.
	perturb(t, filepath.Join(repo, "tinynet_onnx_fp16", "1", "model.onnx"), "fc.weight")
	out2 := t.TempDir()
	stdout, errOut, code = run(t, "serve", repo, "--calib-dir", calib, "--perf=false", "-o", out2)
	if code != ExitCheck {
		t.Fatalf("serve with perturbed weights = exit %d, want %d\n%s\n%s", code, ExitCheck, stdout, errOut)
	}
	r = readServeReport(t, out2)
	var failed bool
	for _, m := range r.Models {
		if m.Name != "tinynet_onnx_fp16" {
			if m.Verdict != "pass" {
				t.Errorf("untouched model %s = %s", m.Name, m.Verdict)
			}
			continue
		}
		for _, f := range m.Failures {
			failed = failed || (m.Verdict == "fail" && f.Output == "probs" && f.Metric == "worst_cosine" && f.Sample != "" && f.Value < 0.5)
		}
		if !failed {
			t.Errorf("perturbed model = %s %+v, want fail naming output probs, a metric and the worst sample", m.Verdict, m.Failures)
		}
	}
	if !failed || !strings.Contains(stdout, "tinynet_onnx_fp16") || !strings.Contains(stdout, "probs") {
		t.Errorf("serve's summary does not name the failing model and output:\n%s", stdout)
	}
}

// perturb negates the initializer name of the model at path, in place.
func perturb(t *testing.T, path, name string) {
	t.Helper()
	m, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, init := range m.Graph().Initializer {
		if init.GetName() != name {
			continue
		}
		tn, err := onnx.Decode(init)
		if err != nil {
			t.Fatal(err)
		}
		switch d := tn.Data.(type) {
		case []float32:
			for j := range d {
				d[j] = -d[j]
			}
		case []float16.Float16:
			for j := range d {
				d[j] = float16.Fromfloat32(-d[j].Float32())
			}
		default:
			t.Fatalf("initializer %s holds %T", name, tn.Data)
		}
		p, err := onnx.Encode(tn, onnx.Raw)
		if err != nil {
			t.Fatal(err)
		}
		m.Graph().Initializer[i] = p
		if err := m.Save(path); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s has no initializer %s", path, name)
}

func TestServeModelFileAgainstReference(t *testing.T) {
	repo, _ := servedRepo(t)
	fp16 := filepath.Join(repo, "tinynet_onnx_fp16", "1", "model.onnx")
	stdout, errOut, code := run(t, "serve", fp16, "--reference", tinynetPath, "--precision", "fp16", "--perf=false", "--format", "json")
	if code != 0 {
		t.Fatalf("serve MODEL --reference = exit %d\n%s\n%s", code, stdout, errOut)
	}
	if !strings.Contains(stdout, `"verdict": "pass"`) {
		t.Errorf("serve MODEL --reference --format json = %s, want a passing report", stdout)
	}
	// Random data cannot judge int8.
	int8 := filepath.Join(repo, "tinynet_onnx_int8", "1", "model.onnx")
	if _, _, code := run(t, "serve", int8, "--reference", tinynetPath, "--precision", "int8", "--perf=false"); code != ExitPartial {
		t.Errorf("serve of an int8 model on random data = exit %d, want %d (not judged)", code, ExitPartial)
	}
	if _, errOut, code := run(t, "serve", fp16, "--perf=false"); code != ExitUsage || !strings.Contains(errOut, "--reference") {
		t.Errorf("serve MODEL without --reference = exit %d (%s), want a usage error naming --reference", code, errOut)
	}
}

// kiln serve --listen serves the repository until its context ends, and
// kiln serve --triton checks the repository through it; SIGTERM (the
// context's end) shuts the endpoint down cleanly with exit 0.
func TestServeListenAndTritonFlag(t *testing.T) {
	repo, calib := servedRepo(t)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"serve", repo, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, pw, &errb)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var urls []string
	for len(urls) < 2 && sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "serving on "); ok {
			urls = append(urls, u)
		}
	}
	go io.Copy(io.Discard, pr)
	if len(urls) != 2 {
		cancel()
		t.Fatalf("serve --listen printed %v (stderr %s), want the endpoint's and the metrics' addresses", urls, errb.String())
	}
	stdout, errOut, code := run(t, "serve", repo, "--triton", urls[0], "--calib-dir", calib, "--perf=false", "--format", "json")
	if code != 0 || !strings.Contains(stdout, `"device": "triton `+urls[0]) {
		t.Errorf("serve --triton %s = exit %d\n%s\n%s", urls[0], code, stdout, errOut)
	}
	resp, err := http.Get(urls[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `nv_inference_request_success{model="tinynet_onnx_int8",version="1"}`) {
		t.Errorf("metrics endpoint after the checks:\n%.2000s\nwant per-model success counts", body)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve --listen after SIGTERM = exit %d (%s), want 0", code, errb.String())
	}
}
