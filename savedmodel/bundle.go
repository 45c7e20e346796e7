package savedmodel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// bundleVersion is the tensor-bundle format version TensorFlow writes and
// kiln reads (kTensorBundleVersion).
const bundleVersion = 1

// ErrChecksum is wrapped by errors for stored bytes whose crc32c does not
// match the one recorded for them.
var ErrChecksum = errors.New("checksum mismatch")

type entry = smpb.BundleEntryProto

// Bundle is an opened tensor bundle: a checkpoint's index, read whole, and
// the data shards it points into, read one tensor at a time.
type Bundle struct {
	prefix  string
	fsys    dataset.FS
	header  *smpb.BundleHeaderProto
	entries map[string]*entry
	keys    []string
}

// OpenBundle reads the index of the bundle at prefix ("DIR/variables/variables",
// local or gs://) through fsys (nil means dataset.Local): prefix+".index".
func OpenBundle(ctx context.Context, fsys dataset.FS, prefix string) (*Bundle, error) {
	if fsys == nil {
		fsys = dataset.Local{}
	}
	name := prefix + ".index"
	data, err := readAll(ctx, fsys, name)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	b, err := parseIndex(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	b.prefix, b.fsys = prefix, fsys
	return b, nil
}

// parseIndex decodes the header and entries of a variables.index.
func parseIndex(data []byte) (*Bundle, error) {
	kvs, err := readTable(data)
	if err != nil {
		return nil, err
	}
	if len(kvs) == 0 || len(kvs[0].key) != 0 {
		return nil, errors.New("no bundle header (the entry with the empty key)")
	}
	h := &smpb.BundleHeaderProto{}
	if err := proto.Unmarshal(kvs[0].value, h); err != nil {
		return nil, fmt.Errorf("bundle header: %w", err)
	}
	if err := checkHeader(h); err != nil {
		return nil, err
	}
	b := &Bundle{header: h, entries: make(map[string]*entry, len(kvs)-1)}
	for _, e := range kvs[1:] {
		key := string(e.key)
		if _, dup := b.entries[key]; dup || key == "" {
			return nil, fmt.Errorf("key %q appears twice", key)
		}
		be := &entry{}
		if err := proto.Unmarshal(e.value, be); err != nil {
			return nil, fmt.Errorf("entry %q: %w", key, err)
		}
		if len(be.GetSlices()) == 0 && (be.GetShardId() < 0 || be.GetShardId() >= h.GetNumShards() || be.GetOffset() < 0 || be.GetSize() < 0) {
			return nil, fmt.Errorf("entry %q: shard %d, offset %d, size %d outside a %d-shard bundle",
				key, be.GetShardId(), be.GetOffset(), be.GetSize(), h.GetNumShards())
		}
		b.entries[key] = be
		b.keys = append(b.keys, key)
	}
	slices.Sort(b.keys)
	return b, nil
}

func checkHeader(h *smpb.BundleHeaderProto) error {
	if h.GetNumShards() < 1 {
		return fmt.Errorf("bundle header: %d shards", h.GetNumShards())
	}
	if h.GetEndianness() != smpb.BundleHeaderProto_LITTLE {
		return errors.New("bundle header: big-endian bundles are not supported")
	}
	if v := h.GetVersion(); v.GetMinConsumer() > bundleVersion || slices.Contains(v.GetBadConsumers(), bundleVersion) {
		return fmt.Errorf("bundle header: format version (producer %d, min consumer %d) is newer than version %d",
			v.GetProducer(), v.GetMinConsumer(), bundleVersion)
	}
	return nil
}

// Prefix is the bundle's prefix, as passed to OpenBundle.
func (b *Bundle) Prefix() string { return b.prefix }

// Header is the bundle's header entry.
func (b *Bundle) Header() *smpb.BundleHeaderProto { return b.header }

// Keys returns the checkpoint keys, sorted.
func (b *Bundle) Keys() []string { return slices.Clone(b.keys) }

// Entry returns the index entry of key: its dtype, shape and location.
func (b *Bundle) Entry(key string) (*smpb.BundleEntryProto, bool) {
	e, ok := b.entries[key]
	return e, ok
}

// DataFile returns the name of a bundle's data shard:
// PREFIX.data-00000-of-00001.
func DataFile(prefix string, shard, shards int32) string {
	return fmt.Sprintf("%s.data-%05d-of-%05d", prefix, shard, shards)
}

// Tensor reads and decodes the tensor stored under key, after checking its
// crc32c. DT_STRING tensors decode to onnx.String ([]string); other types as
// ONNXType maps them. Errors name the key and the data file.
func (b *Bundle) Tensor(ctx context.Context, key string) (*onnx.Tensor, error) {
	p, err := b.TensorProto(ctx, key)
	if err != nil {
		return nil, err
	}
	return onnx.Decode(p)
}

// TensorProto reads the tensor stored under key, after checking its crc32c,
// as the ONNX initializer named key that onnx.Encode(Tensor(key), onnx.Raw)
// would give, byte for byte. A numeric tensor's raw_data is the buffer its
// bytes were read into (the bundle stores them little-endian, as ONNX
// does): neither decoded nor copied. Errors name the key and the data file.
func (b *Bundle) TensorProto(ctx context.Context, key string) (*onnxpb.TensorProto, error) {
	e, ok := b.entries[key]
	if !ok {
		return nil, fmt.Errorf("%s.index: no tensor %q", b.prefix, key)
	}
	file := DataFile(b.prefix, e.GetShardId(), b.header.GetNumShards())
	p, err := b.tensor(ctx, key, e, file)
	if err != nil {
		return nil, fmt.Errorf("tensor %q in %s: %w", key, file, err)
	}
	return p, nil
}

func (b *Bundle) tensor(ctx context.Context, key string, e *entry, file string) (*onnxpb.TensorProto, error) {
	if len(e.GetSlices()) > 0 {
		return nil, fmt.Errorf("partitioned into %d slices, which kiln does not read", len(e.GetSlices()))
	}
	dt, err := ONNXType(e.GetDtype())
	if err != nil {
		return nil, err
	}
	dims, n, err := fullDims(e.GetShape())
	if err != nil {
		return nil, err
	}
	if dt != onnx.String && int64(n)*int64(dt.Size()) != e.GetSize() {
		return nil, fmt.Errorf("stored size %d bytes, %s%v needs %d", e.GetSize(), e.GetDtype(), dims, int64(n)*int64(dt.Size()))
	}
	raw, crc, err := readRange(ctx, b.fsys, file, e.GetOffset(), e.GetSize())
	if err != nil {
		return nil, err
	}
	if dt == onnx.String {
		s, scrc, err := decodeStrings(raw, n)
		if err != nil {
			return nil, err
		}
		if err := verify(scrc, e.GetCrc32C()); err != nil {
			return nil, err
		}
		return onnx.Encode(&onnx.Tensor{Name: key, Type: onnx.String, Dims: dims, Data: s}, onnx.Raw)
	}
	if err := verify(crc, e.GetCrc32C()); err != nil {
		return nil, err
	}
	return rawInitializer(key, dt, dims, n, raw)
}

// readChunk is how much readRange reads before adding it to the crc32c,
// small enough that the bytes are still in cache.
const readChunk = 256 << 10

// readRange reads size bytes of name at offset, with a range read where
// fsys has one, and returns them with their (unmasked) crc32c, computed
// as they arrive rather than in a second pass over memory.
func readRange(ctx context.Context, fsys dataset.FS, name string, offset, size int64) ([]byte, uint32, error) {
	var rc io.ReadCloser
	var err error
	if r, ok := fsys.(dataset.RangeFS); ok {
		rc, err = r.OpenRange(ctx, name, offset, size)
	} else if rc, err = fsys.Open(ctx, name); err == nil {
		_, err = io.CopyN(io.Discard, rc, offset)
	}
	if err != nil {
		if rc != nil {
			rc.Close()
		}
		return nil, 0, err
	}
	defer rc.Close()
	// The buffer starts at the stored size up to 256 MiB, so that the
	// bytes are read in place, in one copy; beyond, it grows as data
	// arrives, so that a wrong size in a corrupt index does not allocate it.
	data := make([]byte, 0, min(size, 1<<28))
	var crc uint32
	for int64(len(data)) < size {
		if len(data) == cap(data) {
			data = slices.Grow(data, int(min(size-int64(len(data)), int64(len(data)))))
		}
		end := len(data) + int(min(readChunk, int64(cap(data)-len(data)), size-int64(len(data))))
		k, err := io.ReadFull(rc, data[len(data):end])
		crc = crc32.Update(crc, castagnoli, data[len(data):len(data)+k])
		data = data[:len(data)+k]
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
	}
	if int64(len(data)) != size {
		return nil, 0, fmt.Errorf("file ends %d bytes into the tensor's %d (offset %d)", len(data), size, offset)
	}
	return data, crc, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const crcMaskDelta = 0xa282ead8

// mask is LevelDB's and TensorFlow's masked crc32c.
func mask(c uint32) uint32 { return (c>>15 | c<<17) + crcMaskDelta }

func verify(crc, stored uint32) error {
	if mask(crc) != stored {
		return fmt.Errorf("%w: stored crc32c %#08x, data has %#08x", ErrChecksum, stored, mask(crc))
	}
	return nil
}

// decodeStrings decodes a DT_STRING tensor as TensorFlow's bundle writer
// stores it (formats.md §6.4): n varint64 lengths, a masked crc32c of the
// lengths, then the bytes. It returns the unmasked crc32c the writer records
// for the tensor, which covers each length as a little-endian uint32 (uint64
// when it does not fit), the length checksum and the bytes.
func decodeStrings(raw []byte, n int) ([]string, uint32, error) {
	if n > len(raw) { // every length takes at least a byte
		return nil, 0, fmt.Errorf("%d bytes cannot hold %d string lengths", len(raw), n)
	}
	lens := make([]uint64, n)
	var crc uint32
	var buf [8]byte
	rest, total := raw, uint64(0)
	for i := range lens {
		l, k := binary.Uvarint(rest)
		if k <= 0 {
			return nil, 0, fmt.Errorf("string %d: bad length", i)
		}
		lens[i], rest, total = l, rest[k:], total+l
		binary.LittleEndian.PutUint64(buf[:], l)
		w := 4
		if l > 1<<32-1 {
			w = 8
		}
		crc = crc32.Update(crc, castagnoli, buf[:w])
		if l > uint64(len(raw)) {
			return nil, 0, fmt.Errorf("string %d: length %d is more than the tensor holds", i, l)
		}
	}
	if len(rest) < 4 {
		return nil, 0, errors.New("no length checksum after the string lengths")
	}
	if err := verify(crc, binary.LittleEndian.Uint32(rest)); err != nil {
		return nil, 0, fmt.Errorf("string lengths: %w", err)
	}
	crc = crc32.Update(crc, castagnoli, rest[:4])
	rest = rest[4:]
	if total != uint64(len(rest)) {
		return nil, 0, fmt.Errorf("string lengths add up to %d bytes, %d are stored", total, len(rest))
	}
	out := make([]string, n)
	for i, l := range lens {
		out[i], rest = string(rest[:l]), rest[l:]
	}
	return out, crc32.Update(crc, castagnoli, raw[len(raw)-int(total):]), nil
}
