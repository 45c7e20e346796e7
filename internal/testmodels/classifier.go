package testmodels

import (
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Classifier is an image classifier built so that its predictions spread
// over its classes on varied inputs, which TinyNet's do not (its ReLU
// features share a large positive mean, so one class wins for almost every
// image and top-1 agreement between precisions says little). Input "images"
// float32 [N,3,32,32] (NCHW, dynamic batch, values roughly zero-mean, e.g.
// pixels scaled by 1/255 with mean 0.5 and std 0.25); a linear stem
// convolution, two residual blocks Conv-ReLU-Conv + skip, average pooling, a
// convolution, global average pooling and a Gemm with transB=0 (weight
// [32,10]) to 10 classes. Outputs "logits" [N,10] and "probs" [N,10]
// (Softmax). The signed skip path carries colour and pattern information
// to the classifier, so classes vary with the input and logits have
// moderate margins.
func Classifier(seed uint64) *onnxpb.ModelProto {
	b := NewBuilder("classifier", seed)
	x := b.Input("images", onnx.Float, "N", 3, 32, 32)
	pad1 := Ints("pads", 1, 1, 1, 1)
	k3 := Ints("kernel_shape", 3, 3)

	s := b.Node("Conv", []string{x, b.He("stem.weight", 27, 16, 3, 3, 3), b.RandNormal("stem.bias", 0.05, 16)}, k3, pad1)
	for i, name := range []string{"block1", "block2"} {
		r := b.Node("Relu", []string{b.Node("Conv", []string{s, b.He(name+".conv1.weight", 144, 16, 16, 3, 3), b.RandNormal(name+".conv1.bias", 0.05, 16)}, k3, pad1)})
		c := b.Node("Conv", []string{r, b.RandNormal(name+".conv2.weight", 0.5*0.118/float64(i+1), 16, 16, 3, 3), b.RandNormal(name+".conv2.bias", 0.02, 16)}, k3, pad1)
		s = b.Node("Add", []string{c, s}) // residual: the skip input is s
	}
	p := b.Node("AveragePool", []string{s}, Ints("kernel_shape", 2, 2), Ints("strides", 2, 2))
	c := b.Node("Conv", []string{p, b.He("head.weight", 144, 32, 16, 3, 3), b.RandNormal("head.bias", 0.05, 32)}, k3, pad1)
	gap := b.Node("GlobalAveragePool", []string{c})
	flat := b.Node("Flatten", []string{gap}, Int("axis", 1))
	b.Node("Gemm", []string{flat, b.RandNormal("fc.weight", 1.5, 32, 10), b.RandNormal("fc.bias", 0.05, 10)})
	b.Rename("logits")
	b.Node("Softmax", []string{"logits"}, Int("axis", 1))
	b.Rename("probs")
	b.Output("logits", onnx.Float, "N", 10)
	b.Output("probs", onnx.Float, "N", 10)
	return b.Model(13, 7)
}
