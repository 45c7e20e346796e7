package dataset

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// pngOf encodes a w×h image whose pixel (x, y) is px(x, y).
func pngOf(t testing.TB, w, h int, px func(x, y int) color.NRGBA) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, px(x, y))
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// grad is R = 40x, G = 10y, B = 200.
func grad(x, y int) color.NRGBA { return color.NRGBA{uint8(40 * x), uint8(10 * y), 200, 255} }

// coords is R = 10x, G = 50y, B = x+y: crops show where they were taken.
func coords(x, y int) color.NRGBA {
	return color.NRGBA{uint8(10 * x), uint8(50 * y), uint8(x + y), 255}
}

func TestPreprocessApply(t *testing.T) {
	f16 := func(v ...float32) []float16.Float16 { return mapSlice(v, float16.Fromfloat32) }
	tests := []struct {
		name     string
		img      []byte
		pre      Preprocess
		wantDims []int64
		want     any
	}{
		{"identity NCHW", pngOf(t, 2, 1, grad), Preprocess{}, []int64{3, 1, 2},
			[]float32{0, 40, 0, 0, 200, 200}},
		{"downscale width", pngOf(t, 4, 2, grad), Preprocess{Resize: [2]int{2, 2}}, []int64{3, 2, 2},
			[]float32{20, 100, 20, 100, 0, 0, 10, 10, 200, 200, 200, 200}},
		{"upscale width", pngOf(t, 2, 1, grad), Preprocess{Resize: [2]int{1, 4}, Channels: "RGB"}, []int64{3, 1, 4},
			[]float32{0, 10, 30, 40, 0, 0, 0, 0, 200, 200, 200, 200}},
		{"shorter side", pngOf(t, 4, 2, grad), Preprocess{ResizeShorter: 1}, []int64{3, 1, 2},
			[]float32{20, 100, 5, 5, 200, 200}},
		{"crop offsets", pngOf(t, 5, 3, coords), Preprocess{Crop: [2]int{1, 2}}, []int64{3, 1, 2},
			[]float32{20, 30, 50, 50, 3, 4}},
		{"crop rounds half to even", pngOf(t, 4, 1, coords), Preprocess{Crop: [2]int{1, 1}}, []int64{3, 1, 1},
			[]float32{20, 0, 2}},
		{"crop rounds half to even 2", pngOf(t, 6, 1, coords), Preprocess{Crop: [2]int{1, 1}}, []int64{3, 1, 1},
			[]float32{20, 0, 2}},
		{"scale mean std", pngOf(t, 2, 1, grad), Preprocess{Scale: 0.5, Mean: [3]float32{10, 0, 100}, Std: [3]float32{2, 1, 0.5}}, []int64{3, 1, 2},
			[]float32{-5, 5, 0, 0, 0, 0}},
		{"BGR", pngOf(t, 2, 1, grad), Preprocess{Channels: "BGR"}, []int64{3, 1, 2},
			[]float32{200, 200, 0, 0, 0, 40}},
		{"NHWC", pngOf(t, 2, 1, grad), Preprocess{Layout: "NHWC"}, []int64{1, 2, 3},
			[]float32{0, 0, 200, 40, 0, 200}},
		{"BGR NHWC mean", pngOf(t, 2, 1, grad), Preprocess{Layout: "NHWC", Channels: "BGR", Mean: [3]float32{100, 0, 20}}, []int64{1, 2, 3},
			[]float32{100, 0, -20, 100, 0, 20}},
		{"float16", pngOf(t, 2, 1, grad), Preprocess{DType: onnx.Float16, Scale: 1.0 / 255}, []int64{3, 1, 2},
			f16(0, 40.0/255, 0, 0, 200.0/255, 200.0/255)},
		{"uint8 clamps", pngOf(t, 2, 1, grad), Preprocess{DType: onnx.Uint8, Scale: 2}, []int64{3, 1, 2},
			[]uint8{0, 80, 0, 0, 255, 255}},
		{"gray", pngGray(t), Preprocess{}, []int64{3, 1, 2},
			[]float32{7, 9, 7, 9, 7, 9}},
		{"paletted", pngPaletted(t), Preprocess{}, []int64{3, 1, 2},
			[]float32{255, 0, 0, 0, 0, 255}},
		{"alpha dropped", pngOf(t, 1, 1, func(x, y int) color.NRGBA { return color.NRGBA{100, 50, 25, 0} }), Preprocess{}, []int64{3, 1, 1},
			[]float32{100, 50, 25}},
		// M-LSD's input: raw pixels and a constant alpha of 1, NHWC.
		{"RGBA constant alpha NHWC", pngOf(t, 2, 1, grad), Preprocess{Channels: "RGBA", Alpha: 1, Layout: "NHWC"}, []int64{1, 2, 4},
			[]float32{0, 0, 200, 1, 40, 0, 200, 1}},
		// One mean and std for all channels normalize alpha too; three
		// different ones leave it only scaled.
		{"BGRA shared mean", pngOf(t, 2, 1, grad), Preprocess{Channels: "BGRA", Alpha: 255, Scale: 1.0 / 127.5, Mean: [3]float32{1, 1, 1}}, []int64{4, 1, 2},
			[]float32{200*float32(1/127.5) - 1, 200*float32(1/127.5) - 1, -1, -1, -1, 40*float32(1/127.5) - 1, 1, 1}},
		{"RGBA per-channel mean", pngOf(t, 1, 1, grad), Preprocess{Channels: "RGBA", Alpha: 100, Scale: 0.5, Mean: [3]float32{1, 2, 3}}, []int64{4, 1, 1},
			[]float32{-1, -2, 97, 50}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.pre.Apply(tt.img, "x")
			if err != nil {
				t.Fatalf("Apply() = %v", err)
			}
			if !slices.Equal(got.Dims, tt.wantDims) || !reflect.DeepEqual(got.Data, tt.want) {
				t.Errorf("Apply(%v) = %v %v, want %v %v", tt.pre, got.Dims, got.Data, tt.wantDims, tt.want)
			}
		})
	}
}

func pngGray(t testing.TB) []byte {
	img := image.NewGray(image.Rect(0, 0, 2, 1))
	img.Pix = []uint8{7, 9}
	var buf bytes.Buffer
	png.Encode(&buf, img)
	return buf.Bytes()
}

func pngPaletted(t testing.TB) []byte {
	img := image.NewPaletted(image.Rect(0, 0, 2, 1), color.Palette{color.RGBA{255, 0, 0, 255}, color.RGBA{0, 0, 255, 255}})
	img.Pix = []uint8{0, 1}
	var buf bytes.Buffer
	png.Encode(&buf, img)
	return buf.Bytes()
}

func TestParsePreprocess(t *testing.T) {
	tests := []struct {
		in      string
		want    Preprocess
		wantErr string
	}{
		{"resize=256,crop=224,scale=0.00392157,mean=0.485:0.456:0.406,std=0.229:0.224:0.225,order=RGB,layout=NCHW,dtype=float32",
			Preprocess{ResizeShorter: 256, Crop: [2]int{224, 224}, Scale: 0.00392157, Mean: [3]float32{0.485, 0.456, 0.406},
				Std: [3]float32{0.229, 0.224, 0.225}, Channels: "RGB", Layout: "NCHW", DType: onnx.Float}, ""},
		{"imagenet", Presets["imagenet"], ""},
		{"inception,layout=nhwc,dtype=fp16", func() Preprocess {
			p := Presets["inception"]
			p.Layout, p.DType = "NHWC", onnx.Float16
			return p
		}(), ""},
		{"resize=240x320,crop=224x200,scale=1/255,mean=127.5,order=bgr", Preprocess{Resize: [2]int{240, 320}, Crop: [2]int{224, 200},
			Scale: 1.0 / 255, Mean: [3]float32{127.5, 127.5, 127.5}, Channels: "BGR"}, ""},
		{"", Preprocess{}, ""},
		{"crop=abc", Preprocess{}, `crop: invalid size "abc"`},
		{"crop=0", Preprocess{}, "invalid size"},
		{"mean=1:2", Preprocess{}, "want one value or three"},
		{"scale=1/0", Preprocess{}, "division by zero"},
		{"layout=NCWH", Preprocess{}, `layout "NCWH"`},
		{"order=RGBA", Preprocess{Channels: "RGBA", Alpha: 255}, ""},
		{"resize=320x320,alpha=1", Preprocess{Resize: [2]int{320, 320}, Channels: "RGBA", Alpha: 1}, ""},
		{"alpha=0,order=bgr", Preprocess{Channels: "BGRA"}, ""},
		{"order=BGRA,alpha=1/2", Preprocess{Channels: "BGRA", Alpha: 0.5}, ""},
		{"alpha=256", Preprocess{}, "outside the pixels' 0..255"},
		{"order=RGBX", Preprocess{}, `channel order "RGBX"`},
		{"dtype=int64", Preprocess{}, "element type int64"},
		{"dtype=complex", Preprocess{}, "unknown element type"},
		{"size=3", Preprocess{}, "unknown key"},
		{"crop=2,imagenet", Preprocess{}, "preset"},
		{"resnet", Preprocess{}, "preset"},
		{"std=-1", Preprocess{}, "positive"},
	}
	for _, tt := range tests {
		got, err := ParsePreprocess(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePreprocess(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParsePreprocess(%q) = %+v, %v, want %+v", tt.in, got, err, tt.want)
			continue
		}
		// String prints what ParsePreprocess reads back.
		if again, err := ParsePreprocess(got.String()); err != nil || again != got {
			t.Errorf("ParsePreprocess(%q.String() = %q) = %+v, %v", tt.in, got.String(), again, err)
		}
	}
}

func TestPreprocessInfer(t *testing.T) {
	u8 := floatInput("images", -1, 299, 299, 3)
	u8.Type = onnx.Uint8
	tests := []struct {
		name string
		pre  Preprocess
		in   onnx.ValueInfo
		want Preprocess
	}{
		{"NCHW from dim 1", Preprocess{}, floatInput("x", -1, 3, 224, 224),
			Preprocess{ResizeShorter: 224, Crop: [2]int{224, 224}, Channels: "RGB", Layout: "NCHW", DType: onnx.Float}},
		{"NHWC from last dim", Preprocess{}, u8,
			Preprocess{ResizeShorter: 299, Crop: [2]int{299, 299}, Channels: "RGB", Layout: "NHWC", DType: onnx.Uint8}},
		{"keeps what is set", Presets["imagenet"], floatInput("x", -1, 3, -1, -1),
			func() Preprocess { p := Presets["imagenet"]; p.Layout, p.DType = "NCHW", onnx.Float; return p }()},
		{"dynamic size", Preprocess{}, floatInput("x", -1, -1, -1, 3),
			Preprocess{Channels: "RGB", Layout: "NHWC", DType: onnx.Float}},
	}
	for _, tt := range tests {
		got, err := tt.pre.Infer(tt.in, sampleShape(tt.in, true))
		if err != nil || got != tt.want {
			t.Errorf("%s: Infer(%v) = %+v, %v, want %+v", tt.name, tt.in, got, err, tt.want)
		}
	}
	rgba := floatInput("input_image_with_alpha:0", 1, 320, 320, 4)
	if _, err := (Preprocess{}).Infer(rgba, sampleShape(rgba, true)); err == nil || !strings.Contains(err.Error(), "alpha=") {
		t.Errorf("Infer(4-channel input) without alpha = %v, want advice to add alpha=", err)
	}
	got, err := Preprocess{Channels: "RGBA", Alpha: 1}.Infer(rgba, sampleShape(rgba, true))
	if err != nil || got.Layout != "NHWC" || got.Crop != [2]int{320, 320} {
		t.Errorf("Infer(4-channel input) with RGBA = %+v, %v, want NHWC 320x320", got, err)
	}
	bad := floatInput("ids", -1, 128)
	bad.Type = onnx.Int64
	if _, err := (Preprocess{}).Infer(bad, nil); err == nil || !strings.Contains(err.Error(), `"ids"`) {
		t.Errorf("Infer(int64 input) = %v, want an error naming the input", err)
	}
}

func TestCorpusImages(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		file string
		in   onnx.ValueInfo
		pre  string
		dims []int64
	}{
		{"images/car.jpg", floatInput("data", -1, 3, 224, 224), "imagenet", []int64{3, 224, 224}},
		{"images/gke_tutorial_00001.jpg", floatInput("data", -1, 3, 224, 224), "imagenet", []int64{3, 224, 224}},
		{"images/gke_tutorial_00001.jpg", floatInput("input_1", -1, 224, 224, 3), "caffe", []int64{224, 224, 3}},
		{"images/car.jpg", floatInput("x", -1, 299, 299, 3), "inception", []int64{299, 299, 3}},
	} {
		p := testutil.Corpus(t, tt.file)
		pre, err := ParsePreprocess(tt.pre)
		if err != nil {
			t.Fatal(err)
		}
		src, err := Open(ctx, Spec{Path: p, Inputs: []onnx.ValueInfo{tt.in}, Preprocess: pre}, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := src.Sample(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		x := s.Tensors[tt.in.Name]
		if x == nil || !slices.Equal(x.Dims, tt.dims) || x.Type != onnx.Float {
			t.Fatalf("%s with %s: tensors %v, want %s float32%v", tt.file, tt.pre, s.Tensors, tt.in.Name, tt.dims)
		}
		lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
		for _, v := range x.Data.([]float32) {
			lo, hi = min(lo, v), max(hi, v)
		}
		if want := map[string][2]float32{"imagenet": {-2.2, 2.7}, "inception": {-1, 1}, "caffe": {-124, 152}}[tt.pre]; lo < want[0] || hi > want[1] || hi-lo < (want[1]-want[0])/4 {
			t.Errorf("%s with %s: values in [%v, %v], want a spread within %v", tt.file, tt.pre, lo, hi, want)
		}
		if err := Check([]onnx.ValueInfo{tt.in}, s); err != nil {
			t.Errorf("Check(%s) = %v", tt.file, err)
		}
	}
}

func TestBadImages(t *testing.T) {
	dir := t.TempDir()
	car, err := os.ReadFile(testutil.Corpus(t, "images", "car.jpg"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"a_truncated.jpg": car[:len(car)/2],
		"b_garbage.png":   []byte("this is not a png"),
		"c_small.png":     pngOf(t, 3, 3, grad),
		"d_good.jpg":      car,
	}
	for n, b := range files {
		os.WriteFile(filepath.Join(dir, n), b, 0o644)
	}
	ctx := context.Background()
	src, err := Open(ctx, Spec{Path: dir, Preprocess: Preprocess{Crop: [2]int{8, 8}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"a_truncated.jpg: decoding image: invalid JPEG format", "b_garbage.png: decoding image: image: unknown format",
		"c_small.png: image is 3x3 (HxW) after resizing, smaller than the 8x8 crop", ""} {
		_, err := src.Sample(ctx, i)
		var se *SampleError
		if want == "" {
			if err != nil {
				t.Errorf("Sample(%d) = %v", i, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || !errors.As(err, &se) {
			t.Errorf("Sample(%d) = %v, want a SampleError containing %q", i, err, want)
		}
	}
}
