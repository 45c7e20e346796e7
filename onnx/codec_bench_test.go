package onnx_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// codecBenchTypes are the element types whose codec paths the benchmarks
// time: sizes 1, 2, 4 and 8, and the types with conversions of their own.
var codecBenchTypes = []onnx.DataType{onnx.Float, onnx.Float16, onnx.Int8, onnx.Uint8, onnx.Int32,
	onnx.Bool, onnx.Complex64}

// benchTensor decodes 1 Mi random elements of dt (bools as 0 and 1).
func benchTensor(b *testing.B, dt onnx.DataType) *onnx.Tensor {
	const n = 1 << 20
	raw := make([]byte, n*dt.Size())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range raw {
		raw[i] = byte(rng.Uint32())
		if dt == onnx.Bool {
			raw[i] &= 1
		}
	}
	d := int32(dt)
	t, err := onnx.Decode(&onnxpb.TensorProto{DataType: &d, Dims: []int64{n}, RawData: raw})
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// BenchmarkDecode times Decode from raw_data and from the typed fields.
func BenchmarkDecode(b *testing.B) {
	for _, form := range []onnx.Storage{onnx.Raw, onnx.Typed} {
		for _, dt := range codecBenchTypes {
			t := benchTensor(b, dt)
			p, err := onnx.Encode(t, form)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(storageName(form)+"/"+dt.String(), func(b *testing.B) {
				b.SetBytes(int64(t.Len() * dt.Size()))
				for b.Loop() {
					if _, err := onnx.Decode(p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkEncode times Encode to raw_data and to the typed fields.
func BenchmarkEncode(b *testing.B) {
	for _, form := range []onnx.Storage{onnx.Raw, onnx.Typed} {
		for _, dt := range codecBenchTypes {
			t := benchTensor(b, dt)
			b.Run(storageName(form)+"/"+dt.String(), func(b *testing.B) {
				b.SetBytes(int64(t.Len() * dt.Size()))
				for b.Loop() {
					if _, err := onnx.Encode(t, form); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func storageName(form onnx.Storage) string {
	if form == onnx.Raw {
		return "raw"
	}
	return "typed"
}
