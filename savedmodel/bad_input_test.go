package savedmodel_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// denseModel writes x·W+b with W and b in a bundle of shards files and
// returns the directory.
func denseModel(t *testing.T, shards int32, extra func(g *smtest.Graph) string) string {
	t.Helper()
	g := &smtest.Graph{}
	g.Placeholder("x", smpb.DataType_DT_FLOAT, []int64{-1, 2})
	w := g.Variable("dense/kernel", []int64{2, 2}, []float32{1, 2, 3, 4})
	b := g.ResourceVariable("dense/bias", []int64{2}, []float32{1, 1})
	out := g.Node("y", "BiasAdd", nil, g.Node("mm", "MatMul", nil, "x", w), b)
	if extra != nil {
		out = extra(g)
	}
	g.Vars[1].Shard = shards - 1
	dir := t.TempDir()
	sm := g.SavedModel(map[string]smtest.Signature{"serving_default": {
		Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: smpb.DataType_DT_FLOAT, Dims: []int64{-1, 2}}},
		Outputs: map[string]smtest.Arg{"y": {Tensor: out + ":0", DType: smpb.DataType_DT_FLOAT}},
	}})
	if err := smtest.WriteModel(dir, sm, shards, g.Vars); err != nil {
		t.Fatal(err)
	}
	return dir
}

// convertDir opens and converts dir, returning the first error.
func convertDir(dir string, o savedmodel.ConvertOptions) error {
	m, err := savedmodel.Open(context.Background(), dir, nil)
	if err != nil {
		return err
	}
	_, err = savedmodel.Convert(context.Background(), m, o)
	return err
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one naming %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %q", err, p)
		}
	}
	t.Log(err)
}

func TestBadInput(t *testing.T) {
	data := filepath.Join("variables", "variables.data-00000-of-00001")
	t.Run("truncated saved_model.pb", func(t *testing.T) {
		dir := denseModel(t, 1, nil)
		pb := filepath.Join(dir, "saved_model.pb")
		b, _ := os.ReadFile(pb)
		if err := os.WriteFile(pb, b[:len(b)/2], 0o644); err != nil {
			t.Fatal(err)
		}
		wantErr(t, convertDir(dir, savedmodel.ConvertOptions{}), pb)
	})
	t.Run("variables crc mismatch", func(t *testing.T) {
		dir := denseModel(t, 1, nil)
		name := filepath.Join(dir, data)
		b, _ := os.ReadFile(name)
		b[3] ^= 0x40
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		err := convertDir(dir, savedmodel.ConvertOptions{})
		if !errors.Is(err, savedmodel.ErrChecksum) {
			t.Errorf("error %v does not wrap ErrChecksum", err)
		}
		wantErr(t, err, name, "dense/", "checksum")
	})
	t.Run("missing shard", func(t *testing.T) {
		dir := denseModel(t, 2, nil)
		name := filepath.Join(dir, "variables", "variables.data-00001-of-00002")
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
		wantErr(t, convertDir(dir, savedmodel.ConvertOptions{}), name, "dense/bias")
	})
	t.Run("unsupported op", func(t *testing.T) {
		dir := denseModel(t, 1, func(g *smtest.Graph) string { return g.Node("fancy", "FancyOp", nil, "y") })
		var u *savedmodel.UnsupportedOpsError
		err := convertDir(dir, savedmodel.ConvertOptions{})
		if !errors.As(err, &u) {
			t.Errorf("error %v is not an UnsupportedOpsError", err)
		}
		wantErr(t, err, filepath.Join(dir, "saved_model.pb"), "fancy (op FancyOp)")
	})
	t.Run("signature not found", func(t *testing.T) {
		dir := denseModel(t, 1, nil)
		wantErr(t, convertDir(dir, savedmodel.ConvertOptions{Signature: "predict"}), `"predict"`, "serving_default", "saved_model.pb")
	})
	t.Run("tf.Example string input", func(t *testing.T) {
		wantErr(t, convertDir(exampleModel(t), savedmodel.ConvertOptions{}), "saved_model.pb", "examples", "DT_STRING")
	})
}

// exampleModel is an Estimator-style export: a DT_STRING batch of
// serialized tf.Examples parsed by ParseExampleV2.
func exampleModel(t *testing.T) string {
	g := &smtest.Graph{}
	g.Placeholder("input_example_tensor", smpb.DataType_DT_STRING, []int64{-1})
	empty := g.Const("empty", &smpb.TensorProto{Dtype: smpb.DataType_DT_STRING, TensorShape: smtest.ShapeProto([]int64{0})})
	keys := g.Const("keys", &smpb.TensorProto{Dtype: smpb.DataType_DT_STRING, TensorShape: smtest.ShapeProto([]int64{1}), StringVal: [][]byte{[]byte("x")}})
	def := g.Floats("default", []int64{0})
	g.Node("ParseExample/ParseExampleV2", "ParseExampleV2", smtest.Attrs{"num_sparse": smtest.Int64(0)},
		"input_example_tensor", empty, empty, keys, empty, def)
	g.Node("y", "Relu", f32, "ParseExample/ParseExampleV2:0")
	dir := t.TempDir()
	err := g.Write(dir, smtest.Signature{
		Inputs:  map[string]smtest.Arg{"examples": {Tensor: "input_example_tensor:0", DType: smpb.DataType_DT_STRING, Dims: []int64{-1}}},
		Outputs: map[string]smtest.Arg{"y": {Tensor: "y:0", DType: smpb.DataType_DT_FLOAT}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
