package testmodels

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// LargeSize is the height and width of LargeActivations' input.
const LargeSize = 1024

// LargeActivations is a model with the memory profile of a high-resolution
// segmentation network, for peak-memory measurements of calibration: most
// of the activations that calibration fetches are also alive at once in
// plain inference, as the skip connections of a U-Net keep the encoder's
// full-resolution features until the decoder. Input "image" float32
// [N,3,1024,1024]; a 2x2 stride-2 stem convolution to 16 channels at
// 512x512; branches 1x1 convolutions of the stem (16 channels at 512x512,
// 16 MiB per sample each), each read by a strided 1x1 convolution to 8
// channels at 256x256 and kept until the end; outputs "features"
// [N,16,512,512], the Sum of the branch features, and "coarse"
// [N,8,256,256], the Sum of the strided ones. Each branch feature is a
// convolution input, so the Q/DQ scope observes branches+2 tensors: about
// branches*16 MiB per sample (128 branches: 2 GiB).
func LargeActivations(branches int, seed uint64) *onnxpb.ModelProto {
	b := NewBuilder("large_activations", seed)
	x := b.Input("image", onnx.Float, "N", 3, LargeSize, LargeSize)
	conv := func(name, in string, cin, cout, k int64, attrs ...Attr) string {
		w := b.RandNormal(name+".weight", he(cin*k*k), cout, cin, k, k)
		bias := b.RandNormal(name+".bias", 0.02, cout)
		return b.Node("Conv", []string{in, w, bias}, append([]Attr{Ints("kernel_shape", k, k)}, attrs...)...)
	}
	s2 := Ints("strides", 2, 2)
	stem := conv("stem", x, 3, 16, 2, s2)
	feats := make([]string, branches)
	coarse := make([]string, branches)
	for i := range branches {
		name := "branch" + itoa(i)
		feats[i] = conv(name, stem, 16, 16, 1)
		coarse[i] = conv(name+".down", feats[i], 16, 8, 1, s2)
	}
	b.Node("Sum", feats)
	b.Rename("features")
	b.Node("Sum", coarse)
	b.Rename("coarse")
	b.Output("features", onnx.Float, "N", 16, LargeSize/2, LargeSize/2)
	b.Output("coarse", onnx.Float, "N", 8, LargeSize/4, LargeSize/4)
	return b.Model(13, 7)
}
