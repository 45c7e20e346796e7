package check

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

// BenchmarkAccumulator measures Add on a classifier's logits and on a
// detector's probability map, the candidate a slightly perturbed copy of
// the reference as an fp16 variant's would be.
func BenchmarkAccumulator(b *testing.B) {
	for _, dims := range [][]int64{{8, 1000}, {1, 1, 640, 640}} {
		n := 1
		for _, d := range dims {
			n *= int(d)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		ref, got := make([]float32, n), make([]float32, n)
		for i := range ref {
			ref[i] = rng.Float32()
			got[i] = ref[i] * (1 + (rng.Float32()-0.5)*1e-3)
		}
		ids := make([]string, dims[0])
		for i := range ids {
			ids[i] = fmt.Sprint("s", i)
		}
		r, err := onnx.NewTensor("out", dims, ref)
		if err != nil {
			b.Fatal(err)
		}
		g, err := onnx.NewTensor("out", dims, got)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprint(dims), func(b *testing.B) {
			a := NewAccumulator("out", KindOf(dims, true), Defaults("fp16"))
			b.SetBytes(int64(8 * n))
			b.ReportAllocs()
			for b.Loop() {
				if err := a.Add(r, g, ids, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
