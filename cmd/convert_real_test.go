package cmd

import (
	"context"
	"fmt"
	"image"
	"image/draw"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// PP-OCR's direction classifier stores its weights as Constant nodes: the
// normalizer turns them into initializers, so calibration quantizes every
// Conv per channel. Calibrated on what it reads, text lines (crops of the
// two scans, upright and turned 180°), with an accuracy target, its int8
// variant is built and passes kiln serve on the validation split.
func TestRealPPOCRClsCalibrates(t *testing.T) {
	cls := testutil.NPMModel(t, "ch_ppocr_mobile_v2.0_cls_infer.onnx")
	crops := textLineCrops(t, 60, 20)
	pre := "resize=48x192," + ppocrNorm
	calib, repo := filepath.Join(t.TempDir(), "calib"), filepath.Join(t.TempDir(), "repo")
	if out, errOut, code := run(t, "calibrate", cls, "--data", crops, "--preprocess", pre, "--accuracy-target", "top1=0.98,cosine=0.99",
		"-o", calib, "--progress", "none"); code != 0 {
		t.Fatalf("calibrate cls with an accuracy target = exit %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code := run(t, "convert", cls, "--repo", repo, "--precision", "fp32,int8", "--calib-dir", calib, "--progress", "none")
	if code != 0 || !strings.Contains(out, "built") {
		t.Fatalf("convert cls int8 = exit %d\n%s\n%s", code, out, errOut)
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	var m *manifest.Model
	for _, mm := range man.Models {
		if mm.Variant.Precision == manifest.INT8 {
			m = mm
		}
	}
	if m == nil || m.Calibration == nil || m.Calibration.Target != "top1=0.98,cosine=0.99" || m.Calibration.Int8Share <= 0 {
		t.Fatalf("kiln.json int8 record = %+v, want the target met with some compute int8", m)
	}
	t.Logf("cls int8: target met with %d layers kept in fp32, %.0f%% of compute int8, cosine %.4f, top-1 %.3f",
		len(m.Calibration.KeptFP32), 100*m.Calibration.Int8Share, m.Calibration.Cosine, m.Calibration.Top1Agreement)
	// serve checks it on the validation split the target was measured on
	// (the 80 crops calibration did not see).
	if stdout, errOut, code := run(t, "serve", repo, "--calib-dir", calib, "--perf=false"); code != 0 {
		t.Errorf("serve cls int8 = exit %d\n%s\n%s", code, stdout, errOut)
	}
	// Its Convs are quantized per channel: the Q/DQ model's weight scales
	// are vectors.
	q, err := onnx.Load(filepath.Join(repo, m.Name, "1", "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	perChannel := 0
	for _, n := range q.Graph().GetNode() {
		if n.GetOpType() == "DequantizeLinear" {
			if sc := q.Initializer(n.GetInput()[1]); sc != nil && len(sc.GetDims()) == 1 && sc.GetDims()[0] > 1 {
				perChannel++
			}
		}
	}
	if perChannel == 0 {
		t.Errorf("cls int8 model has no per-channel weight scales")
	}
}

// textLineCrops writes crops shaped like text lines (18-29 pixels high,
// 4-8 times as wide, 8-40%% ink concentrated in their middle band) from
// the two scans, pageN from page.png and textN from text.png, each upright
// and turned 180°: the two classes of PP-OCR's direction classifier.
func textLineCrops(t *testing.T, pageN, textN int) string {
	t.Helper()
	src, dir := testutil.Images(t), t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	n := 0
	for _, c := range []struct {
		name  string
		count int
	}{{"page.png", pageN}, {"text.png", textN}} {
		f, err := os.Open(filepath.Join(src, c.name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		gray := image.NewGray(img.Bounds())
		draw.Draw(gray, gray.Bounds(), img, img.Bounds().Min, draw.Src)
		for made, tries := 0, 0; made < c.count && tries < 100000; tries++ {
			h := 18 + rng.IntN(12)
			w := min(h*(4+rng.IntN(5)), gray.Bounds().Dx())
			r := image.Rect(0, 0, w, h).Add(gray.Bounds().Min).Add(image.Pt(rng.IntN(gray.Bounds().Dx()-w+1), rng.IntN(gray.Bounds().Dy()-h+1)))
			if !lineLike(gray, r) {
				continue
			}
			up, down := image.NewGray(image.Rect(0, 0, w, h)), image.NewGray(image.Rect(0, 0, w, h))
			for y := range h {
				for x := range w {
					v := gray.GrayAt(r.Min.X+x, r.Min.Y+y)
					up.SetGray(x, y, v)
					down.SetGray(w-1-x, h-1-y, v)
				}
			}
			for k, im := range []image.Image{up, down} {
				writePNG(t, filepath.Join(dir, fmt.Sprintf("%03d_%d.png", n, 180*k)), im)
			}
			made, n = made+1, n+1
		}
	}
	return dir
}

// lineLike reports whether r of g holds text: 8-40% dark pixels, most of
// them in the middle half of its height.
func lineLike(g *image.Gray, r image.Rectangle) bool {
	dark, mid := 0, 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if g.GrayAt(x, y).Y < 90 {
				dark++
				if dy := y - r.Min.Y; dy > r.Dy()/4 && dy < 3*r.Dy()/4 {
					mid++
				}
			}
		}
	}
	share := float64(dark) / float64(r.Dx()*r.Dy())
	return share >= 0.08 && share <= 0.4 && float64(mid) >= 0.6*float64(dark)
}

func writePNG(t *testing.T, path string, im image.Image) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, im); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// Silero VAD with its sample rate fixed converts to fp32 and fp16 (the
// scalar sr, which Triton cannot serve, is gone), and on 250 chunks of
// generated vowel-like audio, with the LSTM state carried from chunk to
// chunk, both variants make the fp32 source's speech decisions.
func TestRealSileroFix(t *testing.T) {
	vad := testutil.NPMModel(t, "silero_vad_v5.onnx")
	repo := filepath.Join(t.TempDir(), "repo")
	out, errOut, code := run(t, "convert", vad, "--repo", repo, "--precision", "fp32,fp16", "--fix", "sr=16000",
		"--shape", "input=1x512", "--shape", "state=2x1x128", "--progress", "none")
	if code != 0 || !strings.Contains(out, "fixed input sr to 16000") {
		t.Fatalf("convert silero --fix sr=16000 = exit %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := run(t, "convert", vad, "--repo", filepath.Join(t.TempDir(), "r"), "--precision", "fp32", "--input", "sr=16000",
		"--shape", "input=1x512", "--shape", "state=2x1x128", "--progress", "none"); code == 0 || !strings.Contains(errOut, "--fix sr=") {
		t.Errorf("convert silero without --fix = exit %d (%s), want the scalar error with advice naming --fix sr=", code, errOut)
	}
	want := vadDecisions(t, vad, true)
	for _, v := range []string{"fp32", "fp16"} {
		got := vadDecisions(t, filepath.Join(repo, "silero_vad_v5_onnx_"+v, "1", "model.onnx"), false)
		agree, speech, worst, top := 0, 0, 0.0, float32(0)
		for i := range want {
			if want[i] > 0.5 {
				speech++
			}
			if (want[i] > 0.5) == (got[i] > 0.5) {
				agree++
			}
			worst, top = max(worst, math.Abs(float64(want[i]-got[i]))), max(top, want[i])
		}
		// The decisions are at 0.5; the probabilities themselves must agree
		// too, so that a threshold elsewhere decides the same.
		if agree != len(want) || worst > 0.01 || speech == 0 {
			t.Errorf("%s variant: %d of %d speech decisions match fp32, probabilities differ by up to %.4f", v, agree, len(want), worst)
		}
		t.Logf("%s variant: %d/%d decisions match (%d chunks of speech, fp32 probability up to %.3f), probabilities within %.2g", v, agree, len(want), speech, top, worst)
	}
}

// vadDecisions runs 250 chunks of 512 samples of syntheticSpeech through
// a Silero model with the state carried, and returns the speech
// probability of each chunk.
func vadDecisions(t *testing.T, path string, withSR bool) []float32 {
	t.Helper()
	s, err := ort.NewSession(path, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	audio := syntheticSpeech(250 * 512)
	state, _ := onnx.NewTensor("state", []int64{2, 1, 128}, make([]float32, 256))
	sr, _ := onnx.NewTensor("sr", []int64{}, []int64{16000})
	probs := make([]float32, 250)
	for c := range probs {
		in, _ := onnx.NewTensor("input", []int64{1, 512}, audio[c*512:(c+1)*512])
		feed := map[string]*onnx.Tensor{"input": in, "state": state}
		if withSR {
			feed["sr"] = sr
		}
		out, err := s.Run(context.Background(), feed, nil)
		if err != nil {
			t.Fatal(err)
		}
		probs[c] = out["output"].Data.([]float32)[0]
		state = out["stateN"]
		state.Name = "state"
	}
	return probs
}

// syntheticSpeech is n samples at 16 kHz of a vowel-like sound (a glottal
// pulse train at 120 Hz with vibrato, through resonators at the formants
// of /a/: 700, 1220 and 2600 Hz) in syllables of 4 Hz, 1.1 s of every 2,
// over faint noise: Silero calls about a tenth of its chunks speech.
func syntheticSpeech(n int) []float32 {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]float64, n)
	for i := range src {
		tm := float64(i) / 16000
		if math.Mod(tm*(120+20*math.Sin(2*math.Pi*3*tm)), 1) < 0.1 {
			src[i] = 1
		}
		src[i] += 0.02 * rng.NormFloat64()
	}
	f1, f2, f3 := resonate(src, 700, 80), resonate(src, 1220, 90), resonate(src, 2600, 120)
	out := make([]float32, n)
	for i := range out {
		tm := float64(i) / 16000
		env := 0.0
		if sec := math.Mod(tm, 2); sec > 0.5 && sec < 1.6 {
			env = 0.5 + 0.5*math.Sin(2*math.Pi*4*tm)
		}
		out[i] = float32(env*(f1[i]+0.7*f2[i]+0.4*f3[i])*0.05 + 0.003*rng.NormFloat64())
	}
	return out
}

// resonate filters x through a two-pole resonator at f Hz of bandwidth bw
// (16 kHz sampling).
func resonate(x []float64, f, bw float64) []float64 {
	r := math.Exp(-math.Pi * bw / 16000)
	a1, a2 := 2*r*math.Cos(2*math.Pi*f/16000), -r*r
	y := make([]float64, len(x))
	for i := range x {
		y[i] = x[i]
		if i > 0 {
			y[i] += a1 * y[i-1]
		}
		if i > 1 {
			y[i] += a2 * y[i-2]
		}
	}
	return y
}

// A quantized source gets its int8 variant, and fp32/fp16 requests are
// refused: their labels would be false.
func TestConvertQuantizedSource(t *testing.T) {
	_, calib := servedRepo(t)
	q := filepath.Join(calib, "model.int8.onnx")
	_, errOut, code := run(t, "convert", q, "--repo", filepath.Join(t.TempDir(), "r"), "--precision", "fp32,fp16", "--progress", "none")
	if code != ExitUsage || !strings.Contains(errOut, "already quantized") {
		t.Errorf("convert of an int8 model to fp32,fp16 = exit %d (%s), want a usage error saying it is already quantized", code, errOut)
	}
	repo := filepath.Join(t.TempDir(), "repo")
	if out, errOut, code := run(t, "convert", q, "--repo", repo, "--precision", "int8", "--progress", "none"); code != 0 || !strings.Contains(out, "int8") {
		t.Errorf("convert of an int8 model to int8 = exit %d\n%s\n%s", code, out, errOut)
	}
}

// The corpus's real models convert to fp32 and fp16 and pass kiln serve.
// M-LSD is checked on real images (raw pixels and a constant alpha of 1,
// as its reference code feeds it): its scores output is a local-maximum
// map, Equal(sigmoid, MaxPool(sigmoid)), judged by peak agreement, since
// fp16 rounding that breaks a near-tie moves a peak by a pixel.
func TestRealCorpusModelsConvertAndServe(t *testing.T) {
	for _, name := range []string{"blazeface_front_128", "superres_subpixel", "yolox_nano_3cls", "mlsd_tiny_320"} {
		t.Run(name, func(t *testing.T) {
			src := testutil.Corpus(t, "models", "real", name+".onnx")
			repo := filepath.Join(t.TempDir(), "repo")
			var convertData, serveData []string
			if name == "mlsd_tiny_320" {
				images, pre := testutil.Images(t), "resize=320x320,alpha=1"
				convertData = []string{"--check-data", images, "--check-preprocess", pre, "--check-samples", "0"}
				serveData = []string{"--data", images, "--preprocess", pre}
			}
			args := append([]string{"convert", src, "--repo", repo, "--precision", "fp32,fp16", "--progress", "none"}, convertData...)
			if out, errOut, code := run(t, args...); code != 0 {
				t.Fatalf("convert %s = exit %d\n%s\n%s", name, code, out, errOut)
			}
			if stdout, errOut, code := run(t, append([]string{"serve", repo, "--perf=false"}, serveData...)...); code != 0 {
				t.Errorf("serve %s = exit %d\n%s\n%s", name, code, stdout, errOut)
			}
			if name == "mlsd_tiny_320" {
				scores := checkedOutput(t, repo, "mlsd_tiny_320_onnx_fp16", "scores")
				if scores.Kind != check.KindPeaks || scores.Agreement == nil || *scores.Agreement < 0.98 {
					t.Errorf("mlsd fp16 scores = %+v, want a peak map with agreement >= 0.98", scores)
				}
			}
		})
	}
}

// PP-OCRv4's recognizer (opset 9, Constant weights) converts to fp16 that
// loads in ONNX Runtime at its highest optimization level and matches fp32
// on real images.
func TestRealPPOCRRecFP16(t *testing.T) {
	rec := testutil.NPMModel(t, "ch_PP-OCRv4_rec_infer.onnx")
	repo := filepath.Join(t.TempDir(), "repo")
	out, errOut, code := run(t, "convert", rec, "--repo", repo, "--precision", "fp16", "--check-data", textImages(t),
		"--check-preprocess", "resize=48x320,scale=1/255,mean=0.5:0.5:0.5,std=0.5:0.5:0.5", "--progress", "none")
	if code != 0 {
		t.Fatalf("convert rec fp16 = exit %d\n%s\n%s", code, out, errOut)
	}
	if c := checkedCosine(t, repo, "ch_pp-ocrv4_rec_infer_onnx_fp16"); c < 0.999 {
		t.Errorf("rec fp16: cosine %.6f against fp32, want >= 0.999", c)
	}
}
