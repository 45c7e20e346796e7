package smtest

import (
	"fmt"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// MatMulChain writes to dir a SavedModel whose serving_default signature
// multiplies x [-1, n] by layers n×n float32 resource variables in turn
// (output y): the model the import benchmarks use, about 16.8 MB of
// variables per layer at n = 2048. It returns the variables' size in bytes.
func MatMulChain(dir string, n, layers int) (int64, error) {
	g := &Graph{}
	out := g.Placeholder("x", smpb.DataType_DT_FLOAT, []int64{-1, int64(n)})
	w := make([]float32, n*n)
	for i := range w {
		w[i] = float32(i%97) * 1e-4
	}
	for l := range layers {
		k := g.ResourceVariable(fmt.Sprintf("dense_%d/kernel", l), []int64{int64(n), int64(n)}, w)
		out = g.Node(fmt.Sprintf("mm_%d", l), "MatMul", nil, out, k)
	}
	err := g.Write(dir, Signature{
		Inputs:  map[string]Arg{"x": {Tensor: "x:0", DType: smpb.DataType_DT_FLOAT, Dims: []int64{-1, int64(n)}}},
		Outputs: map[string]Arg{"y": {Tensor: out + ":0", DType: smpb.DataType_DT_FLOAT}},
	})
	return int64(layers) * int64(n) * int64(n) * 4, err
}
