package onnx_test

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

var (
	bigOnce sync.Once
	bigPath string
	bigDir  string
)

// bigModel writes a ~100 MB model once per test binary run.
func bigModel(b *testing.B) string {
	bigOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kiln-bench-")
		if err != nil {
			b.Fatal(err)
		}
		bigDir = dir
		bigPath = filepath.Join(dir, "wide100.onnx")
		m := &onnx.Model{Proto: testmodels.Wide(100, 7)}
		if err := m.Save(bigPath); err != nil {
			b.Fatal(err)
		}
	})
	return bigPath
}

func setBytes(b *testing.B, path string) {
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
}

// BenchmarkLoad100MB/baseline-read is os.ReadFile of the same bytes; the
// ratio of the two is what BENCHMARKS.md records.
func BenchmarkLoad100MB(b *testing.B) {
	path := bigModel(b)
	b.Run("baseline-read", func(b *testing.B) {
		setBytes(b, path)
		for i := 0; i < b.N; i++ {
			if _, err := os.ReadFile(path); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("onnx.Load", func(b *testing.B) {
		setBytes(b, path)
		for i := 0; i < b.N; i++ {
			if _, err := onnx.Load(path); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSave100MB/baseline-write writes the same bytes with the same
// temp-file + sync + rename as Save, so the difference is serialization.
func BenchmarkSave100MB(b *testing.B) {
	path := bigModel(b)
	m, err := onnx.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(bigDir, "out.onnx")
	b.Run("baseline-write", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			if err := atomicfile.WriteFile(out, data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("onnx.Save", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			if err := m.Save(out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLoadSaveRatio alternates the operation and its baseline in one
// loop, so that noise from other processes hits both alike, and reports the
// ratios as metrics (load/read, save/write). A GC runs before every timed
// step (outside the timing) so each starts from the same heap state rather
// than paying for the previous step's garbage.
func BenchmarkLoadSaveRatio(b *testing.B) {
	path := bigModel(b)
	out := filepath.Join(bigDir, "ratio.onnx")
	var read, load, write, save time.Duration
	timed := func(acc *time.Duration, f func() error) {
		runtime.GC()
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*acc += time.Since(t0)
	}
	for i := 0; i < b.N; i++ {
		var data []byte
		var m *onnx.Model
		timed(&read, func() (err error) { data, err = os.ReadFile(path); return })
		data = nil
		timed(&load, func() (err error) { m, err = onnx.Load(path); return })
		raw, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		timed(&write, func() error { return atomicfile.WriteFile(out, raw, 0o644) })
		timed(&save, func() error { return m.Save(out) })
		runtime.KeepAlive(data)
	}
	b.ReportMetric(float64(load)/float64(read), "load/read")
	b.ReportMetric(float64(save)/float64(write), "save/write")
	b.ReportMetric(float64(load.Milliseconds())/float64(b.N), "load-ms")
	b.ReportMetric(float64(read.Milliseconds())/float64(b.N), "read-ms")
}
