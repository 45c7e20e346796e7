package kserve

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// leaves walks the leaf values of a JSON array, nested or flat, in
// row-major order. The array has already been checked to be valid JSON, but
// the walk stays within bounds whatever it is given.
type leaves struct {
	b []byte
	i int
}

// next returns the next leaf's text (strings with their quotes).
func (l *leaves) next() ([]byte, bool) {
	for l.i < len(l.b) {
		switch l.b[l.i] {
		case '[', ']', ',', ' ', '\t', '\n', '\r':
			l.i++
			continue
		case '"':
			j := l.i + 1
			for j < len(l.b) && l.b[j] != '"' {
				if l.b[j] == '\\' {
					j++
				}
				j++
			}
			end := min(j+1, len(l.b))
			tok := l.b[l.i:end]
			l.i = end
			return tok, true
		}
		j := l.i
		for j < len(l.b) && !isDelim(l.b[j]) {
			j++
		}
		tok := l.b[l.i:j]
		l.i = j
		return tok, true
	}
	return nil, false
}

func isDelim(c byte) bool {
	switch c {
	case '[', ']', ',', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// countLeaves checks that raw is an array of numbers, strings and booleans
// (nested arrays allowed) and counts its leaves.
func countLeaves(raw []byte) (int, error) {
	l := leaves{b: raw}
	for l.i < len(raw) && isSpace(raw[l.i]) {
		l.i++
	}
	if l.i == len(raw) || raw[l.i] != '[' {
		return 0, errors.New("data is not an array")
	}
	n := 0
	for {
		tok, ok := l.next()
		if !ok {
			return n, nil
		}
		switch tok[0] {
		case '{':
			return 0, fmt.Errorf("data element %d is an object", n)
		case 'n':
			return 0, fmt.Errorf("data element %d is null", n)
		}
		n++
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// decodeJSONData converts the JSON data of a tensor of type dt and shape
// dims, checking the element count before allocating anything.
func decodeJSONData(name string, dt onnx.DataType, dims []int64, raw []byte) (*onnx.Tensor, error) {
	n, err := onnx.NumElements(dims)
	if err != nil {
		return nil, err
	}
	count, err := countLeaves(raw)
	if err != nil {
		return nil, err
	}
	if count != n {
		return nil, fmt.Errorf("%d data values for shape %v (want %d)", count, dims, n)
	}
	data, err := parseLeaves(dt, n, raw)
	if err != nil {
		return nil, err
	}
	return &onnx.Tensor{Name: name, Type: dt, Dims: append([]int64{}, dims...), Data: data}, nil
}

// parseLeaves converts n leaves of raw to the Go slice of type dt.
func parseLeaves(dt onnx.DataType, n int, raw []byte) (any, error) {
	switch dt {
	case onnx.Float:
		return parseAll(n, raw, "FP32", func(s string) (float32, error) {
			f, err := parseFloat(s, 32)
			return float32(f), err
		})
	case onnx.Double:
		return parseAll(n, raw, "FP64", func(s string) (float64, error) { return parseFloat(s, 64) })
	case onnx.Float16:
		return parseAll(n, raw, "FP16", parseHalf(float16.Fromfloat32, func(h float16.Float16) bool { return h.IsInf(0) }))
	case onnx.BFloat16:
		return parseAll(n, raw, "BF16", parseHalf(onnx.BF16From, func(b onnx.BF16) bool { return math.IsInf(float64(b.Float32()), 0) }))
	case onnx.Int8:
		return parseAll(n, raw, "INT8", signed[int8](8))
	case onnx.Int16:
		return parseAll(n, raw, "INT16", signed[int16](16))
	case onnx.Int32:
		return parseAll(n, raw, "INT32", signed[int32](32))
	case onnx.Int64:
		return parseAll(n, raw, "INT64", signed[int64](64))
	case onnx.Uint8:
		return parseAll(n, raw, "UINT8", unsigned[uint8](8))
	case onnx.Uint16:
		return parseAll(n, raw, "UINT16", unsigned[uint16](16))
	case onnx.Uint32:
		return parseAll(n, raw, "UINT32", unsigned[uint32](32))
	case onnx.Uint64:
		return parseAll(n, raw, "UINT64", unsigned[uint64](64))
	case onnx.Bool:
		return parseAll(n, raw, "BOOL", parseBool)
	case onnx.String:
		return parseStrings(n, raw)
	}
	return nil, fmt.Errorf("element type %s cannot be read from JSON", dt)
}

// parseAll converts each leaf with conv, which sees the leaf's text only
// for the duration of the call.
func parseAll[T any](n int, raw []byte, kind string, conv func(string) (T, error)) ([]T, error) {
	out := make([]T, n)
	l := leaves{b: raw}
	for i := range out {
		tok, _ := l.next()
		v, err := conv(unsafe.String(unsafe.SliceData(tok), len(tok)))
		if err != nil {
			return nil, fmt.Errorf("data element %d (%s) is not %s: %w", i, shorten(tok), kind, err)
		}
		out[i] = v
	}
	return out, nil
}

// errNotNumber and its siblings say why a leaf does not convert; they hold
// nothing of the leaf's text, which parseAll lends only for the call.
var (
	errNotNumber  = errors.New("want a number")
	errNotInteger = errors.New("want an integer in range")
	errRange      = errors.New("out of range")
	errNotBool    = errors.New("want true or false")
)

func parseFloat(s string, bits int) (float64, error) {
	if len(s) == 0 || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, errNotNumber
	}
	f, err := strconv.ParseFloat(s, bits)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, errRange
		}
		return 0, errNotNumber
	}
	return f, nil
}

// parseHalf parses a 16-bit float through float32, rejecting values that
// overflow the narrower type.
func parseHalf[T any](from func(float32) T, isInf func(T) bool) func(string) (T, error) {
	return func(s string) (T, error) {
		f, err := parseFloat(s, 32)
		if err != nil {
			var zero T
			return zero, err
		}
		h := from(float32(f))
		if isInf(h) {
			return h, errRange
		}
		return h, nil
	}
}

func signed[T int8 | int16 | int32 | int64](bits int) func(string) (T, error) {
	return func(s string) (T, error) {
		i, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return 0, errNotInteger
		}
		return T(i), nil
	}
}

func unsigned[T uint8 | uint16 | uint32 | uint64](bits int) func(string) (T, error) {
	return func(s string) (T, error) {
		u, err := strconv.ParseUint(s, 10, bits)
		if err != nil {
			return 0, errNotInteger
		}
		return T(u), nil
	}
}

func parseBool(s string) (bool, error) {
	switch s {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errNotBool
}

// parseStrings reads BYTES elements, which JSON carries as strings.
func parseStrings(n int, raw []byte) ([]string, error) {
	out := make([]string, n)
	l := leaves{b: raw}
	for i := range out {
		tok, _ := l.next()
		if len(tok) < 2 || tok[0] != '"' {
			return nil, fmt.Errorf("data element %d (%s) is not a string", i, shorten(tok))
		}
		if s, ok := plainString(tok); ok {
			out[i] = s
			continue
		}
		if err := json.Unmarshal(tok, &out[i]); err != nil {
			return nil, fmt.Errorf("data element %d: %w", i, err)
		}
	}
	return out, nil
}

// plainString returns the contents of a quoted string that needs no
// unescaping (printable ASCII without backslashes).
func plainString(tok []byte) (string, bool) {
	body := tok[1 : len(tok)-1]
	for _, c := range body {
		if c < 0x20 || c >= 0x80 || c == '\\' || c == '"' {
			return "", false
		}
	}
	return string(body), true
}

func shorten(tok []byte) string {
	if len(tok) > 40 {
		return string(tok[:37]) + "..."
	}
	return string(tok)
}

// encodeJSONData writes t's elements as a flat JSON array. NaN, infinities
// and byte strings that are not UTF-8 have no JSON form: those tensors must
// be sent as binary data.
func encodeJSONData(t *onnx.Tensor) (json.RawMessage, error) {
	switch d := t.Data.(type) {
	case []float32:
		return appendFloats(d, 32, func(v float32) float64 { return float64(v) })
	case []float64:
		return appendFloats(d, 64, func(v float64) float64 { return v })
	case []float16.Float16:
		return appendFloats(d, 32, func(v float16.Float16) float64 { return float64(v.Float32()) })
	case []onnx.BF16:
		return appendFloats(d, 32, func(v onnx.BF16) float64 { return float64(v.Float32()) })
	case []int8:
		return appendInts(d), nil
	case []int16:
		return appendInts(d), nil
	case []int32:
		return appendInts(d), nil
	case []int64:
		return appendInts(d), nil
	case []uint8:
		return appendUints(d), nil
	case []uint16:
		return appendUints(d), nil
	case []uint32:
		return appendUints(d), nil
	case []uint64:
		return appendUints(d), nil
	case []bool:
		b := make([]byte, 0, 6*len(d)+2)
		b = append(b, '[')
		for i, v := range d {
			b = comma(b, i)
			b = strconv.AppendBool(b, v)
		}
		return append(b, ']'), nil
	case []string:
		return appendStrings(d)
	}
	return nil, fmt.Errorf("element type %s cannot be written as JSON", t.Type)
}

func comma(b []byte, i int) []byte {
	if i > 0 {
		return append(b, ',')
	}
	return b
}

func appendFloats[T any](d []T, bits int, f func(T) float64) (json.RawMessage, error) {
	b := make([]byte, 0, 10*len(d)+2)
	b = append(b, '[')
	for i, v := range d {
		x := f(v)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("element %d is %v, which JSON cannot hold: ask for binary data", i, x)
		}
		b = comma(b, i)
		b = strconv.AppendFloat(b, x, 'g', -1, bits)
	}
	return append(b, ']'), nil
}

func appendInts[T int8 | int16 | int32 | int64](d []T) json.RawMessage {
	b := make([]byte, 0, 4*len(d)+2)
	b = append(b, '[')
	for i, v := range d {
		b = comma(b, i)
		b = strconv.AppendInt(b, int64(v), 10)
	}
	return append(b, ']')
}

func appendUints[T uint8 | uint16 | uint32 | uint64](d []T) json.RawMessage {
	b := make([]byte, 0, 4*len(d)+2)
	b = append(b, '[')
	for i, v := range d {
		b = comma(b, i)
		b = strconv.AppendUint(b, uint64(v), 10)
	}
	return append(b, ']')
}

func appendStrings(d []string) (json.RawMessage, error) {
	b := []byte{'['}
	for i, s := range d {
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("element %d is not UTF-8, which JSON cannot hold: ask for binary data", i)
		}
		b = comma(b, i)
		q, err := json.Marshal(s)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		b = append(b, q...)
	}
	return append(b, ']'), nil
}
