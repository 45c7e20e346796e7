package testmodels_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

// The model committed under testdata/ is exactly what the generator writes,
// so `go generate` is reproducible and nobody edits it by hand.
func TestCommittedTinyNetIsGenerated(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("..", "..", "testdata", "tinynet.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tinynet.onnx")
	if err := (&onnx.Model{Proto: testmodels.TinyNet(1)}).Save(path); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, want) {
		t.Error("testdata/tinynet.onnx differs from TinyNet(1): run make generate")
	}
	m, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := onnx.Summarize(m)
	if !s.Batch.Batchable || s.Params.Count < 10000 || len(s.Inputs) != 1 || s.Inputs[0].Name != "images" {
		t.Errorf("TinyNet summary = batchable %v, %d params, inputs %v", s.Batch.Batchable, s.Params.Count, s.Inputs)
	}
}

func TestWideSize(t *testing.T) {
	m := &onnx.Model{Proto: testmodels.Wide(8, 1)}
	var total int64
	for _, p := range m.Params() {
		total += p.Bytes
	}
	if total < 8<<20 || total > 9<<20 {
		t.Errorf("Wide(8) has %d bytes of weights, want about 8 MiB", total)
	}
}

func TestWriteImagesDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if err := testmodels.WriteImages(a, 3, 16, 12, 5); err != nil {
		t.Fatal(err)
	}
	testmodels.WriteImages(b, 3, 16, 12, 5)
	for _, name := range []string{"img_0000.png", "img_0001.png", "img_0002.png"} {
		x, err := os.ReadFile(filepath.Join(a, name))
		if err != nil {
			t.Fatal(err)
		}
		y, _ := os.ReadFile(filepath.Join(b, name))
		if !bytes.Equal(x, y) {
			t.Errorf("WriteImages is not deterministic for %s", name)
		}
	}
	x, _ := os.ReadFile(filepath.Join(a, "img_0000.png"))
	y, _ := os.ReadFile(filepath.Join(a, "img_0001.png"))
	if bytes.Equal(x, y) {
		t.Error("WriteImages wrote the same image twice")
	}
}
