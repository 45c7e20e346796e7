package cmd

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// kwsWords are the DS-CNN's ten keywords, in the order of its first ten
// outputs (then _silence_ and _unknown_).
var kwsWords = []string{"down", "go", "left", "no", "off", "on", "right", "stop", "up", "yes"}

// speechFeatures speaks every keyword in each voice with espeak-ng, the
// only speech this machine can make (the corpus holds no audio), makes
// each clip look recorded (recording) and writes its MFCC features as
// DIR/VOICE_WORD.npy [49,10,1]. It returns the directory and each file's
// keyword index.
func speechFeatures(t *testing.T, espeak string, voices []string) (string, map[string]int) {
	t.Helper()
	dir, wavs := t.TempDir(), t.TempDir()
	labels := map[string]int{}
	for _, v := range voices {
		for i, w := range kwsWords {
			wav := filepath.Join(wavs, v+"_"+w+".wav")
			if out, err := exec.Command(espeak, "-v", v, "-w", wav, w).CombinedOutput(); err != nil {
				t.Fatalf("espeak-ng -v %s %s: %v\n%s", v, w, err, out)
			}
			x, rate, err := readWAV(wav)
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Join(dir, v+"_"+w+".npy")
			f, err := os.Create(name)
			if err != nil {
				t.Fatal(err)
			}
			err = dataset.WriteNpy(f, &onnx.Tensor{Type: onnx.Float, Dims: []int64{kwsFrames, kwsMFCC, 1}, Data: mfccFeatures(recording(resample(x, rate, kwsRate), uint64(len(labels))))})
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			labels[filepath.Base(name)] = i
		}
	}
	return dir, labels
}

// kwsAccuracy runs the fp32 import on every feature file and counts the
// clips it classifies as their keyword: evidence that the features are
// computed as the model expects (random features give 1 in 12).
func kwsAccuracy(t *testing.T, model, dir string, labels map[string]int) (int, int) {
	t.Helper()
	ortest.Init(t)
	s, err := ort.NewSession(model, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	right := 0
	for name, want := range labels {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		x, err := dataset.ReadNpy(f, "input_1")
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		x.Dims = append([]int64{1}, x.Dims...)
		out, err := s.Run(context.Background(), map[string]*onnx.Tensor{"input_1": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := out["dense"].Data.([]float32)
		if slices.Index(p, slices.Max(p)) == want {
			right++
		}
	}
	return right, len(labels)
}

// The keyword-spotting DS-CNN's int8 variant, calibrated on MFCC features
// of spoken keywords, passes kiln serve against its own fp32 import on
// features of other voices (real-looking data, so int8 is judged).
func TestKWSInt8OnSpeech(t *testing.T) {
	if testing.Short() {
		t.Skip("calibrates and serves a real model")
	}
	src := testutil.Corpus(t, "savedmodel", "real", "mlperf-tiny-kws-dscnn")
	espeak, err := exec.LookPath("espeak-ng")
	if err != nil {
		t.Skip("espeak-ng is not installed (apt-get install espeak-ng): it speaks the keywords this test computes the model's MFCC input from")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	calib, calibLabels := speechFeatures(t, espeak, []string{"en-us", "en-gb", "en-gb-scotland", "en-029", "en-us+f2", "en-gb+f4", "en-gb-x-rp", "en-us+m5"})
	val, valLabels := speechFeatures(t, espeak, []string{"en-gb-x-gbclan", "en-us+f5", "en-gb-x-gbcwmd+m3", "en-029+f3"})

	fp32 := filepath.Join(t.TempDir(), "kws.onnx")
	if _, stderr, code := run(t, "import", src, "-o", fp32); code != 0 {
		t.Fatalf("import = exit %d: %s", code, stderr)
	}
	right, n := kwsAccuracy(t, fp32, val, valLabels)
	rc, nc := kwsAccuracy(t, fp32, calib, calibLabels)
	t.Logf("fp32 import: %d/%d validation clips and %d/%d calibration clips classified as their keyword", right, n, rc, nc)
	if right*3 < n { // chance is 1 in 12
		t.Errorf("the fp32 model recognizes %d of %d spoken keywords: the features are not the input it was trained on", right, n)
	}

	// Every one of the 80 calibration clips calibrates (--validation -1):
	// convert's --calib-data would keep half of them for validation, and
	// 40 clips give ranges that miss worst_cosine 0.95 on other voices
	// (0.87). The other voices judge the variants instead.
	ranges := filepath.Join(t.TempDir(), "calib")
	if stdout, stderr, code := run(t, "calibrate", src, "--data", calib, "--validation", "-1", "-o", ranges, "--progress", "none"); code != 0 {
		t.Fatalf("calibrate = exit %d\n%s\n%s", code, stdout, stderr)
	}
	repo := filepath.Join(t.TempDir(), "repo")
	stdout, stderr, code := run(t, "convert", src, "--repo", repo, "--precision", "fp32,fp16,int8", "--calib-dir", ranges, "--check-data", val, "--progress", "none")
	if code != 0 {
		t.Fatalf("convert fp32,fp16,int8 = exit %d\n%s\n%s", code, stdout, stderr)
	}
	stdout, stderr, code = run(t, "serve", repo, "--data", val, "--samples", "40", "--perf=false", "--format", "json")
	if code != 0 {
		t.Fatalf("serve --data (speech features) = exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep serveReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("serve --format json: %v\n%s", err, stdout)
	}
	judged := 0
	for _, m := range rep.Models {
		for _, o := range m.Outputs {
			t.Logf("%s: %s; %s on %d samples: cosine %.6f, worst cosine %.6f, top-1 agreement %.4f, max abs %.3g",
				m.Name, m.Verdict, o.Output, o.Samples, o.Cosine, o.WorstCosine, o.Top1, o.MaxAbs)
		}
		if m.Verdict != "pass" {
			t.Errorf("%s: verdict %s, want pass", m.Name, m.Verdict)
		}
		if m.Name == "mlperf-tiny-kws-dscnn_onnx_int8" {
			judged++
		}
	}
	if judged != 1 {
		t.Errorf("serve reported no int8 model (models %d)", len(rep.Models))
	}
}
