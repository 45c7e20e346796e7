package trtexec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
)

// ExportedOutput is one output tensor of the JSON file trtexec writes for
// --exportOutput (samples/common/sampleReporting.cpp exportJSONOutput):
//
//	[
//	  { "name" : "y"
//	  , "dimensions" : "1x10"
//	  , "values" : [ -0.0518188, 0.000385761, ... ]
//	  }
//	, { "name" : "z"
//	  ...
//	]
//
// trtexec prints the values with C++ stream defaults (sampleUtils.cpp
// dumpBuffer): floating-point types, fp16 and bf16 included, with 6
// significant digits, so float32 values come back rounded; integers exactly;
// int8 and uint8 as numbers; bool as 0 or 1; NaN and infinities as glibc
// prints them ("nan", "-nan", "inf", "-inf"), which is not JSON.
type ExportedOutput struct {
	Name string
	// Dims is the output's shape; empty for a scalar (trtexec writes "").
	Dims []int64
	// Values are the values' decimal texts as trtexec wrote them, one per
	// element in row-major order.
	Values []string
}

// maxExportDepth bounds the nesting of values skipped under unknown keys.
const maxExportDepth = 64

// finalShapePrefix starts the line trtexec writes into the values array of
// an output whose shape depends on the data (Binding::dump with an output
// allocator): "Final shape is 3x4 reported by the output allocator."; the
// "dimensions" of such an output hold -1 for the unknown sizes.
const (
	finalShapePrefix = "Final shape is "
	finalShapeSuffix = " reported by the output allocator."
)

// ParseExportOutput reads trtexec's --exportOutput JSON. It accepts what
// trtexec writes that JSON does not allow (bare nan and inf values, the
// output allocator's "Final shape" line) and skips members it does not
// know; it refuses duplicate outputs or members, a missing name, dimensions
// or values, negative dimensions and a value count that does not match the
// dimensions. Errors give the line.
func ParseExportOutput(r io.Reader) ([]ExportedOutput, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading trtexec output JSON: %w", err)
	}
	p := &exportParser{src: string(data)}
	outs, err := p.file()
	if err != nil {
		return nil, fmt.Errorf("trtexec output JSON, line %d: %w", p.line(), err)
	}
	return outs, nil
}

// exportParser reads one file; values are substrings of src, so parsing
// allocates no string per value.
type exportParser struct {
	src string
	pos int
}

func (p *exportParser) line() int { return 1 + strings.Count(p.src[:p.pos], "\n") }

func (p *exportParser) ws() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, 0 at the end.
func (p *exportParser) peek() byte {
	p.ws()
	if p.pos == len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *exportParser) expect(c byte) error {
	if got := p.peek(); got != c {
		return fmt.Errorf("want %q, found %s", c, p.found())
	}
	p.pos++
	return nil
}

// found describes what is at the current position, for errors.
func (p *exportParser) found() string {
	if p.pos >= len(p.src) {
		return "end of file"
	}
	return strconv.Quote(clip(p.src[p.pos:], 20))
}

func (p *exportParser) file() ([]ExportedOutput, error) {
	if err := p.expect('['); err != nil {
		return nil, err
	}
	var outs []ExportedOutput
	seen := map[string]bool{}
	if p.peek() == ']' {
		p.pos++
	} else {
		for {
			o, err := p.output()
			if err != nil {
				return nil, err
			}
			if seen[o.Name] {
				return nil, fmt.Errorf("output %q listed twice", o.Name)
			}
			seen[o.Name] = true
			outs = append(outs, o)
			if p.peek() == ',' {
				p.pos++
				continue
			}
			if err := p.expect(']'); err != nil {
				return nil, err
			}
			break
		}
	}
	if p.peek() != 0 {
		return nil, fmt.Errorf("%s after the outputs", p.found())
	}
	return outs, nil
}

// output reads one { "name" ..., "dimensions" ..., "values" ... } object.
func (p *exportParser) output() (ExportedOutput, error) {
	var o ExportedOutput
	start := p.pos
	if err := p.expect('{'); err != nil {
		return o, err
	}
	var dims, final []int64
	var haveName, haveDims, haveValues bool
	for first := true; ; first = false {
		if c := p.peek(); first && c == '}' {
			break
		}
		key, err := p.str()
		if err != nil {
			return o, err
		}
		if err := p.expect(':'); err != nil {
			return o, err
		}
		dup := false
		switch key {
		case "name":
			dup, haveName = haveName, true
			o.Name, err = p.str()
		case "dimensions":
			dup, haveDims = haveDims, true
			var s string
			if s, err = p.str(); err == nil {
				dims, err = parseExportDims(s, true)
			}
		case "values":
			dup, haveValues = haveValues, true
			final, o.Values, err = p.values()
		default:
			err = p.skip(0)
		}
		if err != nil {
			return o, fmt.Errorf("%s: %w", key, err)
		}
		if dup {
			return o, fmt.Errorf("member %q given twice", key)
		}
		if p.peek() == ',' {
			p.pos++
			continue
		}
		if err := p.expect('}'); err != nil {
			return o, err
		}
		break
	}
	switch {
	case !haveName:
		return o, errors.New("output without a name")
	case !haveDims:
		return o, fmt.Errorf("output %q has no dimensions", o.Name)
	case !haveValues:
		return o, fmt.Errorf("output %q has no values", o.Name)
	}
	o.Dims = dims
	if final != nil {
		o.Dims = final
	}
	if err := checkCount(o); err != nil {
		p.pos = start // the error is the output's, not its last line's
		p.ws()
		return o, err
	}
	return o, nil
}

// checkCount checks that the output has concrete dimensions and one value
// per element.
func checkCount(o ExportedOutput) error {
	for _, d := range o.Dims {
		if d < 0 {
			return fmt.Errorf("output %q: dimensions %s are not concrete", o.Name, dimsText(o.Dims))
		}
	}
	n, err := onnx.NumElements(o.Dims)
	if err != nil {
		return fmt.Errorf("output %q: %w", o.Name, err)
	}
	if n != len(o.Values) {
		return fmt.Errorf("output %q: %d values for dimensions %q (%d elements)", o.Name, len(o.Values), dimsText(o.Dims), n)
	}
	return nil
}

// str reads a JSON string.
func (p *exportParser) str() (string, error) {
	if p.peek() != '"' {
		return "", fmt.Errorf("want a string, found %s", p.found())
	}
	start := p.pos
	for i := start + 1; i < len(p.src); i++ {
		switch p.src[i] {
		case '\\':
			i++
		case '"':
			var s string
			if err := json.Unmarshal([]byte(p.src[start:i+1]), &s); err != nil {
				return "", fmt.Errorf("string %s: %w", strconv.Quote(clip(p.src[start:i+1], 20)), err)
			}
			p.pos = i + 1
			return s, nil
		}
	}
	return "", errors.New("unterminated string")
}

// values reads the values array, and the "Final shape" line that may open it.
func (p *exportParser) values() (final []int64, vals []string, err error) {
	if err := p.expect('['); err != nil {
		return nil, nil, err
	}
	p.ws()
	if rest, ok := strings.CutPrefix(p.src[p.pos:], finalShapePrefix); ok {
		text, _, ok := strings.Cut(rest, finalShapeSuffix)
		if !ok || strings.ContainsAny(text, "\n]") {
			return nil, nil, fmt.Errorf("unterminated %q line", finalShapePrefix)
		}
		if final, err = parseExportDims(text, false); err != nil {
			return nil, nil, fmt.Errorf("final shape: %w", err)
		}
		p.pos += len(finalShapePrefix) + len(text) + len(finalShapeSuffix)
	}
	vals = []string{}
	if p.peek() == ']' {
		p.pos++
		return final, vals, nil
	}
	for {
		p.ws()
		v, ok := numberToken(p.src[p.pos:])
		if !ok {
			return nil, nil, fmt.Errorf("value %d: want a number, found %s", len(vals), p.found())
		}
		vals = append(vals, v)
		p.pos += len(v)
		switch p.peek() {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return final, vals, nil
		default:
			return nil, nil, fmt.Errorf("after value %d: want ',' or ']', found %s", len(vals)-1, p.found())
		}
	}
}

// numberToken returns the number at the start of s: a JSON number or one
// of glibc's NaN and infinity spellings.
func numberToken(s string) (string, bool) {
	for _, w := range []string{"-nan", "nan", "-inf", "inf"} {
		if strings.HasPrefix(s, w) && !isWordByte(s, len(w)) {
			return w, true
		}
	}
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = digits(s, i)
	default:
		return "", false
	}
	if i < len(s) && s[i] == '.' {
		j := digits(s, i+1)
		if j == i+1 {
			return "", false
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := digits(s, j)
		if k == j {
			return "", false
		}
		i = k
	}
	if isWordByte(s, i) {
		return "", false
	}
	return s[:i], true
}

func digits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// isWordByte reports whether s[i] continues a token (so "info" is no "inf").
func isWordByte(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	c := s[i]
	return c == '.' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// skip passes over one JSON value of a member kiln does not read.
func (p *exportParser) skip(depth int) error {
	if depth > maxExportDepth {
		return errors.New("values nested too deeply")
	}
	switch c := p.peek(); c {
	case '"':
		_, err := p.str()
		return err
	case '[', '{':
		p.pos++
		end := byte(']')
		if c == '{' {
			end = '}'
		}
		if p.peek() == end {
			p.pos++
			return nil
		}
		for {
			if c == '{' {
				if _, err := p.str(); err != nil {
					return err
				}
				if err := p.expect(':'); err != nil {
					return err
				}
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			if p.peek() == ',' {
				p.pos++
				continue
			}
			return p.expect(end)
		}
	}
	for _, w := range []string{"true", "false", "null"} {
		if strings.HasPrefix(p.src[p.pos:], w) && !isWordByte(p.src, p.pos+len(w)) {
			p.pos += len(w)
			return nil
		}
	}
	if v, ok := numberToken(p.src[p.pos:]); ok {
		p.pos += len(v)
		return nil
	}
	return fmt.Errorf("want a value, found %s", p.found())
}

// parseExportDims reads "1x10" ("" for a scalar); unknown (-1) sizes are
// allowed only where trtexec writes them, in "dimensions".
func parseExportDims(s string, unknownOK bool) ([]int64, error) {
	dims := []int64{}
	if s == "" {
		return dims, nil
	}
	for _, part := range strings.Split(s, "x") {
		d, err := strconv.ParseInt(part, 10, 64)
		if err != nil || d < -1 || (d == -1 && !unknownOK) {
			return nil, fmt.Errorf("bad dimensions %q", s)
		}
		dims = append(dims, d)
	}
	return dims, nil
}

func dimsText(dims []int64) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, "x")
}

// FormatExportOutput writes outputs in the layout trtexec's --exportOutput
// writes, values verbatim (they must be what ParseExportOutput accepts).
// Tests use it to give the trtexec test double its outputs.
func FormatExportOutput(outs []ExportedOutput) []byte {
	var b bytes.Buffer
	b.WriteString("[\n")
	sep := "  "
	for _, o := range outs {
		fmt.Fprintf(&b, "%s{ \"name\" : %s\n", sep, jsonString(o.Name))
		sep = ", "
		fmt.Fprintf(&b, "  %s\"dimensions\" : \"%s\"\n", sep, dimsText(o.Dims))
		fmt.Fprintf(&b, "  %s\"values\" : [ %s ]\n  }\n", sep, strings.Join(o.Values, sep))
	}
	b.WriteString("]\n")
	return b.Bytes()
}

// jsonString quotes s for JSON. trtexec writes names unquoted; for the names
// it can write (no '"' or '\') the two agree.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
