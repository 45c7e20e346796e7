package testmodels

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// TinyNet is a small image classifier with the shape of a real CNN: input
// "images" float32 [N,3,32,32] (NCHW, dynamic batch), three convolutions with
// ReLU, a residual Add, max pooling, global average pooling and a Gemm to 10
// classes, output "probs" float32 [N,10] after Softmax. Weights are He-normal
// from seed, with the classifier scaled so that predictions are confident
// (top-1 is then a meaningful thing to compare across precisions).
func TinyNet(seed uint64) *onnxpb.ModelProto {
	b := NewBuilder("tinynet", seed)
	x := b.Input("images", onnx.Float, "N", 3, 32, 32)
	pad1 := Ints("pads", 1, 1, 1, 1)
	k3 := Ints("kernel_shape", 3, 3)

	c1 := b.Node("Conv", []string{x, b.He("conv1.weight", 27, 16, 3, 3, 3), b.RandNormal("conv1.bias", 0.1, 16)}, k3, pad1)
	r1 := b.Node("Relu", []string{c1})
	c2 := b.Node("Conv", []string{r1, b.He("conv2.weight", 144, 16, 16, 3, 3), b.RandNormal("conv2.bias", 0.1, 16)}, k3, pad1)
	r2 := b.Node("Relu", []string{c2})
	c3 := b.Node("Conv", []string{r2, b.He("conv3.weight", 144, 16, 16, 3, 3), b.RandNormal("conv3.bias", 0.1, 16)}, k3, pad1)
	add := b.Node("Add", []string{c3, r1}) // residual: skip input is r1
	r3 := b.Node("Relu", []string{add})
	mp := b.Node("MaxPool", []string{r3}, Ints("kernel_shape", 2, 2), Ints("strides", 2, 2))
	c4 := b.Node("Conv", []string{mp, b.He("conv4.weight", 144, 32, 16, 3, 3), b.RandNormal("conv4.bias", 0.1, 32)}, k3, pad1, Ints("strides", 2, 2))
	r4 := b.Node("Relu", []string{c4})
	gap := b.Node("GlobalAveragePool", []string{r4})
	flat := b.Node("Flatten", []string{gap}, Int("axis", 1))
	fc := b.Node("Gemm", []string{flat, b.RandNormal("fc.weight", 0.6, 10, 32), b.RandNormal("fc.bias", 0.1, 10)}, Int("transB", 1))
	b.Node("Softmax", []string{fc}, Int("axis", 1))
	b.Rename("probs")
	b.Output("probs", onnx.Float, "N", 10)
	return b.Model(13, 7)
}

// TinyNetLabels are the class names shipped with TinyNet.
var TinyNetLabels = []string{"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}

// Wide is an MLP whose weights take about sizeMB megabytes (float32), for
// load/save and conversion benchmarks: input "x" [N,1024], layers of
// 1024x1024 MatMul+Add+Relu, output "y" [N,1024].
func Wide(sizeMB int, seed uint64) *onnxpb.ModelProto {
	b := NewBuilder("wide", seed)
	x := b.Input("x", onnx.Float, "N", 1024)
	layers := sizeMB * (1 << 20) / (1024 * 1024 * 4)
	if layers < 1 {
		layers = 1
	}
	h := x
	for i := 0; i < layers; i++ {
		w := b.RandNormal("w"+itoa(i), 0.03, 1024, 1024)
		bias := b.RandNormal("b"+itoa(i), 0.01, 1024)
		h = b.Node("Relu", []string{b.Node("Add", []string{b.Node("MatMul", []string{h, w}), bias})})
	}
	b.Rename("y")
	b.Output("y", onnx.Float, "N", 1024)
	return b.Model(13, 7)
}
