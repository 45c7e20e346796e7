package ort

import (
	"fmt"
	"math/rand/v2"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
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
	rng := rand.New(rand.NewPCG(seed, seed+1))
	out := make(map[string]*onnx.Tensor, len(infos))
	for _, in := range infos {
		if in.Kind != "tensor" {
			return nil, fmt.Errorf("input %q is a %s; only tensor inputs can be generated", in.Name, in.Kind)
		}
		if !in.Ranked {
			return nil, fmt.Errorf("input %q has no recorded rank; cannot generate data for it", in.Name)
		}
		dims := syntheticDims(in.Dims, batch)
		n, err := onnx.NumElements(dims)
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", in.Name, err)
		}
		var data any
		switch in.Type {
		case onnx.Float:
			d := make([]float32, n)
			for i := range d {
				d[i] = rng.Float32()
			}
			data = d
		case onnx.Double:
			d := make([]float64, n)
			for i := range d {
				d[i] = rng.Float64()
			}
			data = d
		case onnx.Float16:
			d := make([]float16.Float16, n)
			for i := range d {
				d[i] = float16.Fromfloat32(rng.Float32())
			}
			data = d
		case onnx.BFloat16:
			d := make([]onnx.BF16, n)
			for i := range d {
				d[i] = onnx.BF16From(rng.Float32())
			}
			data = d
		case onnx.String:
			data = make([]string, n)
		default:
			num, ok := numerics[in.Type]
			if !ok {
				return nil, fmt.Errorf("input %q: cannot generate %s data", in.Name, in.Type)
			}
			data = num.zeros(n)
		}
		out[in.Name] = &onnx.Tensor{Name: in.Name, Type: in.Type, Dims: dims, Data: data}
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
