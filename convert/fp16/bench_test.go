package fp16

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

// BenchmarkFP16Wide100MB compares the FP16 rewrite of a ~100 MB model
// (load, Convert, save) with loading and saving the same model in the same
// run; the target is at most twice the baseline. SetBytes is the input
// file's size for both.
func BenchmarkFP16Wide100MB(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "wide100.onnx")
	if err := (&onnx.Model{Proto: testmodels.Wide(100, 7)}).Save(path); err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "out.onnx")
	b.Run("baseline-load+save", func(b *testing.B) {
		b.SetBytes(st.Size())
		for i := 0; i < b.N; i++ {
			m, err := onnx.Load(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Save(out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("load+Convert+save", func(b *testing.B) {
		b.SetBytes(st.Size())
		for i := 0; i < b.N; i++ {
			m, err := onnx.Load(path)
			if err != nil {
				b.Fatal(err)
			}
			h, _, err := Convert(m, Options{KeepIOTypes: true})
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Save(out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFP16Ratio alternates load+save and load+Convert+save of the same
// ~100 MB model in one loop, with a GC before each timed step, and reports
// fp16/baseline (target at most 2).
func BenchmarkFP16Ratio(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "wide100.onnx")
	if err := (&onnx.Model{Proto: testmodels.Wide(100, 7)}).Save(path); err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "out.onnx")
	var base, fp16 time.Duration
	step := func(acc *time.Duration, convert bool) {
		runtime.GC()
		t0 := time.Now()
		m, err := onnx.Load(path)
		if err != nil {
			b.Fatal(err)
		}
		if convert {
			if m, _, err = Convert(m, Options{KeepIOTypes: true}); err != nil {
				b.Fatal(err)
			}
		}
		if err := m.Save(out); err != nil {
			b.Fatal(err)
		}
		*acc += time.Since(t0)
	}
	for i := 0; i < b.N; i++ {
		step(&base, false)
		step(&fp16, true)
	}
	b.ReportMetric(float64(base.Milliseconds())/float64(b.N), "base-ms")
	b.ReportMetric(float64(fp16.Milliseconds())/float64(b.N), "fp16-ms")
	b.ReportMetric(float64(fp16)/float64(base), "fp16/base")
}
