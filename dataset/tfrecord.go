package dataset

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sort"

	"github.com/kiln-ml/kiln/onnx"
	"google.golang.org/protobuf/encoding/protowire"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is TFRecord's masked CRC-32C.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// maxRecord bounds one record, so a corrupt length cannot exhaust memory.
const maxRecord = 1 << 30

// ErrCorruptRecord is wrapped by errors for TFRecord framing that does not
// check out: a CRC mismatch, a truncated record, an impossible length.
var ErrCorruptRecord = errors.New("corrupt TFRecord")

// TFRecordReader reads records from a TFRecord stream, checking both CRCs.
type TFRecordReader struct {
	r   *bufio.Reader
	n   int   // records read
	off int64 // offset of the next record
}

// NewTFRecordReader reads records from r.
func NewTFRecordReader(r io.Reader) *TFRecordReader {
	return &TFRecordReader{r: bufio.NewReader(r)}
}

// Next returns the next record's data, or io.EOF after the last. Errors name
// the record index; framing errors wrap ErrCorruptRecord.
func (t *TFRecordReader) Next() ([]byte, error) {
	data, size, err := readRecord(t.r, true)
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("record %d (offset %d): %w", t.n, t.off, err)
	}
	t.n++
	t.off += size
	return data, nil
}

// readRecord reads one record; with keep false it checks and drops the
// data. size is the record's length on disk.
func readRecord(r io.Reader, keep bool) (data []byte, size int64, err error) {
	var head [12]byte
	if n, err := io.ReadFull(r, head[:]); err != nil {
		if n == 0 && err == io.EOF {
			return nil, 0, io.EOF
		}
		return nil, 0, fmt.Errorf("%w: truncated header", ErrCorruptRecord)
	}
	if got, want := binary.LittleEndian.Uint32(head[8:]), maskedCRC(head[:8]); got != want {
		return nil, 0, fmt.Errorf("%w: length CRC mismatch (stored %08x, computed %08x)", ErrCorruptRecord, got, want)
	}
	length := binary.LittleEndian.Uint64(head[:8])
	if length > maxRecord {
		return nil, 0, fmt.Errorf("%w: length %d is more than %d", ErrCorruptRecord, length, maxRecord)
	}
	h := crc32.New(castagnoli)
	var w io.Writer = h
	var buf *[]byte
	if keep {
		b := make([]byte, 0, min(length, 1<<20))
		buf = &b
		w = io.MultiWriter(h, sliceWriter{buf})
	}
	if _, err := io.CopyN(w, r, int64(length)); err != nil {
		return nil, 0, fmt.Errorf("%w: truncated data (%d bytes expected)", ErrCorruptRecord, length)
	}
	var foot [4]byte
	if _, err := io.ReadFull(r, foot[:]); err != nil {
		return nil, 0, fmt.Errorf("%w: truncated data CRC", ErrCorruptRecord)
	}
	c := h.Sum32()
	if got, want := binary.LittleEndian.Uint32(foot[:]), (c>>15|c<<17)+0xa282ead8; got != want {
		return nil, 0, fmt.Errorf("%w: data CRC mismatch (stored %08x, computed %08x)", ErrCorruptRecord, got, want)
	}
	if keep {
		data = *buf
	}
	return data, int64(length) + 16, nil
}

type sliceWriter struct{ b *[]byte }

func (s sliceWriter) Write(p []byte) (int, error) {
	*s.b = append(*s.b, p...)
	return len(p), nil
}

// TFRecordWriter writes records in TFRecord framing.
type TFRecordWriter struct{ w io.Writer }

// NewTFRecordWriter writes records to w.
func NewTFRecordWriter(w io.Writer) *TFRecordWriter { return &TFRecordWriter{w} }

// Write writes one record.
func (t *TFRecordWriter) Write(data []byte) error {
	var head [12]byte
	binary.LittleEndian.PutUint64(head[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(head[8:], maskedCRC(head[:8]))
	var foot [4]byte
	binary.LittleEndian.PutUint32(foot[:], maskedCRC(data))
	for _, b := range [][]byte{head[:], data, foot[:]} {
		if _, err := t.w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// Feature is one tf.Example feature; exactly one list is set.
type Feature struct {
	Bytes  [][]byte
	Floats []float32
	Int64s []int64
}

// Example is a tf.Example: features by name.
type Example map[string]Feature

// ParseExample decodes a serialized tf.Example
// (Example{features=1: Features{feature=1: map<string, Feature>}}).
func ParseExample(b []byte) (Example, error) {
	ex := Example{}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, entry []byte) error {
			if num != 1 || typ != protowire.BytesType {
				return nil
			}
			var key string
			var f Feature
			err := eachField(entry, func(num protowire.Number, typ protowire.Type, v []byte) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					key = string(v)
				case num == 2 && typ == protowire.BytesType:
					var err error
					f, err = parseFeature(v)
					return err
				}
				return nil
			})
			if err != nil {
				return err
			}
			ex[key] = f
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("parsing tf.Example: %w", err)
	}
	return ex, nil
}

// eachField calls fn for every field of a message with the field's
// contents (length-delimited) or encoded value (other wire types).
func eachField(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				v = b[:n]
			}
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// parseFeature decodes Feature{oneof bytes_list=1, float_list=2,
// int64_list=3}, each a list in field 1, packed or not. As for any oneof,
// the last list present wins.
func parseFeature(b []byte) (Feature, error) {
	var f Feature
	kind := protowire.Number(0)
	err := eachField(b, func(num protowire.Number, typ protowire.Type, list []byte) error {
		if num < 1 || num > 3 || typ != protowire.BytesType {
			return nil
		}
		if num != kind {
			f, kind = Feature{}, num
		}
		return eachField(list, func(n protowire.Number, t protowire.Type, v []byte) error {
			if n != 1 {
				return nil
			}
			switch num {
			case 1:
				if t == protowire.BytesType {
					f.Bytes = append(f.Bytes, append([]byte{}, v...))
				}
			case 2:
				return appendFloats(&f.Floats, t, v)
			case 3:
				return appendInt64s(&f.Int64s, t, v)
			}
			return nil
		})
	})
	return f, err
}

func appendFloats(dst *[]float32, typ protowire.Type, v []byte) error {
	switch typ {
	case protowire.BytesType: // packed
		if len(v)%4 != 0 {
			return errors.New("packed float list length is not a multiple of 4")
		}
		for i := 0; i < len(v); i += 4 {
			*dst = append(*dst, math.Float32frombits(binary.LittleEndian.Uint32(v[i:])))
		}
	case protowire.Fixed32Type:
		*dst = append(*dst, math.Float32frombits(binary.LittleEndian.Uint32(v)))
	}
	return nil
}

func appendInt64s(dst *[]int64, typ protowire.Type, v []byte) error {
	switch typ {
	case protowire.BytesType: // packed
		for len(v) > 0 {
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return protowire.ParseError(n)
			}
			*dst = append(*dst, int64(x))
			v = v[n:]
		}
	case protowire.VarintType:
		x, _ := protowire.ConsumeVarint(v)
		*dst = append(*dst, int64(x))
	}
	return nil
}

// Marshal encodes the example with features in name order and packed lists.
func (e Example) Marshal() []byte {
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var features []byte
	for _, k := range keys {
		f := e[k]
		var list []byte
		var kind protowire.Number
		switch {
		case f.Floats != nil:
			kind = 2
			var packed []byte
			for _, v := range f.Floats {
				packed = protowire.AppendFixed32(packed, math.Float32bits(v))
			}
			list = appendBytesField(nil, 1, packed)
		case f.Int64s != nil:
			kind = 3
			var packed []byte
			for _, v := range f.Int64s {
				packed = protowire.AppendVarint(packed, uint64(v))
			}
			list = appendBytesField(nil, 1, packed)
		default:
			kind = 1
			for _, v := range f.Bytes {
				list = appendBytesField(list, 1, v)
			}
		}
		feature := appendBytesField(nil, kind, list)
		entry := appendBytesField(nil, 1, []byte(k))
		entry = appendBytesField(entry, 2, feature)
		features = appendBytesField(features, 1, entry)
	}
	return appendBytesField(nil, 1, features)
}

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// recordLoc is where one record lives.
type recordLoc struct {
	file   int32
	index  int32 // record index within the file
	offset int64
}

// tfrecordSource is TFRecord files of tf.Example images. Its index is one
// recordLoc (16 bytes) per record.
type tfrecordSource struct {
	fsys     FS
	files    []string
	recs     []recordLoc
	input    string
	pre      Preprocess
	imageKey string
	labelKey string
}

func openTFRecord(ctx context.Context, spec Spec, fsys FS, files []string) (Source, error) {
	input, pre, err := imageInput(spec)
	if err != nil {
		return nil, err
	}
	s := &tfrecordSource{fsys: fsys, files: files, input: input, pre: pre,
		imageKey: spec.ImageKey, labelKey: spec.LabelKey}
	if s.imageKey == "" {
		s.imageKey = "image/encoded"
	}
	if s.labelKey == "" {
		s.labelKey = "image/class/label"
	}
	for fi, f := range files {
		if err := s.index(ctx, fi, f); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// index scans one file, checking both CRCs of every record and keeping offsets only.
func (s *tfrecordSource) index(ctx context.Context, fi int, file string) error {
	rc, err := s.fsys.Open(ctx, file)
	if err != nil {
		return err
	}
	defer rc.Close()
	r := bufio.NewReaderSize(rc, 1<<16)
	off := int64(0)
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, size, err := readRecord(r, false)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return sampleErr(fmt.Sprintf("%s#%d", file, i), "", fmt.Errorf("offset %d: %w", off, err))
		}
		s.recs = append(s.recs, recordLoc{file: int32(fi), index: int32(i), offset: off})
		off += size
	}
}

func (s *tfrecordSource) Len() int { return len(s.recs) }

func (s *tfrecordSource) Sample(ctx context.Context, i int) (Sample, error) {
	if i < 0 || i >= len(s.recs) {
		return Sample{}, fmt.Errorf("sample %d out of range [0,%d)", i, len(s.recs))
	}
	loc := s.recs[i]
	file := s.files[loc.file]
	id := fmt.Sprintf("%s#%d", file, loc.index)
	rc, err := openRange(ctx, s.fsys, file, loc.offset, -1)
	if err != nil {
		return Sample{}, sampleErr(id, "", err)
	}
	defer rc.Close()
	data, _, err := readRecord(rc, true)
	if err != nil {
		return Sample{}, sampleErr(id, "", fmt.Errorf("offset %d: %w", loc.offset, noEOF(err)))
	}
	ex, err := ParseExample(data)
	if err != nil {
		return Sample{}, sampleErr(id, "", err)
	}
	img := ex[s.imageKey]
	if len(img.Bytes) != 1 {
		return Sample{}, sampleErr(id, "", fmt.Errorf("feature %q: want one encoded image, found %d bytes values (features: %s)", s.imageKey, len(img.Bytes), featureNames(ex)))
	}
	t, err := s.pre.Apply(img.Bytes[0], s.input)
	if err != nil {
		return Sample{}, sampleErr(id, "", fmt.Errorf("feature %q: %w", s.imageKey, err))
	}
	out := Sample{ID: id, Tensors: map[string]*onnx.Tensor{s.input: t}, Label: -1}
	if l := ex[s.labelKey].Int64s; len(l) == 1 {
		out.Label = l[0]
	}
	return out, nil
}

func featureNames(ex Example) string {
	names := make([]string, 0, len(ex))
	for k := range ex {
		names = append(names, fmt.Sprintf("%q", k))
	}
	sort.Strings(names)
	return fmt.Sprint(names)
}
