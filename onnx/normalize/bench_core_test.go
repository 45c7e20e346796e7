package normalize

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// BenchmarkNormalize times Normalize with zero Options on the corpus's real
// models beside onnx.Load plus Save of the same model, the floor any
// rewrite of a model file pays.
func BenchmarkNormalize(b *testing.B) {
	ortest.Init(b)
	paths, _ := filepath.Glob(testutil.CorpusPath(b, "models", "real", "*.onnx"))
	if len(paths) == 0 {
		b.Skip("no models in the corpus's models/real")
	}
	for _, p := range paths {
		name := filepath.Base(p)
		b.Run(name+"/normalize", func(b *testing.B) {
			m, err := onnx.Load(p)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := Normalize(context.Background(), m, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/load-save", func(b *testing.B) {
			out := filepath.Join(b.TempDir(), "model.onnx")
			b.ReportAllocs()
			for b.Loop() {
				m, err := onnx.Load(p)
				if err != nil {
					b.Fatal(err)
				}
				if err := m.Save(out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
