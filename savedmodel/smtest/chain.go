package smtest

import (
	"fmt"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// MatMulChain writes to dir a SavedModel of layers n×n MatMuls with
// resource-variable kernels (input x [-1, n], output y): the model the
// import benchmarks use, layers·n²·4 bytes of float32 variables (n=2048,
// layers=6 is about 100 MB), which it returns. The kernels' values, small
// and centred on zero scaled by seed, keep the outputs finite in fp16.
func MatMulChain(dir string, n, layers int, seed float32) (int64, error) {
	g := &Graph{}
	out := g.Placeholder("x", smpb.DataType_DT_FLOAT, []int64{-1, int64(n)})
	w := make([]float32, n*n)
	for i := range w {
		w[i] = float32(i%97-48) * 1e-4 * seed
	}
	for l := range layers {
		k := g.ResourceVariable(fmt.Sprintf("dense_%d/kernel", l), []int64{int64(n), int64(n)}, w)
		out = g.Node(fmt.Sprintf("mm_%d", l), "MatMul", nil, out, k)
	}
	err := g.Write(dir, Signature{
		Inputs:  map[string]Arg{"x": {Tensor: "x:0", DType: smpb.DataType_DT_FLOAT, Dims: []int64{-1, int64(n)}}},
		Outputs: map[string]Arg{"y": {Tensor: out + ":0", DType: smpb.DataType_DT_FLOAT, Dims: []int64{-1, int64(n)}}},
	})
	return int64(layers) * int64(n) * int64(n) * 4, err
}
