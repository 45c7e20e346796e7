package ort_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// TestRoundTrip checks that every ONNX file of the corpus survives
// Load → Marshal → Parse → Marshal byte for byte.
func TestRoundTrip(t *testing.T) {
	root := testutil.Corpus(t)
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".onnx") {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no .onnx files in the corpus")
	}
	for _, p := range paths {
		rel, _ := filepath.Rel(root, p)
		t.Run(filepath.ToSlash(rel), func(t *testing.T) {
			m, err := onnx.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			first, err := m.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			m2, err := onnx.Parse(first, "")
			if err != nil {
				t.Fatal(err)
			}
			second, err := m2.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, second) {
				t.Errorf("Marshal after Parse differs: %d bytes, first %d bytes", len(second), len(first))
			}
		})
	}
	t.Logf("%d ONNX files round-tripped", len(paths))
}

// TestRoundTripRuns checks that the re-marshalled conformance models give
// ONNX Runtime bit-identical outputs to the original files.
func TestRoundTripRuns(t *testing.T) {
	ortest.Init(t)
	for _, tc := range nodeTests(t) {
		if _, listed := unrunnable[tc.name]; listed {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(tc.dir, "model.onnx")
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m, err := onnx.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			again, err := m.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			in, _ := testData(t, m, tc.dir)
			want, err := runOnce(orig, in)
			if err != nil {
				t.Fatalf("original model: %v", err)
			}
			got, err := runOnce(again, in)
			if err != nil {
				t.Fatalf("re-marshalled model: %v", err)
			}
			for name, w := range want {
				if !sameBits(got[name], w) {
					t.Errorf("output %q differs between the original and the re-marshalled model", name)
				}
			}
		})
	}
}

// TestNewSessionFromFile opens a corpus model by path, which lets ONNX
// Runtime read the file itself.
func TestNewSessionFromFile(t *testing.T) {
	ortest.Init(t)
	dir := testutil.Corpus(t, "onnx-node", "test_cast_FLOAT_to_FLOAT16")
	s, err := ort.NewSession(filepath.Join(dir, "model.onnx"), ort.SessionOptions{OptLevel: ort.OptDisabled})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	in, want := testData(t, m, dir)
	runMatches(t, s, in, want)
	if _, err := ort.NewSession(filepath.Join(dir, "missing.onnx"), ort.SessionOptions{}); err == nil || !strings.Contains(err.Error(), "missing.onnx") {
		t.Errorf("NewSession(missing file) = %v, want error naming the file", err)
	}
}
