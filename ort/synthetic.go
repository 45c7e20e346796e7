package ort

import (
	"fmt"

	"github.com/kiln-ml/kiln/onnx"
)

// SyntheticInputs builds one input tensor per model input for smoke runs and
// timing: dynamic dimensions become batch for the first axis and 1
// elsewhere; floats are uniform in [0,1), integers and booleans are zero (a
// safe index for Gather-style inputs), strings are empty. The same seed
// gives the same tensors.
func SyntheticInputs(infos []IOInfo, batch int, seed uint64) (map[string]*onnx.Tensor, error) {
	if batch < 1 {
		batch = 1
	}
	out := make(map[string]*onnx.Tensor, len(infos))
	for i, in := range infos {
		if in.Kind != "tensor" {
			return nil, fmt.Errorf("input %q is a %s; only tensor inputs can be generated", in.Name, in.Kind)
		}
		if !in.Ranked {
			return nil, fmt.Errorf("input %q has no recorded rank; cannot generate data for it", in.Name)
		}
		t, err := onnx.Random(in.Name, in.Type, syntheticDims(in.Dims, batch), seed+uint64(i))
		if err != nil {
			return nil, err
		}
		out[in.Name] = t
	}
	return out, nil
}

// syntheticDims fixes a model's dimensions: batch for a dynamic first axis,
// 1 for any other dynamic one.
func syntheticDims(model []int64, batch int) []int64 {
	dims := make([]int64, len(model))
	for i, d := range model {
		switch {
		case d >= 0:
			dims[i] = d
		case i == 0:
			dims[i] = int64(batch)
		default:
			dims[i] = 1
		}
	}
	return dims
}
