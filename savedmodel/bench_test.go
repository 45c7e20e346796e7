package savedmodel_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// bigModel writes a chain of six 2048x2048 MatMuls (about 100 MB of
// float32 variables) and returns its directory and the variables' size.
func bigModel(b *testing.B) (string, int64) {
	const n, layers = 2048, 6
	dir := b.TempDir()
	if err := smtest.MatMulChain(dir, n, layers, 1); err != nil {
		b.Fatal(err)
	}
	return dir, int64(layers * n * n * 4)
}

// importOnce is what `kiln import` does: open, convert, save the ONNX.
func importOnce(b *testing.B, dir, out string) {
	ctx := context.Background()
	m, err := savedmodel.Open(ctx, dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	c, err := savedmodel.Convert(ctx, m, savedmodel.ConvertOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Model.Save(out); err != nil {
		b.Fatal(err)
	}
}

// readOnce reads every file of the SavedModel, the floor import stands on.
func readOnce(b *testing.B, dir string) int64 {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		total += int64(len(data))
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return total
}

// procKB reads a VmHWM/VmRSS line of /proc/self/status in bytes.
func procKB(field string) int64 {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// BenchmarkImportSavedModel times import against reading the same bytes,
// side by side, and reports import's peak RSS (VmHWM, reset before the
// first import) over the variables' size.
func BenchmarkImportSavedModel(b *testing.B) {
	dir, vars := bigModel(b)
	out := filepath.Join(b.TempDir(), "model.onnx")
	readOnce(b, dir) // warm the page cache for both
	runtime.GC()
	debug.FreeOSMemory()
	base := procKB("VmRSS")
	resetErr := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	var tImport, tRead time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		importOnce(b, dir, out)
		t1 := time.Now()
		readOnce(b, dir)
		tImport, tRead = tImport+t1.Sub(t0), tRead+time.Since(t1)
	}
	b.StopTimer()
	hwm := procKB("VmHWM")
	b.ReportMetric(float64(tImport.Milliseconds())/float64(b.N), "import-ms/op")
	b.ReportMetric(float64(tRead.Milliseconds())/float64(b.N), "read-ms/op")
	b.ReportMetric(float64(tImport)/float64(tRead), "time-ratio")
	b.ReportMetric(float64(vars)/1e6, "vars-MB")
	if resetErr == nil && hwm > 0 {
		b.ReportMetric(float64(hwm)/1e6, "peak-RSS-MB")
		b.ReportMetric(float64(hwm-base)/float64(vars), "RSS-over-base/vars")
		b.ReportMetric(float64(hwm)/float64(vars), "RSS/vars")
	}
}
