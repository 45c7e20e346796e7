package savedmodel_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// bigModel writes a chain of six 2048x2048 MatMuls (about 100 MB of
// float32 variables) and returns its directory and the variables' size.
func bigModel(b *testing.B) (string, int64) {
	dir := b.TempDir()
	vars, err := smtest.MatMulChain(dir, 2048, 6, 1)
	if err != nil {
		b.Fatal(err)
	}
	return dir, vars
}

// importOnce is what `kiln import` does: open, convert, save the ONNX. It
// returns the time Open and Convert took.
func importOnce(b *testing.B, dir, out string) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	m, err := savedmodel.Open(ctx, dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	c, err := savedmodel.Convert(ctx, m, savedmodel.ConvertOptions{})
	if err != nil {
		b.Fatal(err)
	}
	conv := time.Since(t0)
	if err := c.Model.Save(out); err != nil {
		b.Fatal(err)
	}
	return conv
}

// readOnce reads every file of the SavedModel, the floor import stands
// on, and returns their bytes.
func readOnce(b *testing.B, dir string) [][]byte {
	var all [][]byte
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		all = append(all, data)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return all
}

// BenchmarkImportSavedModel times import against reading the same bytes,
// alternated in one process: time-ratio is the target (≤ 2×), and
// open+convert-ratio the part before Save. It also times writing the bytes
// read as one file the way Save does (a synced temporary file renamed into
// place): floor-ratio, read plus write over read, is the least any import
// that writes its ONNX can take, and import/floor how close import is.
// Peak memory is measured per process by bench/importmem.sh: in here the
// garbage of the previous iteration would inflate it.
func BenchmarkImportSavedModel(b *testing.B) {
	dir, vars := bigModel(b)
	tmp := b.TempDir()
	out, copyOut := filepath.Join(tmp, "model.onnx"), filepath.Join(tmp, "copy")
	readOnce(b, dir) // warm the page cache for both
	var tImport, tConvert, tRead, tWrite time.Duration
	b.ResetTimer()
	for range b.N {
		runtime.GC() // each step starts from the same heap
		t0 := time.Now()
		tConvert += importOnce(b, dir, out)
		tImport += time.Since(t0)
		runtime.GC()
		t0 = time.Now()
		files := readOnce(b, dir)
		tRead += time.Since(t0)
		t0 = time.Now()
		if err := atomicfile.Write(copyOut, 0o644, func(w io.Writer) error {
			for _, f := range files {
				if _, err := w.Write(f); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		tWrite += time.Since(t0)
	}
	b.StopTimer()
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(b.N) }
	b.ReportMetric(perOp(tImport), "import-ms/op")
	b.ReportMetric(perOp(tConvert), "open+convert-ms/op")
	b.ReportMetric(perOp(tRead), "read-ms/op")
	b.ReportMetric(perOp(tWrite), "write-ms/op")
	b.ReportMetric(float64(tImport)/float64(tRead), "time-ratio")
	b.ReportMetric(float64(tConvert)/float64(tRead), "open+convert-ratio")
	b.ReportMetric(float64(tRead+tWrite)/float64(tRead), "floor-ratio")
	b.ReportMetric(float64(tImport)/float64(tRead+tWrite), "import/floor")
	b.ReportMetric(float64(vars)/1e6, "vars-MB")
}

// The benchmark's model imports and computes x·W·W·W, checked against the
// product computed here from the weights smtest.MatMulChain writes.
func TestMatMulChain(t *testing.T) {
	const n, layers = 8, 3
	dir := t.TempDir()
	vars, err := smtest.MatMulChain(dir, n, layers, 1)
	if err != nil {
		t.Fatal(err)
	}
	if vars != layers*n*n*4 {
		t.Errorf("MatMulChain = %d bytes of variables, want %d", vars, layers*n*n*4)
	}
	x := make([]float32, 2*n)
	for i := range x {
		x[i] = (float32(i*7%13) - 4) * 1e4
	}
	_, out := importRun(t, dir, savedmodel.ConvertOptions{}, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{2, n}, Data: x}})
	want := make([]float64, len(x))
	for i, v := range x {
		want[i] = float64(v)
	}
	for range layers {
		next := make([]float64, len(want))
		for r := range 2 {
			for c := range n {
				for k := range n {
					next[r*n+c] += want[r*n+k] * float64(k*n+c-48) * 1e-4 // w[i] = (i%97-48)·1e-4, i < 97 here
				}
			}
		}
		want = next
	}
	compare(t, "y", floats(t, out["y"]), want, 1e-6)
}
