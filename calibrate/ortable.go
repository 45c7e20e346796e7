package calibrate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/internal/atomicfile"
)

// The files of ONNX Runtime's calibration table, as its
// write_calibration_table writes them (reference/formats.md §1.3).
// ORTTableName is the one the TensorRT execution provider reads
// (trt_int8_calibration_table_name with trt_int8_use_native_calibration_table
// false; Triton's int8_calibration_table_name).
const (
	ORTTableName     = "calibration.flatbuffers"
	ORTTableText     = "calibration.cache"
	ORTTableJSON     = "calibration.json"
	ortTableMaxBytes = 1 << 30
)

// WriteORTTable writes ONNX Runtime's TensorRT execution provider calibration
// table for the dynamic ranges amax (tensor name -> amax, not scales) into dir:
//
//   - calibration.flatbuffers: the schema's TrtTable{dict: [KeyValue{key, value}]}
//     with the value the amax as text, keys in sorted order (see EncodeORTTable);
//   - calibration.cache: "<name> <amax>\n" per tensor in sorted order, an
//     ONNX Runtime private text format, not TensorRT's cache;
//   - calibration.json: {"<name>": [-amax, amax], ...} in sorted order, the
//     form older ONNX Runtime versions wrote (json.dumps of name -> (min, max)).
//
// Numbers are printed as Python's str(float) prints them (see pyFloat), so
// the files match ONNX Runtime's for the same float64 values. Names must be
// non-empty and free of newlines, values finite. The three files are written
// to temporary files first and renamed into place together.
func WriteORTTable(dir string, amax map[string]float64) error {
	names := make([]string, 0, len(amax))
	for name, v := range amax {
		if name == "" || strings.ContainsRune(name, '\n') {
			return fmt.Errorf("writing ONNX Runtime calibration table: tensor name %q cannot be written", name)
		}
		if !finite(v) {
			return fmt.Errorf("writing ONNX Runtime calibration table: tensor %q: amax %v is not finite", name, v)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var text, js strings.Builder
	kvs := make([]KeyValue, len(names))
	js.WriteByte('{')
	for i, name := range names {
		v := pyFloat(amax[name])
		kvs[i] = KeyValue{Key: name, Value: v}
		text.WriteString(name + " " + v + "\n")
		if i > 0 {
			js.WriteString(", ")
		}
		js.WriteString(pyJSONString(name) + ": [" + pyFloat(-amax[name]) + ", " + v + "]")
	}
	js.WriteByte('}')
	err := atomicfile.WriteFiles(map[string][]byte{
		filepath.Join(dir, ORTTableName): EncodeORTTable(kvs),
		filepath.Join(dir, ORTTableText): []byte(text.String()),
		filepath.Join(dir, ORTTableJSON): []byte(js.String()),
	}, 0o644)
	if err != nil {
		return fmt.Errorf("writing ONNX Runtime calibration table: %w", err)
	}
	return nil
}

// ReadORTTable reads dir/calibration.flatbuffers and parses its values as the
// execution provider does (std::stof), returning tensor name -> amax.
func ReadORTTable(dir string) (map[string]float64, error) {
	path := filepath.Join(dir, ORTTableName)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading ONNX Runtime calibration table: %w", err)
	}
	m, err := ParseORTTable(data)
	if err != nil {
		return nil, fmt.Errorf("reading ONNX Runtime calibration table %s: %w", path, err)
	}
	return m, nil
}

// ParseORTTable decodes a calibration.flatbuffers table into tensor name -> amax.
func ParseORTTable(data []byte) (map[string]float64, error) {
	kvs, err := DecodeORTTable(data)
	if err != nil {
		return nil, err
	}
	m := make(map[string]float64, len(kvs))
	for _, kv := range kvs {
		if _, dup := m[kv.Key]; dup {
			return nil, fmt.Errorf("tensor %q appears twice", truncate(kv.Key))
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(kv.Value), 64)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: value %q is not a number", truncate(kv.Key), truncate(kv.Value))
		}
		m[kv.Key] = v
	}
	return m, nil
}

// pyFloat formats v as Python's str(float)/repr(float): the shortest digits
// that round-trip (strconv's -1 precision gives the same digits), in fixed
// notation with at least one fractional digit ("2.0", "0.0001",
// "1000000000000000.0") when the decimal exponent is in [-4, 16), otherwise
// in scientific notation with a two-digit minimum exponent ("1e-05",
// "1.5e+16"), plus "nan", "inf" and "-inf".
func pyFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	sci := strconv.FormatFloat(v, 'e', -1, 64) // d.ddde±XX, same exponent style as Python
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if v != 0 && (exp < -4 || exp >= 16) {
		return sci
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}

// pyJSONString quotes s as Python's json.dumps does with ensure_ascii=True.
func pyJSONString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || r > 0x7e: // json.dumps escapes all but printable ASCII
			if r > 0xffff {
				r1, r2 := utf16Surrogates(r)
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func utf16Surrogates(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// KeyValue is one entry of ONNX Runtime's flatbuffers calibration table.
type KeyValue struct {
	Key   string
	Value string
}

// EncodeORTTable serialises entries as a FlatBuffer of ONNX Runtime's schema
// (namespace CalTableFlatBuffers; table KeyValue { key: string; value: string; }
// table TrtTable { dict: [KeyValue]; } root_type TrtTable; no file
// identifier), keeping their order. It is laid out front to back, all
// little-endian and 4-byte aligned:
//
//	0          uoffset to the root table
//	4          TrtTable vtable: size 6, table size 8, dict at +4 (+2 padding)
//	12         TrtTable: soffset 8 to its vtable, uoffset to the vector
//	20         vector: length n, n uoffsets to the KeyValue tables
//	24+4n      KeyValue vtable shared by all: size 8, table size 12, key +4, value +8
//	32+4n      n KeyValue tables of 12 bytes: soffset, key and value uoffsets
//	32+16n     the strings: length, bytes, NUL, padding to 4
//
// An soffset is table position minus vtable position; a uoffset is relative
// to where it is stored and always points forward, as FlatBuffers requires.
func EncodeORTTable(entries []KeyValue) []byte {
	n := len(entries)
	kvVtable := 24 + 4*n
	firstTable := kvVtable + 8
	size := firstTable + 12*n
	for _, e := range entries {
		size += fbStringSize(e.Key) + fbStringSize(e.Value)
	}
	b := make([]byte, size)
	le := binary.LittleEndian
	le.PutUint32(b[0:], 12)
	le.PutUint16(b[4:], 6)
	le.PutUint16(b[6:], 8)
	le.PutUint16(b[8:], 4)
	le.PutUint32(b[12:], 12-4)
	le.PutUint32(b[16:], 20-16)
	le.PutUint32(b[20:], uint32(n))
	le.PutUint16(b[kvVtable:], 8)
	le.PutUint16(b[kvVtable+2:], 12)
	le.PutUint16(b[kvVtable+4:], 4)
	le.PutUint16(b[kvVtable+6:], 8)
	str := firstTable + 12*n
	putString := func(at int, s string) {
		le.PutUint32(b[at:], uint32(str-at))
		le.PutUint32(b[str:], uint32(len(s)))
		copy(b[str+4:], s) // NUL and padding are already zero
		str += fbStringSize(s)
	}
	for i, e := range entries {
		t := firstTable + 12*i
		le.PutUint32(b[24+4*i:], uint32(t-(24+4*i)))
		le.PutUint32(b[t:], uint32(t-kvVtable))
		putString(t+4, e.Key)
		putString(t+8, e.Value)
	}
	return b
}

func fbStringSize(s string) int { return (4 + len(s) + 1 + 3) &^ 3 }

// errFlatbuffer is wrapped by every structural error of DecodeORTTable.
var errFlatbuffer = errors.New("malformed flatbuffers calibration table")

// DecodeORTTable decodes an ONNX Runtime flatbuffers calibration table
// written by any FlatBuffers builder (vtables before or after their tables,
// shared or not, vector in any order). Every offset is bounds-checked and
// strings must be NUL-terminated; a missing dict is an empty table, a
// KeyValue without key or value is an error. It never panics.
func DecodeORTTable(data []byte) ([]KeyValue, error) {
	if len(data) > ortTableMaxBytes {
		return nil, fmt.Errorf("%w: %d bytes is too large", errFlatbuffer, len(data))
	}
	d := fbReader{data}
	root, err := d.deref(0)
	if err != nil {
		return nil, fmt.Errorf("%w: root: %v", errFlatbuffer, err)
	}
	dict, ok, err := d.field(root, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: TrtTable: %v", errFlatbuffer, err)
	}
	if !ok {
		return nil, nil
	}
	vec, err := d.deref(dict)
	if err != nil {
		return nil, fmt.Errorf("%w: dict: %v", errFlatbuffer, err)
	}
	n, err := d.u32(vec)
	if err != nil {
		return nil, fmt.Errorf("%w: dict length: %v", errFlatbuffer, err)
	}
	if uint64(vec)+4+4*uint64(n) > uint64(len(data)) {
		return nil, fmt.Errorf("%w: dict of %d entries overruns the buffer", errFlatbuffer, n)
	}
	out := make([]KeyValue, 0, n)
	for i := 0; i < int(n); i++ {
		t, err := d.deref(vec + 4 + 4*i)
		if err != nil {
			return nil, fmt.Errorf("%w: dict[%d]: %v", errFlatbuffer, i, err)
		}
		var kv KeyValue
		for slot, dst := range []*string{&kv.Key, &kv.Value} {
			s, err := d.stringField(t, slot)
			if err != nil {
				return nil, fmt.Errorf("%w: dict[%d] %s: %v", errFlatbuffer, i, [...]string{"key", "value"}[slot], err)
			}
			*dst = s
		}
		out = append(out, kv)
	}
	return out, nil
}

type fbReader struct{ b []byte }

func (d fbReader) check(pos, size int) error {
	if pos < 0 || uint64(pos)+uint64(size) > uint64(len(d.b)) {
		return fmt.Errorf("offset %d+%d is outside the %d-byte buffer", pos, size, len(d.b))
	}
	return nil
}

func (d fbReader) u32(pos int) (int, error) {
	if err := d.check(pos, 4); err != nil {
		return 0, err
	}
	return int(binary.LittleEndian.Uint32(d.b[pos:])), nil
}

func (d fbReader) u16(pos int) (int, error) {
	if err := d.check(pos, 2); err != nil {
		return 0, err
	}
	return int(binary.LittleEndian.Uint16(d.b[pos:])), nil
}

// deref follows the uoffset stored at pos.
func (d fbReader) deref(pos int) (int, error) {
	off, err := d.u32(pos)
	if err != nil {
		return 0, err
	}
	target := uint64(pos) + uint64(off)
	if target >= uint64(len(d.b)) {
		return 0, fmt.Errorf("uoffset at %d points to %d, outside the %d-byte buffer", pos, target, len(d.b))
	}
	return int(target), nil
}

// field returns the position of field slot of the table at pos, and whether
// it is present.
func (d fbReader) field(table, slot int) (int, bool, error) {
	if err := d.check(table, 4); err != nil {
		return 0, false, err
	}
	soff := int64(int32(binary.LittleEndian.Uint32(d.b[table:])))
	vt := int64(table) - soff
	if vt < 0 || vt > int64(len(d.b)) {
		return 0, false, fmt.Errorf("vtable of table at %d is at %d, outside the buffer", table, vt)
	}
	vtSize, err := d.u16(int(vt))
	if err != nil {
		return 0, false, err
	}
	tableSize, err := d.u16(int(vt) + 2)
	if err != nil {
		return 0, false, err
	}
	if vtSize < 4 || vtSize%2 != 0 || d.check(int(vt), vtSize) != nil {
		return 0, false, fmt.Errorf("vtable at %d has a bad size %d", vt, vtSize)
	}
	if tableSize < 4 || d.check(table, tableSize) != nil {
		return 0, false, fmt.Errorf("table at %d has a bad size %d", table, tableSize)
	}
	if 4+2*slot+2 > vtSize {
		return 0, false, nil
	}
	off, _ := d.u16(int(vt) + 4 + 2*slot)
	if off == 0 {
		return 0, false, nil
	}
	if off < 4 || off+4 > tableSize {
		return 0, false, fmt.Errorf("field %d of table at %d is at +%d, outside the %d-byte table", slot, table, off, tableSize)
	}
	return table + off, true, nil
}

func (d fbReader) stringField(table, slot int) (string, error) {
	f, ok, err := d.field(table, slot)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", errors.New("missing")
	}
	s, err := d.deref(f)
	if err != nil {
		return "", err
	}
	n, err := d.u32(s)
	if err != nil {
		return "", err
	}
	if err := d.check(s+4, n+1); err != nil {
		return "", fmt.Errorf("string at %d of %d bytes: %v", s, n, err)
	}
	if d.b[s+4+n] != 0 {
		return "", fmt.Errorf("string at %d is not NUL-terminated", s)
	}
	return string(d.b[s+4 : s+4+n]), nil
}
