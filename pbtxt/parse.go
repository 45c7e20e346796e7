package pbtxt

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// Parse reads a model configuration in protobuf text format. It accepts what
// Triton's parser accepts: `#` comments, lists (`input [ {...}, {...} ]`) and
// repeated fields (`input {...} input {...}`), an optional ':' before a
// message, '<' '>' as message brackets, ',' or ';' after a field. A syntax
// error is a *SyntaxError with line and column.
func Parse(data []byte) (*configpb.ModelConfig, error) {
	c := &configpb.ModelConfig{}
	if err := ParseInto(data, c.ProtoReflect()); err != nil {
		return nil, err
	}
	return c, nil
}

// ParseFile reads and parses a config file; syntax errors carry the file name.
func ParseFile(path string) (*configpb.ModelConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading model config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		var se *SyntaxError
		if errors.As(err, &se) {
			se.File = path
			return nil, se
		}
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	return c, nil
}

// ParseInto parses text format into any message (the model config, or a
// fragment such as a single ModelInput), merging into what m holds.
func ParseInto(data []byte, m protoreflect.Message) error {
	p := &parser{lx: lexer{src: data}}
	if err := p.advance(); err != nil {
		return err
	}
	return p.message(m, "", token{})
}

type parser struct {
	lx  lexer
	tok token
}

func (p *parser) advance() error {
	t, err := p.lx.next()
	if err != nil {
		return err
	}
	p.tok = t
	return nil
}

func (p *parser) errorf(off int, format string, args ...any) error {
	return errorAt(p.lx.src, off, format, args...)
}

func (p *parser) isSym(s string) bool { return p.tok.kind == tSymbol && p.tok.text == s }

// consume skips the current token when it is the symbol s.
func (p *parser) consume(s string) (bool, error) {
	if !p.isSym(s) {
		return false, nil
	}
	return true, p.advance()
}

// message parses fields until the closing symbol end ("" means end of input).
// open is the token that opened the message, for error messages.
func (p *parser) message(m protoreflect.Message, end string, open token) error {
	md := m.Descriptor()
	seen := map[protoreflect.FieldNumber]bool{}
	for {
		switch {
		case p.tok.kind == tEOF:
			if end == "" {
				return nil
			}
			return p.errorf(p.tok.off, "missing '%s' to close the message opened at %s", end, p.position(open.off))
		case end != "" && p.isSym(end):
			return p.advance()
		case p.isSym("["):
			return p.errorf(p.tok.off, "extensions and Any fields are not part of a Triton model configuration")
		case p.tok.kind != tIdent:
			if end == "" && (p.isSym("}") || p.isSym(">")) {
				return p.errorf(p.tok.off, "unexpected %s: no message is open here", p.tok.describe())
			}
			return p.errorf(p.tok.off, "expected a field name of %s, found %s", md.FullName(), p.tok.describe())
		}
		nameTok := p.tok
		fd := md.Fields().ByName(protoreflect.Name(nameTok.text))
		if fd == nil {
			return p.unknownField(md, nameTok)
		}
		if err := p.advance(); err != nil {
			return err
		}
		if !fd.IsList() && !fd.IsMap() {
			if seen[fd.Number()] {
				return p.errorf(nameTok.off, "field %q is set more than once; it is not repeated", fd.Name())
			}
			if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
				if other := m.WhichOneof(od); other != nil && other.Number() != fd.Number() {
					return p.errorf(nameTok.off, "field %q cannot be set together with %q: both belong to oneof %q", fd.Name(), other.Name(), od.Name())
				}
			}
			seen[fd.Number()] = true
		}
		if err := p.field(m, fd, nameTok); err != nil {
			return err
		}
		if _, err := p.consume(","); err != nil {
			return err
		}
		if _, err := p.consume(";"); err != nil {
			return err
		}
	}
}

func (p *parser) position(off int) string {
	e := errorAt(p.lx.src, off, "")
	return fmt.Sprintf("%d:%d", e.Line, e.Col)
}

func (p *parser) unknownField(md protoreflect.MessageDescriptor, t token) error {
	names := make([]string, md.Fields().Len())
	for i := range names {
		names[i] = string(md.Fields().Get(i).Name())
	}
	msg := fmt.Sprintf("unknown field %q in %s", t.text, md.FullName())
	if s := closest(t.text, names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return p.errorf(t.off, "%s", msg)
}

// field parses the value part of one field.
func (p *parser) field(m protoreflect.Message, fd protoreflect.FieldDescriptor, name token) error {
	isMsg := fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
	colon, err := p.consume(":")
	if err != nil {
		return err
	}
	if !isMsg && !colon {
		return p.errorf(p.tok.off, "expected ':' after field name %q, found %s", fd.Name(), p.tok.describe())
	}
	if p.isSym("[") {
		if !fd.IsList() && !fd.IsMap() {
			return p.errorf(p.tok.off, "field %q is not repeated, so it cannot take a list '[ ... ]'", fd.Name())
		}
		if err := p.advance(); err != nil {
			return err
		}
		if ok, err := p.consume("]"); ok || err != nil {
			return err
		}
		for {
			if err := p.value(m, fd); err != nil {
				return err
			}
			if ok, err := p.consume("]"); ok || err != nil {
				return err
			}
			if !p.isSym(",") {
				return p.errorf(p.tok.off, "expected ',' or ']' in the list of %q, found %s", fd.Name(), p.tok.describe())
			}
			if err := p.advance(); err != nil {
				return err
			}
		}
	}
	return p.value(m, fd)
}

// value parses one value of fd (one element when fd is repeated) and stores it.
func (p *parser) value(m protoreflect.Message, fd protoreflect.FieldDescriptor) error {
	switch {
	case fd.IsMap():
		return p.mapEntry(m.Mutable(fd).Map(), fd)
	case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
		if fd.IsList() {
			l := m.Mutable(fd).List()
			v := l.NewElement()
			if err := p.messageValue(v.Message(), fd); err != nil {
				return err
			}
			l.Append(v)
			return nil
		}
		return p.messageValue(m.Mutable(fd).Message(), fd)
	}
	v, err := p.scalar(fd)
	if err != nil {
		return err
	}
	if fd.IsList() {
		m.Mutable(fd).List().Append(v)
	} else {
		m.Set(fd, v)
	}
	return nil
}

// messageValue parses '{' fields '}' or '<' fields '>'.
func (p *parser) messageValue(m protoreflect.Message, fd protoreflect.FieldDescriptor) error {
	open, end, err := p.openBrace(fmt.Sprintf("the value of %q", fd.Name()))
	if err != nil {
		return err
	}
	return p.message(m, end, open)
}

// openBrace consumes '{' or '<' and returns it with the closing symbol it needs.
func (p *parser) openBrace(what string) (open token, end string, err error) {
	open = p.tok
	switch {
	case p.isSym("{"):
		end = "}"
	case p.isSym("<"):
		end = ">"
	default:
		return open, "", p.errorf(p.tok.off, "expected '{' to start %s, found %s", what, p.tok.describe())
	}
	return open, end, p.advance()
}

// mapEntry parses one `{ key: K value: V }` entry; a later key replaces an
// earlier one, as in protobuf's own parsers.
func (p *parser) mapEntry(mp protoreflect.Map, fd protoreflect.FieldDescriptor) error {
	open, end, err := p.openBrace(fmt.Sprintf("an entry of map %q", fd.Name()))
	if err != nil {
		return err
	}
	kd, vd := fd.MapKey(), fd.MapValue()
	key := kd.Default()
	var val protoreflect.Value
	valueIsMsg := vd.Kind() == protoreflect.MessageKind
	if valueIsMsg {
		val = mp.NewValue()
	} else {
		val = vd.Default()
	}
	var haveKey, haveVal bool
	for {
		switch {
		case p.tok.kind == tEOF:
			return p.errorf(p.tok.off, "missing '%s' to close the map entry opened at %s", end, p.position(open.off))
		case p.isSym(end):
			if err := p.advance(); err != nil {
				return err
			}
			mp.Set(key.MapKey(), val)
			return nil
		case p.tok.kind != tIdent || (p.tok.text != "key" && p.tok.text != "value"):
			return p.errorf(p.tok.off, "expected 'key' or 'value' in an entry of map %q, found %s", fd.Name(), p.tok.describe())
		}
		nameTok := p.tok
		isKey := nameTok.text == "key"
		if (isKey && haveKey) || (!isKey && haveVal) {
			return p.errorf(nameTok.off, "%q is set more than once in one entry of map %q", nameTok.text, fd.Name())
		}
		if err := p.advance(); err != nil {
			return err
		}
		colon, err := p.consume(":")
		if err != nil {
			return err
		}
		switch {
		case isKey:
			if !colon {
				return p.errorf(p.tok.off, "expected ':' after 'key', found %s", p.tok.describe())
			}
			if key, err = p.scalar(kd); err != nil {
				return err
			}
			haveKey = true
		case valueIsMsg:
			if err := p.messageValue(val.Message(), fd); err != nil {
				return err
			}
			haveVal = true
		default:
			if !colon {
				return p.errorf(p.tok.off, "expected ':' after 'value', found %s", p.tok.describe())
			}
			if val, err = p.scalar(vd); err != nil {
				return err
			}
			haveVal = true
		}
		if _, err := p.consume(","); err != nil {
			return err
		}
		if _, err := p.consume(";"); err != nil {
			return err
		}
	}
}

// scalar parses one scalar value of fd's kind.
func (p *parser) scalar(fd protoreflect.FieldDescriptor) (protoreflect.Value, error) {
	start := p.tok
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind:
		if p.tok.kind != tString {
			return protoreflect.Value{}, p.errorf(p.tok.off, "expected a quoted string for %q, found %s", fd.Name(), p.tok.describe())
		}
		var sb strings.Builder
		for p.tok.kind == tString {
			sb.WriteString(p.tok.text)
			if err := p.advance(); err != nil {
				return protoreflect.Value{}, err
			}
		}
		if fd.Kind() == protoreflect.BytesKind {
			return protoreflect.ValueOfBytes([]byte(sb.String())), nil
		}
		if !utf8.ValidString(sb.String()) {
			return protoreflect.Value{}, p.errorf(start.off, "string for %q is not valid UTF-8", fd.Name())
		}
		return protoreflect.ValueOfString(sb.String()), nil
	case protoreflect.BoolKind:
		var b bool
		switch p.tok.text {
		case "true", "True", "t", "1":
			b = true
		case "false", "False", "f", "0":
		default:
			return protoreflect.Value{}, p.errorf(p.tok.off, "expected true or false for %q, found %s", fd.Name(), p.tok.describe())
		}
		if p.tok.kind != tIdent && p.tok.kind != tNumber {
			return protoreflect.Value{}, p.errorf(p.tok.off, "expected true or false for %q, found %s", fd.Name(), p.tok.describe())
		}
		return protoreflect.ValueOfBool(b), p.advance()
	case protoreflect.EnumKind:
		return p.enum(fd)
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return p.float(fd)
	}
	return p.integer(fd)
}

func (p *parser) enum(fd protoreflect.FieldDescriptor) (protoreflect.Value, error) {
	ed := fd.Enum()
	if p.tok.kind == tIdent {
		ev := ed.Values().ByName(protoreflect.Name(p.tok.text))
		if ev == nil {
			names := make([]string, ed.Values().Len())
			for i := range names {
				names[i] = string(ed.Values().Get(i).Name())
			}
			msg := fmt.Sprintf("unknown value %q for %q (enum %s)", p.tok.text, fd.Name(), ed.FullName())
			if s := closest(p.tok.text, names); s != "" {
				msg += fmt.Sprintf("; did you mean %s?", s)
			} else {
				msg += "; expected one of " + strings.Join(names, ", ")
			}
			return protoreflect.Value{}, p.errorf(p.tok.off, "%s", msg)
		}
		return protoreflect.ValueOfEnum(ev.Number()), p.advance()
	}
	start := p.tok.off
	n, err := p.signedInt(fd)
	if err != nil {
		return protoreflect.Value{}, err
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		return protoreflect.Value{}, p.errorf(start, "enum number %d for %q is out of range", n, fd.Name())
	}
	return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), nil
}

// signedInt reads an optional '-' and an integer literal.
func (p *parser) signedInt(fd protoreflect.FieldDescriptor) (int64, error) {
	start := p.tok.off
	neg, err := p.consume("-")
	if err != nil {
		return 0, err
	}
	if p.tok.kind != tNumber {
		return 0, p.errorf(p.tok.off, "expected an integer for %q, found %s", fd.Name(), p.tok.describe())
	}
	u, ok := parseUint(p.tok.text)
	if !ok {
		return 0, p.errorf(p.tok.off, "expected an integer for %q, found %s", fd.Name(), p.tok.describe())
	}
	if err := p.advance(); err != nil {
		return 0, err
	}
	if neg {
		if u > 1<<63 {
			return 0, p.errorf(start, "integer for %q is out of range", fd.Name())
		}
		return -int64(u), nil
	}
	if u > math.MaxInt64 {
		return 0, p.errorf(start, "integer for %q is out of range", fd.Name())
	}
	return int64(u), nil
}

func (p *parser) integer(fd protoreflect.FieldDescriptor) (protoreflect.Value, error) {
	start := p.tok.off
	switch fd.Kind() {
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if p.isSym("-") {
			return protoreflect.Value{}, p.errorf(start, "%q is unsigned and cannot be negative", fd.Name())
		}
		if p.tok.kind != tNumber {
			return protoreflect.Value{}, p.errorf(p.tok.off, "expected a non-negative integer for %q, found %s", fd.Name(), p.tok.describe())
		}
		u, ok := parseUint(p.tok.text)
		if !ok {
			return protoreflect.Value{}, p.errorf(p.tok.off, "expected a non-negative integer for %q, found %s", fd.Name(), p.tok.describe())
		}
		if err := p.advance(); err != nil {
			return protoreflect.Value{}, err
		}
		if fd.Kind() == protoreflect.Uint32Kind || fd.Kind() == protoreflect.Fixed32Kind {
			if u > math.MaxUint32 {
				return protoreflect.Value{}, p.errorf(start, "%d is too large for %q (uint32)", u, fd.Name())
			}
			return protoreflect.ValueOfUint32(uint32(u)), nil
		}
		return protoreflect.ValueOfUint64(u), nil
	}
	n, err := p.signedInt(fd)
	if err != nil {
		return protoreflect.Value{}, err
	}
	switch fd.Kind() {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if n < math.MinInt32 || n > math.MaxInt32 {
			return protoreflect.Value{}, p.errorf(start, "%d is out of range for %q (int32)", n, fd.Name())
		}
		return protoreflect.ValueOfInt32(int32(n)), nil
	}
	return protoreflect.ValueOfInt64(n), nil
}

// parseUint reads a decimal, hexadecimal (0x) or octal (leading 0) literal.
func parseUint(s string) (uint64, bool) {
	var u uint64
	var err error
	switch {
	case len(s) > 2 && (s[1] == 'x' || s[1] == 'X'):
		u, err = strconv.ParseUint(s[2:], 16, 64)
	case len(s) > 1 && s[0] == '0':
		u, err = strconv.ParseUint(s[1:], 8, 64)
	default:
		u, err = strconv.ParseUint(s, 10, 64)
	}
	return u, err == nil
}

func (p *parser) float(fd protoreflect.FieldDescriptor) (protoreflect.Value, error) {
	neg, err := p.consume("-")
	if err != nil {
		return protoreflect.Value{}, err
	}
	var f float64
	switch {
	case p.tok.kind == tIdent:
		switch strings.ToLower(p.tok.text) {
		case "inf", "infinity":
			f = math.Inf(1)
		case "nan":
			f = math.NaN()
		default:
			return protoreflect.Value{}, p.errorf(p.tok.off, "expected a number for %q, found %s", fd.Name(), p.tok.describe())
		}
	case p.tok.kind == tNumber:
		s := p.tok.text
		if len(s) > 2 && (s[1] == 'x' || s[1] == 'X') {
			u, ok := parseUint(s)
			if !ok {
				return protoreflect.Value{}, p.errorf(p.tok.off, "invalid number %q for %q", p.tok.text, fd.Name())
			}
			f = float64(u)
		} else if f, err = strconv.ParseFloat(strings.TrimRight(s, "fF"), 64); err != nil && !errors.Is(err, strconv.ErrRange) {
			return protoreflect.Value{}, p.errorf(p.tok.off, "invalid number %q for %q", p.tok.text, fd.Name())
		}
	default:
		return protoreflect.Value{}, p.errorf(p.tok.off, "expected a number for %q, found %s", fd.Name(), p.tok.describe())
	}
	if err := p.advance(); err != nil {
		return protoreflect.Value{}, err
	}
	if neg {
		f = -f
	}
	if fd.Kind() == protoreflect.FloatKind {
		return protoreflect.ValueOfFloat32(float32(f)), nil
	}
	return protoreflect.ValueOfFloat64(f), nil
}
