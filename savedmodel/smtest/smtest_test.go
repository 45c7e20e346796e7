package smtest_test

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// TestRoundTrip writes a SavedModel with variables of several types over
// two shards and reads it back through savedmodel.Open and Bundle.
func TestRoundTrip(t *testing.T) {
	g := &smtest.Graph{}
	x := g.Placeholder("x", smpb.DataType_DT_FLOAT, []int64{-1, 3})
	w := g.Variable("dense/kernel", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 6})
	b := g.ResourceVariable("dense/bias", []int64{2}, []float32{0.5, -0.5})
	mm := g.Node("mm", "MatMul", nil, x, w)
	g.Node("y", "BiasAdd", nil, mm, b)
	vars := append(g.Vars,
		smtest.Tensor{Key: "step", DType: smpb.DataType_DT_INT64, Dims: []int64{}, Data: []int64{42}, Shard: 1},
		smtest.Tensor{Key: "ids", DType: smpb.DataType_DT_INT32, Dims: []int64{3}, Data: []int32{-1, 0, 7}, Shard: 1},
		smtest.Tensor{Key: "flags", DType: smpb.DataType_DT_BOOL, Dims: []int64{2}, Data: []bool{true, false}},
		smtest.Tensor{Key: "names", DType: smpb.DataType_DT_STRING, Dims: []int64{3}, Data: []string{"a", "", "long string"}, Shard: 1},
	)
	sm := g.SavedModel(map[string]smtest.Signature{"serving_default": {
		Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: smpb.DataType_DT_FLOAT, Dims: []int64{-1, 3}}},
		Outputs: map[string]smtest.Arg{"y": {Tensor: "y:0", DType: smpb.DataType_DT_FLOAT}},
	}})
	dir := t.TempDir()
	if err := smtest.WriteModel(dir, sm, 2, vars); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := savedmodel.Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m.Proto, sm) {
		t.Error("saved_model.pb reads back different")
	}
	bd, err := m.Bundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := bd.Header().GetNumShards(); n != 2 {
		t.Errorf("header num_shards = %d, want 2", n)
	}
	if got := bd.Keys(); len(got) != len(vars) {
		t.Errorf("keys = %q, want %d", got, len(vars))
	}
	for _, v := range vars {
		e, ok := bd.Entry(v.Key)
		if !ok || e.GetDtype() != v.DType || e.GetShardId() != v.Shard {
			t.Errorf("entry %q = %v, want dtype %v shard %d", v.Key, e, v.DType, v.Shard)
			continue
		}
		got, err := bd.Tensor(ctx, v.Key)
		if err != nil {
			t.Errorf("Tensor(%q) = %v", v.Key, err)
			continue
		}
		if !reflect.DeepEqual(got.Data, v.Data) || !reflect.DeepEqual(got.Dims, v.Dims) && len(v.Dims) > 0 {
			t.Errorf("Tensor(%q) = %v %v, want %v %v", v.Key, got.Dims, got.Data, v.Dims, v.Data)
		}
	}
	sigs, err := m.Signatures("")
	if err != nil || len(sigs) != 1 {
		t.Fatalf("Signatures = %v, %v", sigs, err)
	}
}
