package onnx_test

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

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

// BenchmarkCodec times Decode and Encode of 1 Mi elements of each type, in
// raw_data and in the typed fields, against copying the same number of
// bytes (what a little-endian decode costs at best), alternating in one
// loop so that noise hits both alike. The metrics are the ratios.
func BenchmarkCodec(b *testing.B) {
	for _, form := range []onnx.Storage{onnx.Raw, onnx.Typed} {
		for _, dt := range codecBenchTypes {
			t := benchTensor(b, dt)
			p, err := onnx.Encode(t, form)
			if err != nil {
				b.Fatal(err)
			}
			src := make([]byte, t.Len()*dt.Size())
			b.Run(storageName(form)+"/"+dt.String(), func(b *testing.B) {
				var dec, enc, cp time.Duration
				for b.Loop() {
					t0 := time.Now()
					dst := make([]byte, len(src))
					copy(dst, src)
					t1 := time.Now()
					if _, err := onnx.Decode(p); err != nil {
						b.Fatal(err)
					}
					t2 := time.Now()
					if _, err := onnx.Encode(t, form); err != nil {
						b.Fatal(err)
					}
					cp, dec, enc = cp+t1.Sub(t0), dec+t2.Sub(t1), enc+time.Since(t2)
					runtime.KeepAlive(dst)
				}
				b.ReportMetric(float64(dec)/float64(cp), "decode/copy")
				b.ReportMetric(float64(enc)/float64(cp), "encode/copy")
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
