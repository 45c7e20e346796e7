package onnx_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// addSeeds adds the files of the shared corpus that match pattern, a glob
// relative to the corpus (none without it: the fuzz targets still run).
func addSeeds(f *testing.F, pattern ...string) {
	files, _ := filepath.Glob(testutil.CorpusPath(f, pattern...))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil && len(b) < 1<<20 {
			f.Add(b)
		}
	}
}

// FuzzLoadONNX: parsing arbitrary bytes never panics, and a model that
// parses re-marshals to a model that parses to the same message.
func FuzzLoadONNX(f *testing.F) {
	addSeeds(f, "onnx-node", "test_*", "model.onnx")
	addSeeds(f, "models", "model-navigator", "*.onnx")
	defer onnx.SetBigRaw(1)() // exercise the aliasing fast path on small inputs
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := onnx.Parse(data, "")
		plain := &onnxpb.ModelProto{}
		plainErr := proto.Unmarshal(data, plain)
		if (plainErr == nil) != (err == nil || !strings.Contains(err.Error(), "wire-format")) {
			t.Fatalf("fast decode error %v, protobuf error %v", err, plainErr)
		}
		if err != nil {
			return
		}
		if !proto.Equal(m.Proto, plain) {
			t.Fatal("fast decode differs from protobuf's")
		}
		_ = onnx.Summarize(m)
		out, err := m.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed model: %v", err)
		}
		m2, err := onnx.Parse(out, "")
		if err != nil {
			t.Fatalf("Parse(Marshal(m)) = %v", err)
		}
		if !proto.Equal(m.Proto, m2.Proto) {
			t.Fatal("Parse(Marshal(m)) differs from m")
		}
	})
}

// FuzzTensorCodec: decoding arbitrary TensorProto bytes never panics, and a
// tensor that decodes survives re-encoding in both storage forms.
func FuzzTensorCodec(f *testing.F) {
	addSeeds(f, "onnx-node", "test_*", "test_data_set_0", "*.pb")
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &onnxpb.TensorProto{}
		if proto.Unmarshal(data, p) != nil {
			return
		}
		tt, err := onnx.Decode(p)
		if err != nil {
			return
		}
		for _, form := range []onnx.Storage{onnx.Raw, onnx.Typed} {
			p2, err := onnx.Encode(tt, form)
			if err != nil {
				t.Fatalf("Encode(decoded %s) = %v", tt.Type, err)
			}
			t2, err := onnx.Decode(p2)
			if err != nil {
				t.Fatalf("Decode(Encode(decoded %s)) = %v", tt.Type, err)
			}
			if t2.Type != tt.Type || t2.Len() != tt.Len() || !sameBitsAny(tt, t2) {
				t.Fatalf("round trip of %s changed the values", tt.Type)
			}
		}
	})
}

func sameBitsAny(a, b *onnx.Tensor) bool {
	ra, rb := onnx.RawBytes(a), onnx.RawBytes(b)
	if a.Type == onnx.String {
		return sameBits(a.Data, b.Data)
	}
	return string(ra) == string(rb)
}
