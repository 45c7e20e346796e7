package ort_test

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// A model whose weights kiln wrote to an external data file runs in ONNX
// Runtime (which reads the file itself) exactly like the inline model.
func TestExternalDataModelRuns(t *testing.T) {
	ortest.Init(t)
	dir := t.TempDir()
	m := &onnx.Model{Proto: testmodels.TinyNet(1)}
	inline, ext := filepath.Join(dir, "inline.onnx"), filepath.Join(dir, "ext.onnx")
	if err := m.Save(inline); err != nil {
		t.Fatal(err)
	}
	if err := m.SaveWith(ext, onnx.SaveOptions{ExternalData: "ext.onnx.data", ExternalThreshold: 1024}); err != nil {
		t.Fatal(err)
	}
	var outs []map[string]*onnx.Tensor
	for _, p := range []string{inline, ext} {
		s, err := ort.NewSession(p, ort.SessionOptions{})
		if err != nil {
			t.Fatalf("NewSession(%s) = %v", filepath.Base(p), err)
		}
		in, err := ort.SyntheticInputs(s.Inputs(), 2, 7)
		if err != nil {
			t.Fatal(err)
		}
		out, err := s.Run(context.Background(), in, nil)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	if !reflect.DeepEqual(outs[0]["probs"].Data, outs[1]["probs"].Data) {
		t.Error("the external-data model gives different outputs")
	}
}
