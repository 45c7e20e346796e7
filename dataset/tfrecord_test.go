package dataset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/kiln-ml/kiln/onnx"
)

func tfrecordOf(t testing.TB, records ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewTFRecordWriter(&buf)
	for _, r := range records {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func readRecords(b []byte) ([][]byte, error) {
	r := NewTFRecordReader(bytes.NewReader(b))
	var out [][]byte
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, rec)
	}
}

func TestTFRecordFraming(t *testing.T) {
	recs := [][]byte{[]byte("first"), {}, bytes.Repeat([]byte{0xab}, 70000)}
	file := tfrecordOf(t, recs...)
	// An empty record as TensorFlow writes it (quoted in tensorboardX's
	// record writer tests).
	if got, want := tfrecordOf(t, []byte{}), []byte("\x00\x00\x00\x00\x00\x00\x00\x00)\x03\x98\x07\xd8\xea\x82\xa2"); !bytes.Equal(got, want) {
		t.Errorf("empty record = %q, want %q", got, want)
	}
	got, err := readRecords(file)
	if err != nil || !reflect.DeepEqual(got, [][]byte{[]byte("first"), {}, recs[2]}) {
		t.Fatalf("readRecords(write(recs)) = %d records, %v", len(got), err)
	}
	flip := func(i int) []byte {
		b := bytes.Clone(file)
		b[i] ^= 1
		return b
	}
	second := 12 + 5 + 4 // offset of record 1
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"data byte", flip(14), "record 0 (offset 0): corrupt TFRecord: data CRC mismatch"},
		{"length byte", flip(second), "record 1 (offset 21): corrupt TFRecord: length CRC mismatch"},
		{"data CRC", flip(len(file) - 1), "record 2 (offset 37): corrupt TFRecord: data CRC mismatch"},
		{"truncated data", file[:len(file)-10], "record 2 (offset 37): corrupt TFRecord: truncated data"},
		{"truncated header", file[:second+3], "record 1 (offset 21): corrupt TFRecord: truncated header"},
	}
	for _, tt := range tests {
		_, err := readRecords(tt.file)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: readRecords() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestExampleRoundTrip(t *testing.T) {
	ex := Example{
		"image/encoded":     {Bytes: [][]byte{[]byte("\xff\xd8jpeg")}},
		"image/class/label": {Int64s: []int64{-1, 0, 1 << 40}},
		"bbox":              {Floats: []float32{0.25, -1}},
		"empty":             {},
	}
	got, err := ParseExample(ex.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ex) {
		t.Errorf("ParseExample(Marshal(ex)) = %v, want %v", got, ex)
	}
	// Unpacked lists, as older writers produce them, read the same.
	var ints, floats []byte
	ints = append(ints, 0x08, 0x05, 0x08, 0x07) // Int64List{value: 5, value: 7}
	floats = append(floats, 0x0d, 0, 0, 0x80, 0x3f)
	feature := func(kind byte, list []byte) []byte { return append([]byte{kind<<3 | 2, byte(len(list))}, list...) }
	entry := func(key string, f []byte) []byte {
		e := append([]byte{0x0a, byte(len(key))}, key...)
		e = append(e, 0x12, byte(len(f)))
		return append(e, f...)
	}
	var feats []byte
	for _, e := range [][]byte{entry("i", feature(3, ints)), entry("f", feature(2, floats))} {
		feats = append(append(feats, 0x0a, byte(len(e))), e...)
	}
	msg := append([]byte{0x0a, byte(len(feats))}, feats...)
	got, err = ParseExample(msg)
	if want := (Example{"i": {Int64s: []int64{5, 7}}, "f": {Floats: []float32{1}}}); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ParseExample(unpacked) = %v, %v, want %v", got, err, want)
	}
	if _, err := ParseExample([]byte{0x0a, 0x05, 0x01}); err == nil {
		t.Error("ParseExample(truncated) = nil error")
	}
}

func imageExample(t testing.TB, img []byte, label int64) []byte {
	return Example{"image/encoded": {Bytes: [][]byte{img}}, "image/class/label": {Int64s: []int64{label}}, "image/format": {Bytes: [][]byte{[]byte("png")}}}.Marshal()
}

func TestTFRecordSource(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	solid := func(v uint8) []byte {
		return pngOf(t, 4, 4, func(x, y int) color.NRGBA { return color.NRGBA{v, v, v, 255} })
	}
	shard0 := tfrecordOf(t, imageExample(t, solid(10), 3), imageExample(t, solid(20), 4))
	shard1 := tfrecordOf(t, imageExample(t, solid(30), 5), []byte("not an example \xff"), Example{"other": {}}.Marshal())
	os.WriteFile(filepath.Join(dir, "calib-00000-of-00002"), shard0, 0o644)
	os.WriteFile(filepath.Join(dir, "calib-00001-of-00002"), shard1, 0o644)
	os.WriteFile(filepath.Join(dir, "README.txt"), []byte("ignored"), 0o644)

	sig := []onnx.ValueInfo{floatInput("input_1", -1, 2, 2, 3)}
	src, err := Open(ctx, Spec{Path: dir, Inputs: sig}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 5 {
		t.Fatalf("Len() = %d, want 5", src.Len())
	}
	for i, want := range []struct {
		id    string
		label int64
		v     float32
		err   string
	}{
		{"calib-00000-of-00002#0", 3, 10, ""},
		{"calib-00000-of-00002#1", 4, 20, ""},
		{"calib-00001-of-00002#0", 5, 30, ""},
		{"calib-00001-of-00002#1", 0, 0, "calib-00001-of-00002#1: "},
		{"calib-00001-of-00002#2", 0, 0, `calib-00001-of-00002#2: feature "image/encoded": want one encoded image, found 0`},
	} {
		s, err := src.Sample(ctx, i)
		if want.err != "" {
			if err == nil || !strings.Contains(err.Error(), want.err) {
				t.Errorf("Sample(%d) = %v, want error %q", i, err, want.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Sample(%d) = %v", i, err)
		}
		x := s.Tensors["input_1"]
		if s.ID != filepath.Join(dir, want.id) || s.Label != want.label || !reflect.DeepEqual(x.Dims, []int64{2, 2, 3}) || x.Data.([]float32)[5] != want.v {
			t.Errorf("Sample(%d) = %s label %d %v %v, want %s label %d values %v", i, s.ID, s.Label, x.Dims, x.Data, want.id, want.label, want.v)
		}
	}

	// A flipped byte is found when the file is indexed, and named.
	bad := bytes.Clone(shard0)
	bad[len(bad)-20] ^= 0x40
	p := filepath.Join(dir, "bad.tfrecord")
	os.WriteFile(p, bad, 0o644)
	_, err = Open(ctx, Spec{Path: p}, nil)
	if want := p + "#1: offset"; err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("Open(flipped byte) = %v, want a corrupt-record error naming %q", err, want)
	}
}

// genFS serves one virtual TFRecord file of n identical-size records,
// generated on demand, and counts the bytes it hands out.
type genFS struct {
	n      int
	record []byte // one framed record
	served int64
}

func newGenFS(t testing.TB, n int) *genFS {
	img := pngOf(t, 2, 2, func(x, y int) color.NRGBA { return color.NRGBA{1, 2, 3, 255} })
	return &genFS{n: n, record: tfrecordOf(t, imageExample(t, img, 7))}
}

func (g *genFS) size() int64 { return int64(g.n * len(g.record)) }

func (g *genFS) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	return g.OpenRange(ctx, name, 0, -1)
}

func (g *genFS) OpenRange(_ context.Context, name string, off, length int64) (io.ReadCloser, error) {
	if name != "gen.tfrecord" {
		return nil, fmt.Errorf("open %s: %w", name, os.ErrNotExist)
	}
	if length < 0 || off+length > g.size() {
		length = g.size() - off
	}
	return io.NopCloser(&genReader{g: g, off: off, end: off + length}), nil
}

func (g *genFS) Size(context.Context, string) (int64, error) { return g.size(), nil }

func (g *genFS) List(_ context.Context, dir string) ([]string, error) {
	return []string{"gen.tfrecord"}, nil
}

type genReader struct {
	g        *genFS
	off, end int64
}

func (r *genReader) Read(p []byte) (int, error) {
	if r.off >= r.end {
		return 0, io.EOF
	}
	rl := int64(len(r.g.record))
	n := copy(p[:min(int64(len(p)), r.end-r.off)], r.g.record[r.off%rl:])
	r.off += int64(n)
	r.g.served += int64(n)
	return n, nil
}

func TestStreaming(t *testing.T) {
	const n = 10000
	g := newGenFS(t, n)
	ctx := context.Background()
	src, err := Open(ctx, Spec{Path: "gen.tfrecord"}, g)
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != n {
		t.Fatalf("Len() = %d, want %d", src.Len(), n)
	}
	// Open read the file once, to check CRCs, and kept 16 bytes per record.
	if g.served != g.size() {
		t.Errorf("Open read %d bytes, want one pass over %d", g.served, g.size())
	}
	ts := src.(*tfrecordSource)
	index := int64(cap(ts.recs)) * int64(unsafe.Sizeof(recordLoc{}))
	if unsafe.Sizeof(recordLoc{}) != 16 || index > 2*16*n || index*5 > g.size() {
		t.Errorf("index takes %d bytes for a %d-byte file, want 16 bytes a record", index, g.size())
	}
	// A sample reads its record and nothing else.
	g.served = 0
	s, err := src.Sample(ctx, n-1)
	if err != nil {
		t.Fatal(err)
	}
	if g.served != int64(len(g.record)) || s.ID != fmt.Sprintf("gen.tfrecord#%d", n-1) || s.Label != 7 {
		t.Errorf("Sample(%d) read %d bytes (want %d), ID %s, label %d", n-1, g.served, len(g.record), s.ID, s.Label)
	}
	// Batching streams: every sample once, no more than the records.
	g.served = 0
	count := 0
	for b, err := range Batches(ctx, src, Select(1000, n, 1), BatchOptions{Size: 64}) {
		if err != nil {
			t.Fatal(err)
		}
		count += len(b.IDs)
	}
	if count != 1000 || g.served != 1000*int64(len(g.record)) {
		t.Errorf("Batches over 1000 samples: %d samples, %d bytes read, want 1000 and %d", count, g.served, 1000*len(g.record))
	}
}

func FuzzTFRecord(f *testing.F) {
	f.Add(tfrecordOf(f, []byte("a"), []byte{}))
	f.Add(tfrecordOf(f, Example{"image/encoded": {Bytes: [][]byte{[]byte("x")}}, "l": {Int64s: []int64{-3}}, "f": {Floats: []float32{1}}}.Marshal()))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, _ := readRecords(b) // records up to the first error
		again, err := readRecords(tfrecordOf(t, recs...))
		if err != nil || len(again) != len(recs) {
			t.Fatalf("re-reading %d written records: %d, %v", len(recs), len(again), err)
		}
		for i := range recs {
			if !bytes.Equal(recs[i], again[i]) {
				t.Fatalf("record %d changed", i)
			}
			ex, err := ParseExample(recs[i])
			if err != nil {
				continue
			}
			ex2, err := ParseExample(ex.Marshal())
			if err != nil || !reflect.DeepEqual(ex, ex2) {
				t.Fatalf("ParseExample(Marshal(ex)) = %v, %v, want %v", ex2, err, ex)
			}
		}
		// Raw bytes as an Example must not panic either.
		ParseExample(b)
	})
}
