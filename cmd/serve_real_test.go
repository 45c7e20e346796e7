package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

// Real models from npm (make models): PP-OCRv4's text detector and
// direction classifier, and Silero VAD v5. Text scans and photographs from
// Debian's python3-skimage are the data.

// PP-OCR's preprocessing: ImageNet mean/std on RGB scaled to [0,1].
const ppocrNorm = "scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225"

// fp16File writes an fp16 rewrite of src with the given op block list, as
// any other tool might have made it, for serve to judge.
func fp16File(t *testing.T, src string, block []string) string {
	t.Helper()
	m, err := onnx.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := fp16.Convert(m, fp16.Options{KeepIOTypes: true, OpBlockList: block})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "fp16.onnx")
	if err := out.Save(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// PP-OCRv4 det with BatchNormalization forced to fp16 (its variances are
// clamped to 65504) is caught by convert's own check and by serve; with
// BatchNormalization kept in fp32 it is built.
func TestRealPPOCRDetFP16(t *testing.T) {
	det := testutil.NPMModel(t, "ch_PP-OCRv4_det_infer.onnx")
	images := textImages(t)
	pre := "resize=640x640," + ppocrNorm
	repo := filepath.Join(t.TempDir(), "repo")
	args := []string{"convert", det, "--repo", repo, "--precision", "fp16", "--check-data", images, "--check-preprocess", pre, "--progress", "none"}
	// --fold-batchnorm=false keeps the BatchNormalization nodes kiln would
	// fold, and a block list of its own turns the data-aware pass off: the
	// fp16 graph another tool would have written.
	out, errOut, code := run(t, append(args, "--fold-batchnorm=false", "--fp16-block-ops", "NonMaxSuppression")...)
	if code != ExitCheck || !strings.Contains(out, "cosine") || !strings.Contains(out, "sigmoid_0.tmp_0") {
		t.Fatalf("convert of det fp16 with BatchNormalization in fp16 = exit %d\n%s\n%s\nwant exit %d naming the output and its cosine", code, out, errOut, ExitCheck)
	}
	if _, err := os.Stat(filepath.Join(repo, "ch_pp-ocrv4_det_infer_onnx_fp16")); err == nil {
		t.Error("the failed variant was written into the repository")
	}
	if out, errOut, code := run(t, append(args, "--fold-batchnorm=false", "--fp16-block-ops", "NonMaxSuppression,BatchNormalization")...); code != 0 {
		t.Fatalf("convert of det fp16 with BatchNormalization in fp32 = exit %d\n%s\n%s", code, out, errOut)
	}
	// By default kiln folds BatchNormalization and its data-aware pass keeps
	// what leaves fp16's range in fp32: no block list needed.
	repo2 := filepath.Join(t.TempDir(), "repo")
	args[3] = repo2
	if out, errOut, code := run(t, args...); code != 0 {
		t.Fatalf("convert of det fp16 with kiln's defaults = exit %d\n%s\n%s", code, out, errOut)
	}
	if c := checkedCosine(t, repo2, "ch_pp-ocrv4_det_infer_onnx_fp16"); c < 0.999 {
		t.Errorf("det fp16 with kiln's defaults: cosine %.5f against fp32, want >= 0.999", c)
	}

	bad := fp16File(t, det, []string{"NonMaxSuppression"})
	rep := t.TempDir()
	stdout, errOut, code := run(t, "serve", bad, "--reference", det, "--precision", "fp16", "--data", images, "--preprocess", pre, "--perf=false", "-o", rep)
	if code != ExitCheck {
		t.Fatalf("serve of the broken det fp16 = exit %d\n%s\n%s", code, stdout, errOut)
	}
	r := readServeReport(t, rep)
	if len(r.Models) != 1 || len(r.Models[0].Outputs) != 1 || r.Models[0].Outputs[0].Cosine > 0.9 {
		t.Fatalf("serve report = %+v, want one model whose output's cosine is far below fp16's 0.999", r.Models)
	}
	t.Logf("det fp16 with BatchNormalization in fp16: cosine %.4f against fp32", r.Models[0].Outputs[0].Cosine)
}

// checkedCosine is the cosine convert's check recorded in kiln.json for a
// model's first output.
func checkedCosine(t *testing.T, repo, model string) float64 {
	t.Helper()
	m, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := check.ReadRecord(m.Model(model).Checks)
	if err != nil || rec == nil || len(rec.Outputs) == 0 {
		t.Fatalf("kiln.json check record of %s = %+v, %v", model, rec, err)
	}
	return rec.Outputs[0].Cosine
}

// checkedOutput is the metrics convert recorded for one output of model.
func checkedOutput(t *testing.T, repo, model, output string) check.Metrics {
	t.Helper()
	m, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := check.ReadRecord(m.Model(model).Checks)
	if err != nil || rec == nil {
		t.Fatalf("kiln.json check record of %s = %+v, %v", model, rec, err)
	}
	for _, o := range rec.Outputs {
		if o.Output == output {
			return o
		}
	}
	t.Fatalf("kiln.json check record of %s has no output %q", model, output)
	return check.Metrics{}
}

// textImages is a directory holding the two scans of printed text of
// python3-skimage (page.png, text.png): what a text detector is for.
func textImages(t *testing.T) string {
	t.Helper()
	src, dir := testutil.Images(t), t.TempDir()
	for _, name := range []string{"page.png", "text.png"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// PP-OCR's direction classifier passes fp16 through convert and serve.
func TestRealPPOCRClsFP16(t *testing.T) {
	cls := testutil.NPMModel(t, "ch_ppocr_mobile_v2.0_cls_infer.onnx")
	images := testutil.Images(t)
	pre := "resize=48x192," + ppocrNorm
	repo := filepath.Join(t.TempDir(), "repo")
	if out, errOut, code := run(t, "convert", cls, "--repo", repo, "--precision", "fp32,fp16", "--check-data", images, "--check-preprocess", pre, "--progress", "none"); code != 0 {
		t.Fatalf("convert of cls = exit %d\n%s\n%s", code, out, errOut)
	}
	rep := t.TempDir()
	stdout, errOut, code := run(t, "serve", repo, "--data", images, "--preprocess", pre, "--window", "50ms", "--concurrency", "1", "-o", rep)
	if code != 0 {
		t.Fatalf("serve of cls = exit %d\n%s\n%s", code, stdout, errOut)
	}
	for _, m := range readServeReport(t, rep).Models {
		if m.Verdict != "pass" || len(m.Outputs) != 1 || m.Outputs[0].Cosine < 0.999 {
			t.Errorf("cls model %s = %s %+v, want pass with cosine >= 0.999", m.Name, m.Verdict, m.Outputs)
		}
	}
}

// Silero VAD takes a chunk of audio, its LSTM state and the sample rate (an
// int64 scalar that selects a branch of an If); serve feeds them by name.
func TestRealSileroByName(t *testing.T) {
	vad := testutil.NPMModel(t, "silero_vad_v5.onnx")
	half := fp16File(t, vad, nil)
	rep := t.TempDir()
	args := []string{"serve", half, "--reference", vad, "--precision", "fp16", "--input", "sr=16000", "--shape", "input=1x512", "--shape", "state=2x1x128",
		"--window", "50ms", "--concurrency", "1", "-o", rep}
	stdout, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("serve of Silero fp16 = exit %d\n%s\n%s", code, stdout, errOut)
	}
	r := readServeReport(t, rep)
	if r.Data.Kind != "inputs" || len(r.Models) != 1 || len(r.Models[0].Outputs) != 2 || r.Models[0].Perf == nil {
		t.Fatalf("Silero report = data %s, models %+v; want inputs given by name, both outputs compared, timed", r.Data.Kind, r.Models)
	}
	// Without sr the model cannot be fed: the error names the input.
	if _, errOut, code := run(t, "serve", half, "--reference", vad, "--shape", "input=1x512", "--perf=false"); code == 0 || !strings.Contains(errOut, `"state"`) {
		t.Errorf("serve of Silero without its shapes = exit %d (%s), want an error naming input \"state\"", code, errOut)
	}
}
