package dataset

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	_ "image/gif" // registered for image.Decode
	_ "image/jpeg"
	_ "image/png"
	"math"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// rgb is an image as interleaved float32 R, G, B values in 0..255.
type rgb struct {
	w, h int
	pix  []float32
}

// maxPixels bounds the images decodeRGB accepts, so a small file claiming
// huge dimensions cannot exhaust memory.
const maxPixels = 1 << 26

// decodeRGB decodes a JPEG, PNG or GIF and converts it to RGB: gray, CMYK
// and paletted images are expanded, alpha is dropped (not blended).
func decodeRGB(data []byte) (*rgb, error) {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("decoding image: %w", err)
	}
	if int64(cfg.Width)*int64(cfg.Height) > maxPixels {
		return nil, fmt.Errorf("image is %dx%d, more than %d pixels", cfg.Width, cfg.Height, maxPixels)
	}
	img, format, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("decoding image: %w", err)
	}
	b := img.Bounds()
	out := &rgb{w: b.Dx(), h: b.Dy(), pix: make([]float32, 3*b.Dx()*b.Dy())}
	if out.w == 0 || out.h == 0 {
		return nil, fmt.Errorf("decoding %s image: it is empty", format)
	}
	i := 0
	put := func(r, g, bl uint8) {
		out.pix[i], out.pix[i+1], out.pix[i+2] = float32(r), float32(g), float32(bl)
		i += 3
	}
	switch m := img.(type) {
	case *image.YCbCr:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				yi, ci := m.YOffset(x, y), m.COffset(x, y)
				put(color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci]))
			}
		}
	case *image.Gray:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				v := m.Pix[m.PixOffset(x, y)]
				put(v, v, v)
			}
		}
	case *image.NRGBA:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				o := m.PixOffset(x, y)
				put(m.Pix[o], m.Pix[o+1], m.Pix[o+2])
			}
		}
	default:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				c := color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
				put(c.R, c.G, c.B)
			}
		}
	}
	return out, nil
}

// resize scales the image bilinearly to w×h with half-pixel centers
// (OpenCV's INTER_LINEAR, PyTorch's align_corners=False). There is no
// antialiasing filter: downscaling by more than 2x samples only the nearest
// four pixels, unlike PIL and torchvision's antialiased resize, so values
// differ slightly from those libraries on strong downscaling.
func (m *rgb) resize(w, h int) *rgb {
	if w == m.w && h == m.h {
		return m
	}
	out := &rgb{w: w, h: h, pix: make([]float32, 3*w*h)}
	type tap struct {
		i0, i1 int
		f      float32
	}
	taps := func(out, in int) []tap {
		t := make([]tap, out)
		scale := float64(in) / float64(out)
		for i := range t {
			s := (float64(i)+0.5)*scale - 0.5
			s = math.Max(0, math.Min(s, float64(in-1)))
			i0 := int(s)
			t[i] = tap{i0, min(i0+1, in-1), float32(s - float64(i0))}
		}
		return t
	}
	xs, ys := taps(w, m.w), taps(h, m.h)
	for y, ty := range ys {
		r0, r1 := m.pix[3*ty.i0*m.w:], m.pix[3*ty.i1*m.w:]
		for x, tx := range xs {
			o := 3 * (y*w + x)
			for c := 0; c < 3; c++ {
				a := r0[3*tx.i0+c] + (r0[3*tx.i1+c]-r0[3*tx.i0+c])*tx.f
				b := r1[3*tx.i0+c] + (r1[3*tx.i1+c]-r1[3*tx.i0+c])*tx.f
				out.pix[o+c] = a + (b-a)*ty.f
			}
		}
	}
	return out
}

// Apply decodes an encoded image (JPEG, PNG, GIF) and turns it into a tensor
// named name, following p. Unset fields take their defaults; call Infer
// first to take them from the model.
func (p Preprocess) Apply(data []byte, name string) (*onnx.Tensor, error) {
	m, err := decodeRGB(data)
	if err != nil {
		return nil, err
	}
	switch {
	case p.ResizeShorter > 0:
		s := p.ResizeShorter
		// torchvision: the longer side is int(size * long / short).
		if m.w <= m.h {
			m = m.resize(s, int(int64(s)*int64(m.h)/int64(m.w)))
		} else {
			m = m.resize(int(int64(s)*int64(m.w)/int64(m.h)), s)
		}
	case p.Resize != [2]int{}:
		m = m.resize(p.Resize[1], p.Resize[0])
	}
	ch, cw := m.h, m.w
	if p.Crop != [2]int{} {
		ch, cw = p.Crop[0], p.Crop[1]
	}
	if ch > m.h || cw > m.w {
		return nil, fmt.Errorf("image is %dx%d (HxW) after resizing, smaller than the %dx%d crop", m.h, m.w, ch, cw)
	}
	// torchvision's center crop rounds half to even.
	top := int(math.RoundToEven(float64(m.h-ch) / 2))
	left := int(math.RoundToEven(float64(m.w-cw) / 2))

	scale := p.Scale
	if scale == 0 {
		scale = 1
	}
	var mul, add [4]float32 // v*mul + add == (v*scale - mean) / std
	for c := range 3 {
		std := p.Std[c]
		if std == 0 {
			std = 1
		}
		mul[c], add[c] = scale/std, -p.Mean[c]/std
	}
	mul[3] = scale // alpha: scaled, and normalized only by a mean and std shared by all channels
	if p.Mean[0] == p.Mean[1] && p.Mean[1] == p.Mean[2] && p.Std[0] == p.Std[1] && p.Std[1] == p.Std[2] {
		mul[3], add[3] = mul[0], add[0]
	}
	alpha := p.Alpha*mul[3] + add[3]
	src := [3]int{0, 1, 2}
	if p.Channels == "BGR" || p.Channels == "BGRA" {
		src = [3]int{2, 1, 0}
	}
	nc := p.channels()
	nhwc := p.Layout == "NHWC"
	vals := make([]float32, nc*ch*cw)
	for y := range ch {
		row := m.pix[3*((top+y)*m.w+left):]
		for x := range cw {
			for c := range nc {
				v := alpha
				if c < 3 {
					v = row[3*x+src[c]]*mul[c] + add[c]
				}
				if nhwc {
					vals[nc*(y*cw+x)+c] = v
				} else {
					vals[(c*ch+y)*cw+x] = v
				}
			}
		}
	}
	dims := []int64{int64(nc), int64(ch), int64(cw)}
	if nhwc {
		dims = []int64{int64(ch), int64(cw), int64(nc)}
	}
	t := &onnx.Tensor{Name: name, Type: p.DType, Dims: dims}
	switch p.DType {
	case onnx.Undefined, onnx.Float:
		t.Type, t.Data = onnx.Float, vals
	case onnx.Float16:
		t.Data = mapSlice(vals, float16.Fromfloat32)
	case onnx.Uint8:
		t.Data = mapSlice(vals, func(v float32) uint8 {
			return uint8(math.Round(math.Max(0, math.Min(255, float64(v)))))
		})
	default:
		return nil, fmt.Errorf("images cannot give %s tensors", p.DType)
	}
	return t, nil
}

// imageInput finds the model input images feed, and the preprocessing for it.
func imageInput(spec Spec) (string, Preprocess, error) {
	switch len(spec.Inputs) {
	case 0:
		p, err := spec.Preprocess.Infer(onnx.ValueInfo{Name: "input"}, nil)
		return "input", p, err
	case 1:
		v := spec.Inputs[0]
		p, err := spec.Preprocess.Infer(v, sampleShape(v, Batched(spec.Inputs)))
		return v.Name, p, err
	}
	return "", Preprocess{}, fmt.Errorf("images feed one input, but the model has inputs %s", inputNames(spec.Inputs))
}

// imageSource is a list of image files, one sample each.
type imageSource struct {
	fsys  FS
	names []string
	input string
	pre   Preprocess
}

func newImageSource(spec Spec, fsys FS, names []string) (Source, error) {
	input, pre, err := imageInput(spec)
	if err != nil {
		return nil, err
	}
	return &imageSource{fsys: fsys, names: names, input: input, pre: pre}, nil
}

func (s *imageSource) Len() int { return len(s.names) }

func (s *imageSource) Sample(ctx context.Context, i int) (Sample, error) {
	if i < 0 || i >= len(s.names) {
		return Sample{}, fmt.Errorf("sample %d out of range [0,%d)", i, len(s.names))
	}
	name := s.names[i]
	data, err := readAll(ctx, s.fsys, name)
	if err != nil {
		return Sample{}, sampleErr(name, "", err)
	}
	t, err := s.pre.Apply(data, s.input)
	if err != nil {
		return Sample{}, sampleErr(name, "", err)
	}
	return Sample{ID: name, Tensors: map[string]*onnx.Tensor{s.input: t}, Label: -1}, nil
}
