package dataset

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
)

// Preprocess turns an image into a tensor: resize, center crop, then per
// channel value*Scale, minus Mean, divided by Std, in the channel order and
// layout the model wants. Zero values mean "not set": no resize, no crop,
// Scale 1, Mean 0, Std 1, and Channels, Layout and DType taken from the
// model input (see Infer) or RGB, NCHW and float32.
type Preprocess struct {
	// ResizeShorter resizes the image so its shorter side has this many
	// pixels, keeping the aspect ratio (torchvision's Resize(int)).
	ResizeShorter int
	// Resize resizes to exactly height×width, ignoring the aspect ratio.
	Resize [2]int
	// Crop is the height and width of the center crop.
	Crop [2]int
	// Scale multiplies pixel values, which start in 0..255.
	Scale float32
	// Mean and Std are per output channel (in Channels order).
	Mean, Std [3]float32
	// Channels is "RGB" or "BGR", or "RGBA" or "BGRA" for models that take
	// a fourth channel (M-LSD's input_image_with_alpha).
	Channels string
	// Alpha is the value of the fourth channel of RGBA and BGRA, in the
	// pixels' 0..255 scale (scaled like them, and normalized too when the
	// three means and the three stds are each equal): a constant, since
	// the decoded images' own alpha is dropped. ParsePreprocess sets 255
	// (opaque) when an RGBA or BGRA order comes without alpha=.
	Alpha float32
	// Layout is "NCHW" (tensor [3,H,W]) or "NHWC" (tensor [H,W,3]).
	Layout string
	// DType is onnx.Float, onnx.Float16 or onnx.Uint8 (rounded, clamped).
	DType onnx.DataType
}

// Presets are named Preprocess specs:
//
//	imagenet   torchvision: shorter side 256, crop 224, [0,1], ImageNet mean/std, RGB
//	inception  TF-slim Inception: shorter side 342, crop 299, scaled to [-1,1], RGB
//	caffe      Keras ResNet50 "caffe" mode: shorter side 256, crop 224, BGR, mean subtracted, 0..255
var Presets = map[string]Preprocess{
	"imagenet": {ResizeShorter: 256, Crop: [2]int{224, 224}, Scale: 1.0 / 255,
		Mean: [3]float32{0.485, 0.456, 0.406}, Std: [3]float32{0.229, 0.224, 0.225}, Channels: "RGB"},
	"inception": {ResizeShorter: 342, Crop: [2]int{299, 299}, Scale: 1.0 / 255,
		Mean: [3]float32{0.5, 0.5, 0.5}, Std: [3]float32{0.5, 0.5, 0.5}, Channels: "RGB"},
	"caffe": {ResizeShorter: 256, Crop: [2]int{224, 224}, Scale: 1,
		Mean: [3]float32{103.939, 116.779, 123.68}, Channels: "BGR"},
}

// ParsePreprocess reads a spec such as
//
//	resize=256,crop=224,scale=0.00392157,mean=0.485:0.456:0.406,std=0.229:0.224:0.225,order=RGB,layout=NCHW,dtype=float32
//
// The first item may be a preset name, which later items override
// ("imagenet,layout=NHWC"). Sizes are N or HxW; scale may be a fraction
// ("1/255"); mean and std take one value or three separated by ':'.
func ParsePreprocess(s string) (Preprocess, error) {
	var p Preprocess
	alpha := false
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, val, ok := strings.Cut(item, "=")
		if !ok {
			preset, found := Presets[strings.ToLower(item)]
			if i != 0 || !found {
				return Preprocess{}, fmt.Errorf("preprocess %q: %q is not key=value or a preset (imagenet, inception, caffe) at the start", s, item)
			}
			p = preset
			continue
		}
		key = strings.ToLower(strings.TrimSpace(key))
		if err := p.set(key, strings.TrimSpace(val)); err != nil {
			return Preprocess{}, fmt.Errorf("preprocess %q: %s: %w", s, key, err)
		}
		alpha = alpha || key == "alpha"
	}
	switch {
	case alpha && (p.Channels == "" || p.Channels == "RGB" || p.Channels == "BGR"):
		if p.Channels == "" {
			p.Channels = "RGB"
		}
		p.Channels += "A" // alpha= alone asks for the fourth channel
	case !alpha && p.hasAlpha():
		p.Alpha = 255
	}
	return p, p.Validate()
}

func (p *Preprocess) set(key, val string) error {
	var err error
	switch key {
	case "resize":
		var hw [2]int
		if hw, err = parseSize(val); err == nil {
			if strings.ContainsAny(val, "xX") {
				p.Resize, p.ResizeShorter = hw, 0
			} else {
				p.ResizeShorter, p.Resize = hw[0], [2]int{}
			}
		}
	case "crop":
		p.Crop, err = parseSize(val)
	case "scale":
		p.Scale, err = parseFloat(val)
	case "mean":
		p.Mean, err = parseTriple(val)
	case "std":
		p.Std, err = parseTriple(val)
	case "order", "channels":
		p.Channels = strings.ToUpper(val)
	case "alpha":
		p.Alpha, err = parseFloat(val)
		if err == nil && (p.Alpha < 0 || p.Alpha > 255) {
			err = fmt.Errorf("alpha %g is outside the pixels' 0..255", p.Alpha)
		}
	case "layout":
		p.Layout = strings.ToUpper(val)
	case "dtype":
		p.DType, err = onnx.ParseDataType(val)
	default:
		err = errors.New("unknown key (want resize, crop, scale, mean, std, order, alpha, layout or dtype)")
	}
	return err
}

func parseSize(v string) ([2]int, error) {
	h, w, two := strings.Cut(strings.ToLower(v), "x")
	hv, err1 := strconv.Atoi(h)
	wv := hv
	var err2 error
	if two {
		wv, err2 = strconv.Atoi(w)
	}
	if err1 != nil || err2 != nil || hv <= 0 || wv <= 0 {
		return [2]int{}, fmt.Errorf("invalid size %q (want N or HxW, positive)", v)
	}
	return [2]int{hv, wv}, nil
}

func parseFloat(v string) (float32, error) {
	num, den, frac := strings.Cut(v, "/")
	f, err := strconv.ParseFloat(num, 32)
	if err == nil && frac {
		var d float64
		if d, err = strconv.ParseFloat(den, 32); err == nil {
			if d == 0 {
				return 0, fmt.Errorf("invalid number %q: division by zero", v)
			}
			f /= d
		}
	}
	if err != nil {
		return 0, fmt.Errorf("invalid number %q", v)
	}
	return float32(f), nil
}

func parseTriple(v string) ([3]float32, error) {
	parts := strings.Split(v, ":")
	if len(parts) != 1 && len(parts) != 3 {
		return [3]float32{}, fmt.Errorf("invalid %q: want one value or three separated by ':'", v)
	}
	var out [3]float32
	for i := range out {
		f, err := parseFloat(parts[min(i, len(parts)-1)])
		if err != nil {
			return out, err
		}
		out[i] = f
	}
	return out, nil
}

// String prints p in the form ParsePreprocess reads, with unset fields left out.
func (p Preprocess) String() string {
	var parts []string
	if p.ResizeShorter > 0 {
		parts = append(parts, fmt.Sprintf("resize=%d", p.ResizeShorter))
	}
	if p.Resize != [2]int{} {
		parts = append(parts, fmt.Sprintf("resize=%dx%d", p.Resize[0], p.Resize[1]))
	}
	if p.Crop != [2]int{} {
		parts = append(parts, fmt.Sprintf("crop=%dx%d", p.Crop[0], p.Crop[1]))
	}
	if p.Scale != 0 {
		parts = append(parts, "scale="+strconv.FormatFloat(float64(p.Scale), 'g', -1, 32))
	}
	triple := func(t [3]float32) string {
		s := make([]string, 3)
		for i, v := range t {
			s[i] = strconv.FormatFloat(float64(v), 'g', -1, 32)
		}
		return strings.Join(s, ":")
	}
	if p.Mean != [3]float32{} {
		parts = append(parts, "mean="+triple(p.Mean))
	}
	if p.Std != [3]float32{} {
		parts = append(parts, "std="+triple(p.Std))
	}
	if p.Channels != "" {
		parts = append(parts, "order="+p.Channels)
	}
	if p.hasAlpha() {
		parts = append(parts, "alpha="+strconv.FormatFloat(float64(p.Alpha), 'g', -1, 32))
	}
	if p.Layout != "" {
		parts = append(parts, "layout="+p.Layout)
	}
	if p.DType != onnx.Undefined {
		parts = append(parts, "dtype="+p.DType.String())
	}
	return strings.Join(parts, ",")
}

// hasAlpha reports whether p adds a fourth, constant channel.
func (p Preprocess) hasAlpha() bool { return p.Channels == "RGBA" || p.Channels == "BGRA" }

// channels is how many channels p writes.
func (p Preprocess) channels() int {
	if p.hasAlpha() {
		return 4
	}
	return 3
}

// Validate checks the fields on their own.
func (p Preprocess) Validate() error {
	if p.ResizeShorter < 0 || p.Resize[0] < 0 || p.Resize[1] < 0 || p.Crop[0] < 0 || p.Crop[1] < 0 {
		return errors.New("preprocess: sizes must be positive")
	}
	if p.ResizeShorter > 0 && p.Resize != [2]int{} {
		return errors.New("preprocess: resize is either a shorter side or HxW, not both")
	}
	if (p.Crop[0] == 0) != (p.Crop[1] == 0) || (p.Resize[0] == 0) != (p.Resize[1] == 0) {
		return errors.New("preprocess: a size needs both height and width")
	}
	for _, s := range p.Std {
		if s < 0 {
			return fmt.Errorf("preprocess: std %v must be positive", p.Std)
		}
	}
	switch p.Channels {
	case "", "RGB", "BGR", "RGBA", "BGRA":
	default:
		return fmt.Errorf("preprocess: channel order %q (want RGB, BGR, RGBA or BGRA)", p.Channels)
	}
	switch p.Layout {
	case "", "NCHW", "NHWC":
	default:
		return fmt.Errorf("preprocess: layout %q (want NCHW or NHWC)", p.Layout)
	}
	switch p.DType {
	case onnx.Undefined, onnx.Float, onnx.Float16, onnx.Uint8:
	default:
		return fmt.Errorf("preprocess: element type %s (want float32, float16 or uint8)", p.DType)
	}
	return nil
}

// Infer fills what p leaves unset from the model input v, whose per-sample
// shape is given without a batch dimension ([3,H,W] or [H,W,3]): the layout
// (NCHW when dimension 0 is 3, NHWC when the last is 3), the crop size (H×W,
// with the shorter side resized to the larger of H and W when no resize is
// set) and the element type. What cannot be inferred gets RGB, NCHW, float32.
func (p Preprocess) Infer(v onnx.ValueInfo, sampleDims []onnx.Dim) (Preprocess, error) {
	if p.Channels == "" {
		p.Channels = "RGB"
	}
	nc := int64(p.channels())
	is := func(d onnx.Dim, n int64) bool { return d.Known && d.Value == n }
	if p.Layout == "" {
		p.Layout = "NCHW"
		if len(sampleDims) == 3 && is(sampleDims[2], nc) && !is(sampleDims[0], nc) {
			p.Layout = "NHWC"
		}
	}
	if len(sampleDims) == 3 && nc == 3 && (is(sampleDims[0], 4) || is(sampleDims[2], 4)) &&
		!is(sampleDims[0], 3) && !is(sampleDims[2], 3) {
		return p, fmt.Errorf("model input %q takes 4 channels (%s): add a constant fourth one with alpha=V (0..255, e.g. alpha=255) or order=RGBA",
			v.Name, dimsString(sampleDims))
	}
	if p.DType == onnx.Undefined {
		p.DType = onnx.Float
		if v.Type != onnx.Undefined {
			p.DType = v.Type
		}
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("model input %q: %w", v.Name, err)
	}
	if len(sampleDims) == 3 {
		h, w := sampleDims[1], sampleDims[2]
		if p.Layout == "NHWC" {
			h, w = sampleDims[0], sampleDims[1]
		}
		if p.Crop == [2]int{} && h.Known && w.Known && h.Value > 0 && w.Value > 0 {
			p.Crop = [2]int{int(h.Value), int(w.Value)}
			if p.ResizeShorter == 0 && p.Resize == [2]int{} {
				p.ResizeShorter = max(p.Crop[0], p.Crop[1])
			}
		}
	}
	return p, nil
}
