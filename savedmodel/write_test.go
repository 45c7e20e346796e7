package savedmodel

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/syndtr/goleveldb/leveldb/opt"
	"github.com/syndtr/goleveldb/leveldb/table"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// A test-only bundle writer, following TensorFlow's BundleWriter as
// formats.md §6.3-6.4 describes it, so that tests can make bundles with
// what the corpus lacks (several shards, string vectors, slices).

// stored is one tensor to write: its TensorFlow type, shape and elements.
type stored struct {
	key   string
	dtype smpb.DataType
	dims  []int64
	data  any // []string for DT_STRING, otherwise what onnx.RawBytes takes
	shard int32
}

func shapeProto(dims []int64) *smpb.TensorShapeProto {
	s := &smpb.TensorShapeProto{}
	for _, d := range dims {
		s.Dim = append(s.Dim, &smpb.TensorShapeProto_Dim{Size: d})
	}
	return s
}

// encodeStrings lays out a DT_STRING tensor and returns its unmasked crc.
func encodeStrings(s []string) ([]byte, uint32) {
	var out []byte
	var crc uint32
	var buf [8]byte
	for _, e := range s {
		out = binary.AppendUvarint(out, uint64(len(e)))
		binary.LittleEndian.PutUint32(buf[:], uint32(len(e)))
		crc = crc32.Update(crc, castagnoli, buf[:4])
	}
	out = binary.LittleEndian.AppendUint32(out, mask(crc))
	crc = crc32.Update(crc, castagnoli, out[len(out)-4:])
	for _, e := range s {
		out = append(out, e...)
		crc = crc32.Update(crc, castagnoli, []byte(e))
	}
	return out, crc
}

// tensorBytes returns what the bundle stores for t and its unmasked crc.
func tensorBytes(t *testing.T, s stored) ([]byte, uint32) {
	t.Helper()
	if s.dtype == smpb.DataType_DT_STRING {
		return encodeStrings(s.data.([]string))
	}
	ot, err := onnx.NewTensor(s.key, s.dims, s.data)
	if err != nil {
		t.Fatal(err)
	}
	raw := onnx.RawBytes(ot)
	return raw, crc32.Checksum(raw, castagnoli)
}

// writeBundle writes tensors as a bundle at prefix with the given shard
// count and returns the prefix.
func writeBundle(t *testing.T, prefix string, shards int32, tensors []stored) string {
	t.Helper()
	data := make([][]byte, shards)
	kvs := []kv{{key: []byte{}, value: mustMarshal(t, &smpb.BundleHeaderProto{
		NumShards: shards, Version: &smpb.VersionDef{Producer: 1},
	})}}
	for _, s := range tensors {
		raw, crc := tensorBytes(t, s)
		e := &smpb.BundleEntryProto{
			Dtype: s.dtype, Shape: shapeProto(s.dims), ShardId: s.shard,
			Offset: int64(len(data[s.shard])), Size: int64(len(raw)), Crc32C: mask(crc),
		}
		data[s.shard] = append(data[s.shard], raw...)
		kvs = append(kvs, kv{[]byte(s.key), mustMarshal(t, e)})
	}
	slices.SortFunc(kvs, func(a, b kv) int { return bytes.Compare(a.key, b.key) })
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, d := range data {
		if err := os.WriteFile(DataFile(prefix, int32(i), shards), d, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(prefix+".index", writeTable(t, kvs), 0o644); err != nil {
		t.Fatal(err)
	}
	return prefix
}

// writeTable writes sorted entries as TensorFlow does: uncompressed,
// 256 KiB blocks, a restart every 16 keys.
func writeTable(t testing.TB, kvs []kv) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := table.NewWriter(&buf, &opt.Options{
		BlockSize: 262144, BlockRestartInterval: 16, Compression: opt.NoCompression,
	})
	for _, e := range kvs {
		if err := w.Append(e.key, e.value); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
