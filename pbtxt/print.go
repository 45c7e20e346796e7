package pbtxt

import (
	"bytes"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// Print writes c in the style of Triton's documentation: two-space indent,
// fields in schema order, repeated messages as `input [ { ... }, { ... } ]`,
// repeated scalars as `dims: [ 3, 224, 224 ]`, map entries as separate
// `key:`/`value:` blocks sorted by key, enums bare and strings quoted. The
// output depends only on the message, so it is byte-stable across runs.
func Print(c *configpb.ModelConfig) []byte {
	return PrintMessage(c.ProtoReflect())
}

// PrintMessage prints any message (a whole config or a fragment) the way
// Print does.
func PrintMessage(m protoreflect.Message) []byte {
	var b bytes.Buffer
	writeFields(&b, m, 0)
	return b.Bytes()
}

// Format parses a config and prints it in house style.
func Format(data []byte) ([]byte, error) {
	c, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return Print(c), nil
}

func indent(b *bytes.Buffer, n int) {
	for i := 0; i < n; i++ {
		b.WriteByte(' ')
	}
}

func writeFields(b *bytes.Buffer, m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if !m.Has(fd) && !alwaysPrinted[fd.FullName()] {
			continue
		}
		v := m.Get(fd)
		switch {
		case fd.IsMap():
			writeMap(b, fd, v.Map(), depth)
		case fd.IsList() && isMessage(fd):
			l := v.List()
			indent(b, depth)
			b.WriteString(string(fd.Name()) + " [\n")
			for j := 0; j < l.Len(); j++ {
				writeBlock(b, "", l.Get(j).Message(), depth+2)
				if j < l.Len()-1 {
					b.Truncate(b.Len() - 1)
					b.WriteString(",\n")
				}
			}
			indent(b, depth)
			b.WriteString("]\n")
		case fd.IsList():
			l := v.List()
			indent(b, depth)
			b.WriteString(string(fd.Name()) + ": [ ")
			for j := 0; j < l.Len(); j++ {
				if j > 0 {
					b.WriteString(", ")
				}
				writeScalar(b, fd, l.Get(j))
			}
			b.WriteString(" ]\n")
		case isMessage(fd):
			writeBlock(b, string(fd.Name())+" ", v.Message(), depth)
		default:
			indent(b, depth)
			b.WriteString(string(fd.Name()) + ": ")
			writeScalar(b, fd, v)
			b.WriteByte('\n')
		}
	}
}

// writeBlock writes `prefix{ ... }`; an empty message stays on one line.
func writeBlock(b *bytes.Buffer, prefix string, m protoreflect.Message, depth int) {
	indent(b, depth)
	b.WriteString(prefix)
	var inner bytes.Buffer
	writeFields(&inner, m, depth+2)
	if inner.Len() == 0 {
		b.WriteString("{ }\n")
		return
	}
	b.WriteString("{\n")
	b.Write(inner.Bytes())
	indent(b, depth)
	b.WriteString("}\n")
}

func writeMap(b *bytes.Buffer, fd protoreflect.FieldDescriptor, mp protoreflect.Map, depth int) {
	keys := make([]protoreflect.MapKey, 0, mp.Len())
	mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k)
		return true
	})
	sort.Slice(keys, func(i, j int) bool { return lessKey(keys[i], keys[j]) })
	kd, vd := fd.MapKey(), fd.MapValue()
	for _, k := range keys {
		indent(b, depth)
		b.WriteString(string(fd.Name()) + " {\n")
		indent(b, depth+2)
		b.WriteString("key: ")
		writeScalar(b, kd, k.Value())
		b.WriteByte('\n')
		if isMessage(vd) {
			writeBlock(b, "value ", mp.Get(k).Message(), depth+2)
		} else {
			indent(b, depth+2)
			b.WriteString("value: ")
			writeScalar(b, vd, mp.Get(k))
			b.WriteByte('\n')
		}
		indent(b, depth)
		b.WriteString("}\n")
	}
}

func lessKey(a, b protoreflect.MapKey) bool {
	switch x := a.Interface().(type) {
	case string:
		return x < b.Interface().(string)
	case bool:
		return !x && b.Bool()
	case int32, int64:
		return a.Int() < b.Int()
	}
	return a.Uint() < b.Uint()
}

// alwaysPrinted are enum fields whose zero value is worth spelling out: a
// control or batch input reads wrong without its kind.
var alwaysPrinted = map[protoreflect.FullName]bool{
	"inference.ModelSequenceBatching.Control.kind": true,
	"inference.BatchInput.kind":                    true,
	"inference.BatchOutput.kind":                   true,
}

func isMessage(fd protoreflect.FieldDescriptor) bool {
	return fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
}

func writeScalar(b *bytes.Buffer, fd protoreflect.FieldDescriptor, v protoreflect.Value) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		b.WriteString(quote(v.String()))
	case protoreflect.BytesKind:
		b.WriteString(quote(string(v.Bytes())))
	case protoreflect.BoolKind:
		b.WriteString(strconv.FormatBool(v.Bool()))
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			b.WriteString(string(ev.Name()))
		} else {
			b.WriteString(strconv.Itoa(int(v.Enum())))
		}
	case protoreflect.FloatKind:
		b.WriteString(formatFloat(v.Float(), 32))
	case protoreflect.DoubleKind:
		b.WriteString(formatFloat(v.Float(), 64))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		b.WriteString(strconv.FormatUint(v.Uint(), 10))
	default:
		b.WriteString(strconv.FormatInt(v.Int(), 10))
	}
}

func formatFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return strconv.FormatFloat(f, 'g', -1, bits)
}

// quote writes s as a double-quoted text-format string. Printable characters
// stay as they are; everything else is escaped so that parsing gives back
// exactly the same bytes.
func quote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			sb.WriteString(`\"`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == utf8.RuneError && size == 1, !unicode.IsPrint(r):
			for _, c := range []byte(s[i : i+size]) {
				sb.WriteByte('\\')
				sb.WriteByte('0' + c>>6)
				sb.WriteByte('0' + (c>>3)&7)
				sb.WriteByte('0' + c&7)
			}
		default:
			sb.WriteString(s[i : i+size])
		}
		i += size
	}
	sb.WriteByte('"')
	return sb.String()
}
