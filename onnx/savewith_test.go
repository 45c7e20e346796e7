package onnx_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

func TestSaveWithExternalData(t *testing.T) {
	dir := t.TempDir()
	want := testmodels.TinyNet(1)
	m := &onnx.Model{Proto: proto.Clone(want).(*onnxpb.ModelProto)}
	path := filepath.Join(dir, "model.onnx")
	if err := m.SaveWith(path, onnx.SaveOptions{ExternalData: "model.onnx.data", ExternalThreshold: 4096}); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m.Proto, want) {
		t.Error("SaveWith changed the model in memory")
	}
	st, err := os.Stat(filepath.Join(dir, "model.onnx.data"))
	if err != nil {
		t.Fatal(err)
	}
	small, _ := os.Stat(path)
	if st.Size() < 30000 || small.Size() > 15000 {
		t.Errorf("data file %d bytes, model %d bytes: the big weights did not move out", st.Size(), small.Size())
	}
	// Loading resolves the external data back into an equal model.
	got, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.Proto, want) {
		t.Error("Load(SaveWith(m)) differs from m")
	}
	// Offsets are 4096-aligned, as the ONNX external data format recommends.
	raw, _ := onnx.LoadWith(path, onnx.LoadOptions{SkipExternalData: true})
	n := 0
	for _, tp := range raw.Graph().GetInitializer() {
		for _, kv := range tp.GetExternalData() {
			if kv.GetKey() == "offset" {
				n++
				v, err := strconv.Atoi(kv.GetValue())
				if err != nil || v%4096 != 0 {
					t.Errorf("tensor %s at offset %d, not 4096-aligned", tp.GetName(), v)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no initializer refers to the external data file")
	}
	for _, bad := range []string{"../x.data", "sub/x.data", "model.onnx"} {
		if err := m.SaveWith(path, onnx.SaveOptions{ExternalData: bad}); err == nil {
			t.Errorf("SaveWith(ExternalData %q) = nil error", bad)
		}
	}
}
