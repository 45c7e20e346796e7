package testmodels

import (
	"math"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// ResNetishSize is the height and width of ResNetish's input.
const ResNetishSize = 112

// ResNetish is a CNN with the proportions of a ResNet-18 as exported for
// inference (batch normalization folded into the convolutions), for
// benchmarks where the ratio of compute to activation size matters, such as
// calibration overhead. Input "images" float32 [N,3,112,112] (NCHW, dynamic
// batch; 112 rather than 224 keeps benchmarks short, and every cost scales
// with the image area alike); a 3x3 stride-2 stem convolution with ReLU and a
// 3x3 stride-2 max pool; three stages of two basic blocks (Conv-ReLU-Conv,
// residual Add, ReLU) with width, 2*width and 4*width channels at 28x28,
// 14x14 and 7x7, the first block of the later stages downsampling with
// stride 2 and a 1x1 projection on the skip path (15 convolutions in all);
// global average pooling and a Gemm (weight [1000, 4*width], transB=1).
// Outputs "logits" [N,1000] and "probs" [N,1000] (Softmax). Weights are
// He-normal from seed, the last convolution of each residual branch scaled
// down so that activations stay of the same magnitude through the stages.
func ResNetish(width int, seed uint64) *onnxpb.ModelProto {
	b := NewBuilder("resnetish", seed)
	x := b.Input("images", onnx.Float, "N", 3, ResNetishSize, ResNetishSize)
	w := int64(width)
	k3, k1 := Ints("kernel_shape", 3, 3), Ints("kernel_shape", 1, 1)
	pad1 := Ints("pads", 1, 1, 1, 1)
	s2 := Ints("strides", 2, 2)

	conv := func(name string, in string, cin, cout, k int64, scale float64, attrs ...Attr) string {
		weight := b.RandNormal(name+".weight", scale*he(cin*k*k), cout, cin, k, k)
		bias := b.RandNormal(name+".bias", 0.02, cout)
		return b.Node("Conv", []string{in, weight, bias}, attrs...)
	}
	h := b.Node("Relu", []string{conv("stem", x, 3, w, 3, 1, k3, pad1, s2)})
	h = b.Node("MaxPool", []string{h}, k3, pad1, s2)
	cin := w
	for stage, cout := range []int64{w, 2 * w, 4 * w} {
		for block := range 2 {
			name := "stage" + itoa(stage+1) + ".block" + itoa(block+1)
			first := []Attr{k3, pad1}
			skip := h
			if stage > 0 && block == 0 {
				first = append(first, s2)
				skip = conv(name+".proj", h, cin, cout, 1, 1, k1, s2)
			}
			r := b.Node("Relu", []string{conv(name+".conv1", h, cin, cout, 3, 1, first...)})
			c := conv(name+".conv2", r, cout, cout, 3, 0.3, k3, pad1)
			h = b.Node("Relu", []string{b.Node("Add", []string{c, skip})})
			cin = cout
		}
	}
	gap := b.Node("GlobalAveragePool", []string{h})
	flat := b.Node("Flatten", []string{gap}, Int("axis", 1))
	b.Node("Gemm", []string{flat, b.RandNormal("fc.weight", 2*he(cin), 1000, cin), b.RandNormal("fc.bias", 0.01, 1000)}, Int("transB", 1))
	b.Rename("logits")
	b.Node("Softmax", []string{"logits"}, Int("axis", 1))
	b.Rename("probs")
	b.Output("logits", onnx.Float, "N", 1000)
	b.Output("probs", onnx.Float, "N", 1000)
	return b.Model(13, 7)
}

// he is the standard deviation of He initialisation for fanIn inputs.
func he(fanIn int64) float64 {
	return math.Sqrt(2 / float64(fanIn))
}
