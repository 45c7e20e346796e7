package convert

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
)

// What convert adds before it writes an fp16 variant of a ~100 MB model
// (testmodels.Wide(100): 25 MatMuls of 1024x1024): the normalizer and the
// data-aware fp16 pass on one sample, against loading and saving the same
// model, alternated in one loop (BENCHMARKS.md).
func BenchmarkNormalizeAnalyzeRatio(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "wide100.onnx")
	if err := (&onnx.Model{Proto: testmodels.Wide(100, 7)}).Save(path); err != nil {
		b.Fatal(err)
	}
	m, err := onnx.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	x, err := onnx.Random("x", onnx.Float, []int64{1, 1024}, 1)
	if err != nil {
		b.Fatal(err)
	}
	samples := []map[string]*onnx.Tensor{{"x": x}}
	out := filepath.Join(dir, "out.onnx")
	var base, norm, analyze time.Duration
	ctx := context.Background()
	for range b.N {
		runtime.GC()
		t0 := time.Now()
		l, err := onnx.Load(path)
		if err == nil {
			err = l.Save(out)
		}
		if err != nil {
			b.Fatal(err)
		}
		base += time.Since(t0)
		runtime.GC()
		t0 = time.Now()
		nm, _, err := normalize.Normalize(ctx, m, normalize.Options{RaiseFP16: true})
		if err != nil {
			b.Fatal(err)
		}
		norm += time.Since(t0)
		t0 = time.Now()
		if _, err := fp16.Analyze(ctx, nm, samples, fp16.AnalyzeOptions{}); err != nil {
			b.Fatal(err)
		}
		analyze += time.Since(t0)
	}
	b.ReportMetric(float64(norm)/float64(base), "normalize/base")
	b.ReportMetric(float64(analyze)/float64(base), "analyze/base")
	b.ReportMetric(float64(norm+analyze)/float64(base), "together/base")
}
