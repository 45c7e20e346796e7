package pack

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
)

// BenchmarkGCSUpload publishes 16 files of 16 MiB to fake-gcs-server (its
// own process, in memory) with one stream and with eight; every iteration
// writes a fresh prefix, so nothing is skipped.
func BenchmarkGCSUpload(b *testing.B) {
	e := startEmulator(b, "")
	c := emulatorClient(b, e.host)
	repo := benchRepo(b, 16, 16<<20)
	for _, jobs := range []int{1, 8} {
		b.Run(fmt.Sprintf("jobs=%d", jobs), func(b *testing.B) {
			b.SetBytes(16 * 16 << 20)
			for range b.N {
				to := fmt.Sprintf("gs://%s/bench/j%d-%d", testBucket, jobs, benchPrefixes.Add(1))
				cfg := Config{Repo: repo, To: []Destination{{Kind: KindGCS, Path: to[len("gs://"):]}}}
				if _, err := Run(context.Background(), cfg, WithGCS(GCS{Client: c, Jobs: jobs})); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchPrefixes numbers the prefixes, so that no run (-count included)
// finds its objects already there.
var benchPrefixes atomic.Int64

// benchRepo writes a repository of one checked model holding n files of
// size bytes.
func benchRepo(tb testing.TB, n int, size int64) string {
	tb.Helper()
	repo := filepath.Join(tb.TempDir(), "repo")
	if err := os.MkdirAll(filepath.Join(repo, "tinynet_onnx_fp32", "1"), 0o755); err != nil {
		tb.Fatal(err)
	}
	rec, _ := json.Marshal(&check.Record{Verdict: check.VerdictPass, By: "serve", Checked: time.Unix(1, 0).UTC()})
	man := manifest.New("kiln bench")
	man.Put(&manifest.Model{Name: "tinynet_onnx_fp32", Variant: manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: manifest.FP32},
		Source: manifest.DigestBytes(nil), Version: 1, Status: manifest.StatusOK, Checks: rec})
	if err := writeManifest(repo, man); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		addFile(tb, repo, fmt.Sprintf("1/shard%02d.bin", i), size, uint64(100+i))
	}
	return repo
}
