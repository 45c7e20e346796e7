package onnx_test

import (
	"bytes"
	"os"
	"path/filepath"
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
