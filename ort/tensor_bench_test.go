package ort_test

import (
	"context"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// benchTensorTypes are element types with different paths across the
// binding: numeric, float16 (custom data, widened when dynamic), bool.
var benchTensorTypes = []onnx.DataType{onnx.Float, onnx.Float16, onnx.Int64, onnx.Uint8, onnx.Bool}

// BenchmarkTensorIdentity times a Run of Identity over 48 Ki elements of a
// dynamic batch, which is mostly the conversions to and from ONNX Runtime
// values.
func BenchmarkTensorIdentity(b *testing.B) {
	ortest.Init(b)
	for _, dt := range benchTensorTypes {
		b.Run(dt.String(), func(b *testing.B) {
			s, err := ort.NewSessionFromBytes(identityModel(b, "Identity", dt, dt, dynNx3), ort.SessionOptions{IntraOpThreads: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			in, err := ort.SyntheticInputs(s.Inputs(), 1<<14, 1)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for b.Loop() {
				if _, err := s.Run(ctx, in, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSyntheticInputs times building a batch of 48 Ki elements.
func BenchmarkSyntheticInputs(b *testing.B) {
	for _, dt := range benchTensorTypes {
		b.Run(dt.String(), func(b *testing.B) {
			infos := []ort.IOInfo{{Name: "x", Kind: "tensor", Type: dt, Ranked: true, Dims: []int64{-1, 3}}}
			for b.Loop() {
				if _, err := ort.SyntheticInputs(infos, 1<<14, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
