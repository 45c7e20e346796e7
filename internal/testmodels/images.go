package testmodels

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// WriteImages writes n deterministic w×h PNG images to dir, named
// img_0000.png, ...: smooth colour gradients with a few soft blobs, varied
// enough to calibrate and check small image models without shipping photos.
func WriteImages(dir string, n, w, h int, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	for i := 0; i < n; i++ {
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		var base, grad [3]float64
		for c := range base {
			base[c] = rng.Float64() * 255
			grad[c] = (rng.Float64() - 0.5) * 255
		}
		type blob struct {
			x, y, r float64
			col     [3]float64
		}
		blobs := make([]blob, 1+rng.IntN(3))
		for j := range blobs {
			blobs[j] = blob{rng.Float64() * float64(w), rng.Float64() * float64(h), 2 + rng.Float64()*float64(w)/3,
				[3]float64{rng.Float64() * 255, rng.Float64() * 255, rng.Float64() * 255}}
		}
		angle := rng.Float64() * 2 * math.Pi
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				t := (math.Cos(angle)*float64(x)/float64(w) + math.Sin(angle)*float64(y)/float64(h)) / 2
				var px [3]float64
				for c := range px {
					px[c] = base[c] + grad[c]*t
				}
				for _, b := range blobs {
					d := math.Hypot(float64(x)-b.x, float64(y)-b.y) / b.r
					a := math.Exp(-d * d)
					for c := range px {
						px[c] = px[c]*(1-a) + b.col[c]*a
					}
				}
				img.Set(x, y, color.RGBA{clamp8(px[0]), clamp8(px[1]), clamp8(px[2]), 255})
			}
		}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("img_%04d.png", i)))
		if err != nil {
			return err
		}
		if err := png.Encode(f, img); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

func clamp8(v float64) uint8 {
	return uint8(math.Max(0, math.Min(255, math.Round(v))))
}
