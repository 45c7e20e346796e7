package dataset

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// npyMagic starts every .npy file (NEP 1).
const npyMagic = "\x93NUMPY"

// maxNpyHeader bounds the header a reader accepts; NumPy itself refuses
// headers over 10000 bytes unless told otherwise.
const maxNpyHeader = 1 << 20

// npyTypes maps NumPy type codes (without byte order) to ONNX types.
var npyTypes = map[string]onnx.DataType{
	"f2": onnx.Float16, "f4": onnx.Float, "f8": onnx.Double,
	"i1": onnx.Int8, "i2": onnx.Int16, "i4": onnx.Int32, "i8": onnx.Int64,
	"u1": onnx.Uint8, "u2": onnx.Uint16, "u4": onnx.Uint32, "u8": onnx.Uint64,
	"b1": onnx.Bool,
}

// npyHeader is the parsed header of a .npy file.
type npyHeader struct {
	Type      onnx.DataType
	BigEndian bool
	Dims      []int64
	DataSize  int64 // bytes of array data
	HeaderLen int64 // bytes before the array data
}

// ReadNpy reads one array in NumPy's .npy format. Big-endian data is
// converted; Fortran-order arrays, object arrays and string arrays are
// refused. The tensor is named name.
func ReadNpy(r io.Reader, name string) (*onnx.Tensor, error) {
	h, err := readNpyHeader(r)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(r, h.DataSize))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) != h.DataSize {
		return nil, fmt.Errorf("npy data is %d bytes, %s%v needs %d (truncated file?)", len(raw), h.Type, h.Dims, h.DataSize)
	}
	return npyDecode(h, raw, name)
}

func npyDecode(h *npyHeader, raw []byte, name string) (*onnx.Tensor, error) {
	if h.BigEndian {
		swapBytes(raw, h.Type.Size())
	}
	dt := int32(h.Type)
	return onnx.Decode(&onnxpb.TensorProto{Name: &name, DataType: &dt, Dims: h.Dims, RawData: raw})
}

func swapBytes(b []byte, size int) {
	for i := 0; i+size <= len(b); i += size {
		for j := 0; j < size/2; j++ {
			b[i+j], b[i+size-1-j] = b[i+size-1-j], b[i+j]
		}
	}
}

func readNpyHeader(r io.Reader) (*npyHeader, error) {
	var pre [10]byte
	if _, err := io.ReadFull(r, pre[:8]); err != nil {
		return nil, fmt.Errorf("reading npy header: %w", noEOF(err))
	}
	if string(pre[:6]) != npyMagic {
		return nil, errors.New("not a .npy file (no \\x93NUMPY magic)")
	}
	var hlen, prefix int64
	switch major := pre[6]; major {
	case 1:
		if _, err := io.ReadFull(r, pre[8:10]); err != nil {
			return nil, fmt.Errorf("reading npy header: %w", noEOF(err))
		}
		hlen, prefix = int64(binary.LittleEndian.Uint16(pre[8:10])), 10
	case 2, 3:
		var l [4]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return nil, fmt.Errorf("reading npy header: %w", noEOF(err))
		}
		hlen, prefix = int64(binary.LittleEndian.Uint32(l[:])), 12
	default:
		return nil, fmt.Errorf("npy format version %d.%d is not supported (want 1.0, 2.0 or 3.0)", major, pre[7])
	}
	if hlen > maxNpyHeader {
		return nil, fmt.Errorf("npy header is %d bytes, more than %d", hlen, maxNpyHeader)
	}
	text := make([]byte, hlen)
	if _, err := io.ReadFull(r, text); err != nil {
		return nil, fmt.Errorf("reading npy header: %w", noEOF(err))
	}
	h, err := parseNpyDict(string(text))
	if err != nil {
		return nil, fmt.Errorf("npy header %q: %w", strings.TrimSpace(string(text)), err)
	}
	h.HeaderLen = prefix + hlen
	return h, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseNpyDict reads the Python dict literal of a .npy header:
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
func parseNpyDict(s string) (*npyHeader, error) {
	p := &pyLexer{s: strings.TrimRight(s, " \n\x00")}
	if !p.eat("{") {
		return nil, errors.New("want a dict")
	}
	var descr *string
	var fortran *bool
	var shape []int64
	haveShape := false
	for !p.eat("}") {
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if !p.eat(":") {
			return nil, fmt.Errorf("want ':' after %q", key)
		}
		switch key {
		case "descr":
			v, err := p.str()
			if err != nil {
				return nil, fmt.Errorf("descr: %w", err)
			}
			descr = &v
		case "fortran_order":
			var v bool
			switch {
			case p.eat("True"):
				v = true
			case p.eat("False"):
			default:
				return nil, errors.New("fortran_order: want True or False")
			}
			fortran = &v
		case "shape":
			if shape, err = p.tuple(); err != nil {
				return nil, fmt.Errorf("shape: %w", err)
			}
			haveShape = true
		default:
			return nil, fmt.Errorf("unknown key %q", key)
		}
		if !p.eat(",") {
			if !p.eat("}") {
				return nil, errors.New("want ',' or '}'")
			}
			break
		}
	}
	if p.skip(); p.i != len(p.s) {
		return nil, errors.New("text after the dict")
	}
	if descr == nil || fortran == nil || !haveShape {
		return nil, errors.New("want keys descr, fortran_order and shape")
	}
	if *fortran {
		return nil, errors.New("Fortran-order arrays are not supported: save with np.ascontiguousarray")
	}
	h := &npyHeader{Dims: shape}
	d := *descr
	if len(d) != 3 {
		return nil, fmt.Errorf("dtype %q is not supported (want a numeric or bool dtype such as <f4)", d)
	}
	dt, ok := npyTypes[d[1:]]
	if !ok {
		return nil, fmt.Errorf("dtype %q is not supported (want a numeric or bool dtype such as <f4)", d)
	}
	switch d[0] {
	case '<', '|', '=':
	case '>':
		h.BigEndian = true
	default:
		return nil, fmt.Errorf("dtype %q: unknown byte order", d)
	}
	if d[0] == '|' && dt.Size() != 1 {
		return nil, fmt.Errorf("dtype %q: byte order '|' is only for 1-byte types", d)
	}
	h.Type = dt
	n, err := onnx.NumElements(shape)
	if err != nil {
		return nil, err
	}
	h.DataSize = int64(n) * int64(dt.Size())
	return h, nil
}

type pyLexer struct {
	s string
	i int
}

func (p *pyLexer) skip() {
	for p.i < len(p.s) && strings.ContainsRune(" \t\n\r", rune(p.s[p.i])) {
		p.i++
	}
}

func (p *pyLexer) eat(tok string) bool {
	p.skip()
	if strings.HasPrefix(p.s[p.i:], tok) {
		p.i += len(tok)
		return true
	}
	return false
}

func (p *pyLexer) str() (string, error) {
	p.skip()
	if p.i >= len(p.s) || (p.s[p.i] != '\'' && p.s[p.i] != '"') {
		return "", errors.New("want a quoted string")
	}
	q := p.s[p.i]
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", errors.New("unterminated string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return v, nil
}

func (p *pyLexer) tuple() ([]int64, error) {
	if !p.eat("(") {
		return nil, errors.New("want a tuple")
	}
	dims := []int64{}
	for !p.eat(")") {
		p.skip()
		j := p.i
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		if j == p.i {
			return nil, errors.New("want a non-negative integer")
		}
		v, err := strconv.ParseInt(p.s[p.i:j], 10, 64)
		if err != nil {
			return nil, err
		}
		p.i = j
		p.eat("L") // Python 2 long suffix, written by old NumPy
		dims = append(dims, v)
		if !p.eat(",") {
			if !p.eat(")") {
				return nil, errors.New("want ',' or ')'")
			}
			break
		}
	}
	return dims, nil
}

// npyDescr is the inverse of npyTypes, with byte order.
func npyDescr(dt onnx.DataType) (string, error) {
	for code, t := range npyTypes {
		if t == dt {
			if dt.Size() == 1 {
				return "|" + code, nil
			}
			return "<" + code, nil
		}
	}
	return "", fmt.Errorf("element type %s has no .npy dtype", dt)
}

// WriteNpy writes t in .npy format: version 1.0 (2.0 when the header is too
// long), little-endian, C order, header padded so the data is 64-byte aligned.
func WriteNpy(w io.Writer, t *onnx.Tensor) error {
	descr, err := npyDescr(t.Type)
	if err != nil {
		return fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if c, err := onnx.NewTensor(t.Name, t.Dims, t.Data); err != nil {
		return err
	} else if c.Type != t.Type {
		return fmt.Errorf("tensor %q: element type %s stored as %T", t.Name, t.Type, t.Data)
	}
	var shape strings.Builder
	for i, d := range t.Dims {
		if i > 0 {
			shape.WriteString(", ")
		}
		shape.WriteString(strconv.FormatInt(d, 10))
	}
	if len(t.Dims) == 1 {
		shape.WriteString(",")
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape.String())
	var buf bytes.Buffer
	buf.WriteString(npyMagic)
	prefix := 10
	if len(dict)+1+prefix > 65535 {
		prefix = 12
	}
	total := (prefix + len(dict) + 1 + 63) / 64 * 64
	hlen := total - prefix
	if prefix == 10 {
		buf.Write([]byte{1, 0, byte(hlen), byte(hlen >> 8)})
	} else {
		buf.Write([]byte{2, 0})
		binary.Write(&buf, binary.LittleEndian, uint32(hlen))
	}
	buf.WriteString(dict)
	buf.WriteString(strings.Repeat(" ", hlen-len(dict)-1))
	buf.WriteByte('\n')
	if _, err := w.Write(buf.Bytes()); err != nil {
		return err
	}
	_, err = w.Write(onnx.RawBytes(t))
	return err
}
