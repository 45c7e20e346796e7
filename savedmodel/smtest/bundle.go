// Package smtest writes SavedModels in TensorFlow's own on-disk format
// (formats.md §6), for tests and benchmarks: saved_model.pb holding a
// TF1-style GraphDef and its signatures, and a variables bundle whose index
// is a LevelDB table written the way TensorFlow's BundleWriter writes it.
package smtest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"

	"github.com/syndtr/goleveldb/leveldb/opt"
	"github.com/syndtr/goleveldb/leveldb/table"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// Tensor is one checkpoint entry to write.
type Tensor struct {
	Key   string
	DType smpb.DataType
	Dims  []int64
	// Data is []string for DT_STRING, otherwise a slice onnx.NewTensor
	// takes ([]float32, []int32, []int64, []bool, ...).
	Data  any
	Shard int32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Mask is LevelDB's and TensorFlow's masked crc32c.
func Mask(c uint32) uint32 { return (c>>15 | c<<17) + 0xa282ead8 }

// ShapeProto is a TensorShapeProto of known dims.
func ShapeProto(dims []int64) *smpb.TensorShapeProto {
	s := &smpb.TensorShapeProto{}
	for _, d := range dims {
		s.Dim = append(s.Dim, &smpb.TensorShapeProto_Dim{Size: d})
	}
	return s
}

// DataFile names a bundle shard: PREFIX.data-00000-of-00001.
func DataFile(prefix string, shard, shards int32) string {
	return fmt.Sprintf("%s.data-%05d-of-%05d", prefix, shard, shards)
}

// encodeStrings lays out a DT_STRING tensor (formats.md §6.4) and returns
// its unmasked crc.
func encodeStrings(s []string) ([]byte, uint32) {
	var out []byte
	var crc uint32
	var buf [4]byte
	for _, e := range s {
		out = binary.AppendUvarint(out, uint64(len(e)))
		binary.LittleEndian.PutUint32(buf[:], uint32(len(e)))
		crc = crc32.Update(crc, castagnoli, buf[:])
	}
	out = binary.LittleEndian.AppendUint32(out, Mask(crc))
	crc = crc32.Update(crc, castagnoli, out[len(out)-4:])
	for _, e := range s {
		out = append(out, e...)
		crc = crc32.Update(crc, castagnoli, []byte(e))
	}
	return out, crc
}

// Bytes returns what a bundle stores for t and its unmasked crc32c.
func Bytes(t Tensor) ([]byte, uint32, error) {
	if t.DType == smpb.DataType_DT_STRING {
		s, ok := t.Data.([]string)
		if !ok {
			return nil, 0, fmt.Errorf("tensor %q: DT_STRING data is %T, want []string", t.Key, t.Data)
		}
		b, crc := encodeStrings(s)
		return b, crc, nil
	}
	ot, err := onnx.NewTensor(t.Key, t.Dims, t.Data)
	if err != nil {
		return nil, 0, err
	}
	raw := onnx.RawBytes(ot)
	return raw, crc32.Checksum(raw, castagnoli), nil
}

// KV is one table entry.
type KV struct{ Key, Value []byte }

// WriteBundle writes tensors as a bundle of shards data files at prefix
// ("DIR/variables/variables"): one index entry per tensor, appended back
// to back in its shard, and the BundleHeaderProto under the empty key.
func WriteBundle(prefix string, shards int32, tensors []Tensor) error {
	if shards < 1 {
		shards = 1
	}
	data := make([][]byte, shards)
	kvs := []KV{{Key: []byte{}, Value: marshal(&smpb.BundleHeaderProto{
		NumShards: shards, Version: &smpb.VersionDef{Producer: 1},
	})}}
	for _, t := range tensors {
		if t.Shard < 0 || t.Shard >= shards {
			return fmt.Errorf("tensor %q: shard %d of %d", t.Key, t.Shard, shards)
		}
		raw, crc, err := Bytes(t)
		if err != nil {
			return err
		}
		e := &smpb.BundleEntryProto{
			Dtype: t.DType, Shape: ShapeProto(t.Dims), ShardId: t.Shard,
			Offset: int64(len(data[t.Shard])), Size: int64(len(raw)), Crc32C: Mask(crc),
		}
		data[t.Shard] = append(data[t.Shard], raw...)
		kvs = append(kvs, KV{[]byte(t.Key), marshal(e)})
	}
	slices.SortFunc(kvs, func(a, b KV) int { return bytes.Compare(a.Key, b.Key) })
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		return err
	}
	for i, d := range data {
		if err := os.WriteFile(DataFile(prefix, int32(i), shards), d, 0o644); err != nil {
			return err
		}
	}
	idx, err := Table(kvs)
	if err != nil {
		return err
	}
	return os.WriteFile(prefix+".index", idx, 0o644)
}

// Table writes sorted entries as TensorFlow's table::TableBuilder does for
// a bundle index: uncompressed, 256 KiB blocks, a restart every 16 keys.
func Table(kvs []KV) ([]byte, error) {
	var buf bytes.Buffer
	w := table.NewWriter(&buf, &opt.Options{
		BlockSize: 262144, BlockRestartInterval: 16, Compression: opt.NoCompression,
	})
	for _, e := range kvs {
		if err := w.Append(e.Key, e.Value); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func marshal(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err) // only for messages this package builds
	}
	return b
}
