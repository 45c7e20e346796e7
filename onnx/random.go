package onnx

import (
	"fmt"
	"math/rand/v2"

	"github.com/x448/float16"
)

// Random returns a tensor of seeded random data for smoke runs, timing and
// checks on random inputs: floating-point values uniform in [0,1),
// integers and booleans zero (a safe index for Gather-style inputs),
// strings empty. The same seed gives the same tensor.
func Random(name string, dt DataType, dims []int64, seed uint64) (*Tensor, error) {
	n, err := NumElements(dims)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	rng := rand.New(rand.NewPCG(seed, seed+1))
	var data any
	switch dt {
	case Float:
		d := make([]float32, n)
		for i := range d {
			d[i] = rng.Float32()
		}
		data = d
	case Double:
		d := make([]float64, n)
		for i := range d {
			d[i] = rng.Float64()
		}
		data = d
	case Float16:
		d := make([]float16.Float16, n)
		for i := range d {
			d[i] = float16.Fromfloat32(rng.Float32())
		}
		data = d
	case BFloat16:
		d := make([]BF16, n)
		for i := range d {
			d[i] = BF16From(rng.Float32())
		}
		data = d
	case String:
		data = make([]string, n)
	default:
		c, ok := codecs[dt]
		if !ok || dt.Size() == 0 || dt == Complex64 || dt == Complex128 {
			return nil, fmt.Errorf("tensor %q: cannot make random %s data", name, dt)
		}
		data = c.fromRaw(make([]byte, n*dt.Size())) // zeros of the type
	}
	return &Tensor{Name: name, Type: dt, Dims: dims, Data: data}, nil
}
