package onnx_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// The streaming save and the aliasing load agree with protobuf's own
// marshal and unmarshal, at every threshold.
func TestFastPathMatchesProtobuf(t *testing.T) {
	for _, threshold := range []int{1, 100, 64 << 10} {
		restore := onnx.SetBigRaw(threshold)
		want := testmodels.TinyNet(3)
		path := filepath.Join(t.TempDir(), "m.onnx")
		if err := (&onnx.Model{Proto: want}).Save(path); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(path)
		plain := &onnxpb.ModelProto{}
		if err := proto.Unmarshal(data, plain); err != nil {
			t.Fatalf("threshold %d: saved bytes do not parse with protobuf: %v", threshold, err)
		}
		if !proto.Equal(plain, want) {
			t.Errorf("threshold %d: streamed save parses to a different model", threshold)
		}
		m, err := onnx.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(m.Proto, want) {
			t.Errorf("threshold %d: fast load differs from the saved model", threshold)
		}
		// Deterministic: saving again gives the same bytes.
		path2 := filepath.Join(t.TempDir(), "m2.onnx")
		m.Save(path2)
		data2, _ := os.ReadFile(path2)
		if !bytes.Equal(data, data2) {
			t.Errorf("threshold %d: Save is not byte-stable", threshold)
		}
		restore()
	}
}

// A model over the protobuf limit is refused with ErrTooLarge, on both the
// streaming and the plain path, and the destination is left untouched.
func TestSaveTooLarge(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	os.WriteFile(path, []byte("previous"), 0o644)
	for _, threshold := range []int{1, 1 << 30} { // streaming, then plain marshal
		restoreRaw := onnx.SetBigRaw(threshold)
		restoreMax := onnx.SetMaxProto(10_000)
		err := (&onnx.Model{Proto: testmodels.TinyNet(1)}).Save(path)
		restoreMax()
		restoreRaw()
		if !errors.Is(err, onnx.ErrTooLarge) || !strings.Contains(err.Error(), "m.onnx") {
			t.Errorf("Save over the limit (threshold %d) = %v, want ErrTooLarge naming the file", threshold, err)
		}
		if b, _ := os.ReadFile(path); string(b) != "previous" {
			t.Errorf("a refused Save changed the destination")
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("a refused Save left %d files", len(entries))
		}
	}
}
