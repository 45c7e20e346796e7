package calibrate

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// initORT loads the library `make deps` provides; without it the test
// fails, because `make test` runs `make deps` first.
func initORT(t testing.TB) { ortest.Init(t) }

// writeModel saves p under dir and returns the path.
func writeModel(t testing.TB, dir, name string, p *onnxpb.ModelProto) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := (&onnx.Model{Proto: p}).Save(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// pattern draws a deterministic smooth image: a few random plane waves and
// a gradient per channel, like out-of-focus natural images.
func pattern(rng *rand.Rand, w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	type wave struct{ fx, fy, ph, amp float64 }
	var waves [3][3]wave
	var base, gx, gy [3]float64
	for c := range 3 {
		base[c] = 60 + 130*rng.Float64()
		gx[c], gy[c] = 60*(rng.Float64()-0.5), 60*(rng.Float64()-0.5)
		for k := range 3 {
			waves[c][k] = wave{fx: 6 * rng.Float64(), fy: 6 * rng.Float64(), ph: 2 * math.Pi * rng.Float64(), amp: 15 + 40*rng.Float64()}
		}
	}
	for y := range h {
		for x := range w {
			u, v := float64(x)/float64(w), float64(y)/float64(h)
			var px [3]uint8
			for c := range 3 {
				val := base[c] + gx[c]*(u-0.5) + gy[c]*(v-0.5)
				for _, wv := range waves[c] {
					val += wv.amp * math.Sin(2*math.Pi*(wv.fx*u+wv.fy*v)+wv.ph)
				}
				px[c] = uint8(max(0, min(255, math.Round(val))))
			}
			img.Set(x, y, color.RGBA{px[0], px[1], px[2], 255})
		}
	}
	return img
}

// writeImages writes n PNG images of size w×h named img-000.png... into dir.
func writeImages(t testing.TB, dir string, n, w, h int, seed uint64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range n {
		f, err := os.Create(filepath.Join(dir, "img-"+pad3(i)+".png"))
		if err != nil {
			t.Fatal(err)
		}
		if err := png.Encode(f, pattern(rng, w, h)); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

func pad3(i int) string {
	s := "000" + itoa(i)
	return s[len(s)-3:]
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// writeNpy writes n samples of shape dims (without the batch dimension) as
// one stacked .npy file of smooth values in [-1, 1], and returns its path.
func writeNpy(t testing.TB, dir, input string, n int, dims []int64, seed uint64) string {
	t.Helper()
	per := 1
	for _, d := range dims {
		per *= int(d)
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	data := make([]float32, n*per)
	for s := range n {
		a, b, c := rng.Float64()*4, rng.Float64()*2*math.Pi, rng.Float64()
		for i := range per {
			data[s*per+i] = float32(0.8*math.Sin(a*float64(i)/float64(per)*6+b) + 0.2*(2*c-1))
		}
	}
	tn, err := onnx.NewTensor(input, append([]int64{int64(n)}, dims...), data)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, input+".npy")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dataset.WriteNpy(f, tn); err != nil {
		t.Fatal(err)
	}
	return path
}
