package savedmodel

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// The bundle tests write what the corpus lacks (several shards, string
// vectors, broken tables) with smtest, TensorFlow's on-disk format written
// in Go; these adapt its API to the package's own entry types.

// stored is one tensor to write: its TensorFlow type, shape and elements.
type stored struct {
	key   string
	dtype smpb.DataType
	dims  []int64
	data  any // []string for DT_STRING, otherwise what onnx.NewTensor takes
	shard int32
}

func shapeProto(dims []int64) *smpb.TensorShapeProto { return smtest.ShapeProto(dims) }

// writeBundle writes tensors as a bundle at prefix with the given shard
// count and returns the prefix.
func writeBundle(t *testing.T, prefix string, shards int32, tensors []stored) string {
	t.Helper()
	ts := make([]smtest.Tensor, len(tensors))
	for i, s := range tensors {
		ts[i] = smtest.Tensor{Key: s.key, DType: s.dtype, Dims: s.dims, Data: s.data, Shard: s.shard}
	}
	if err := smtest.WriteBundle(prefix, shards, ts); err != nil {
		t.Fatal(err)
	}
	return prefix
}

// writeTable writes sorted entries as TensorFlow does.
func writeTable(t testing.TB, kvs []kv) []byte {
	t.Helper()
	out := make([]smtest.KV, len(kvs))
	for i, e := range kvs {
		out[i] = smtest.KV{Key: e.key, Value: e.value}
	}
	b, err := smtest.Table(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
