package pbtxt

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// SyntaxError is text that is not a valid inference.ModelConfig in protobuf
// text format. Line and Col are 1-based; Col counts characters.
type SyntaxError struct {
	File string `json:"file,omitempty"`
	Line int    `json:"line"`
	Col  int    `json:"col"`
	Msg  string `json:"message"`
}

// Error formats the error as file:line:col: message.
func (e *SyntaxError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
	}
	return fmt.Sprintf("%d:%d: %s", e.Line, e.Col, e.Msg)
}

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tNumber
	tString
	tSymbol
)

type token struct {
	kind tokKind
	text string // raw text; for strings the decoded bytes
	off  int    // byte offset of the first character
}

func (t token) describe() string {
	switch t.kind {
	case tEOF:
		return "end of file"
	case tString:
		return "string " + quote(t.text)
	case tSymbol:
		return "'" + t.text + "'"
	}
	return "'" + t.text + "'"
}

// lexer splits protobuf text format into tokens, skipping whitespace and
// '#' comments.
type lexer struct {
	src []byte
	off int
}

// errorAt builds a SyntaxError for byte offset off.
func errorAt(src []byte, off int, format string, args ...any) *SyntaxError {
	if off > len(src) {
		off = len(src)
	}
	line, start := 1, 0
	for i := 0; i < off; i++ {
		if src[i] == '\n' {
			line++
			start = i + 1
		}
	}
	return &SyntaxError{Line: line, Col: utf8.RuneCount(src[start:off]) + 1, Msg: fmt.Sprintf(format, args...)}
}

func (l *lexer) errorf(off int, format string, args ...any) error {
	return errorAt(l.src, off, format, args...)
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) }

func (l *lexer) next() (token, error) {
	for l.off < len(l.src) {
		c := l.src[l.off]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' {
			l.off++
			continue
		}
		if c == '#' {
			for l.off < len(l.src) && l.src[l.off] != '\n' {
				l.off++
			}
			continue
		}
		break
	}
	start := l.off
	if l.off >= len(l.src) {
		return token{kind: tEOF, off: start}, nil
	}
	c := l.src[l.off]
	switch {
	case isIdentStart(c):
		for l.off < len(l.src) && isIdentChar(l.src[l.off]) {
			l.off++
		}
		return token{kind: tIdent, text: string(l.src[start:l.off]), off: start}, nil
	case isDigit(c) || (c == '.' && l.off+1 < len(l.src) && isDigit(l.src[l.off+1])):
		return l.number()
	case c == '"' || c == '\'':
		return l.str()
	case strings.IndexByte("{}[]<>:,;-", c) >= 0:
		l.off++
		return token{kind: tSymbol, text: string(c), off: start}, nil
	}
	r, _ := utf8.DecodeRune(l.src[l.off:])
	return token{}, l.errorf(start, "unexpected character %q", r)
}

func (l *lexer) number() (token, error) {
	start := l.off
	s := l.src
	if s[l.off] == '0' && l.off+1 < len(s) && (s[l.off+1] == 'x' || s[l.off+1] == 'X') {
		l.off += 2
		for l.off < len(s) && strings.IndexByte("0123456789abcdefABCDEF", s[l.off]) >= 0 {
			l.off++
		}
		if l.off == start+2 {
			return token{}, l.errorf(start, "hexadecimal number %q has no digits", string(s[start:l.off]))
		}
	} else {
		for l.off < len(s) && isDigit(s[l.off]) {
			l.off++
		}
		if l.off < len(s) && s[l.off] == '.' {
			l.off++
			for l.off < len(s) && isDigit(s[l.off]) {
				l.off++
			}
		}
		if l.off < len(s) && (s[l.off] == 'e' || s[l.off] == 'E') {
			l.off++
			if l.off < len(s) && (s[l.off] == '+' || s[l.off] == '-') {
				l.off++
			}
			digits := l.off
			for l.off < len(s) && isDigit(s[l.off]) {
				l.off++
			}
			if l.off == digits {
				return token{}, l.errorf(start, "number %q has an exponent without digits", string(s[start:l.off]))
			}
		}
		if l.off < len(s) && (s[l.off] == 'f' || s[l.off] == 'F') {
			l.off++
		}
	}
	if l.off < len(s) && (isIdentChar(s[l.off]) || s[l.off] == '.') {
		end := l.off
		for end < len(s) && (isIdentChar(s[end]) || s[end] == '.') {
			end++
		}
		return token{}, l.errorf(start, "invalid number %q", string(s[start:end]))
	}
	return token{kind: tNumber, text: string(s[start:l.off]), off: start}, nil
}

// str reads a quoted string and decodes its C-style escapes.
func (l *lexer) str() (token, error) {
	start := l.off
	q := l.src[l.off]
	l.off++
	var b []byte
	for {
		if l.off >= len(l.src) || l.src[l.off] == '\n' {
			return token{}, l.errorf(start, "string is not terminated (missing closing %c)", q)
		}
		c := l.src[l.off]
		if c == q {
			l.off++
			return token{kind: tString, text: string(b), off: start}, nil
		}
		if c != '\\' {
			b = append(b, c)
			l.off++
			continue
		}
		esc := l.off
		l.off++
		if l.off >= len(l.src) {
			return token{}, l.errorf(start, "string is not terminated (missing closing %c)", q)
		}
		c = l.src[l.off]
		l.off++
		switch c {
		case 'n':
			b = append(b, '\n')
		case 't':
			b = append(b, '\t')
		case 'r':
			b = append(b, '\r')
		case 'a':
			b = append(b, '\a')
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'v':
			b = append(b, '\v')
		case '\\', '\'', '"', '?':
			b = append(b, c)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(c - '0')
			for i := 0; i < 2 && l.off < len(l.src) && l.src[l.off] >= '0' && l.src[l.off] <= '7'; i++ {
				v = v*8 + int(l.src[l.off]-'0')
				l.off++
			}
			if v > 255 {
				return token{}, l.errorf(esc, "octal escape \\%o is larger than one byte", v)
			}
			b = append(b, byte(v))
		case 'x', 'X':
			v, n := 0, 0
			for ; n < 2 && l.off < len(l.src); n++ {
				d := hexVal(l.src[l.off])
				if d < 0 {
					break
				}
				v = v*16 + d
				l.off++
			}
			if n == 0 {
				return token{}, l.errorf(esc, "\\x escape without hexadecimal digits")
			}
			b = append(b, byte(v))
		case 'u', 'U':
			n := 4
			if c == 'U' {
				n = 8
			}
			v := 0
			for i := 0; i < n; i++ {
				if l.off >= len(l.src) || hexVal(l.src[l.off]) < 0 {
					return token{}, l.errorf(esc, "\\%c escape needs %d hexadecimal digits", c, n)
				}
				v = v*16 + hexVal(l.src[l.off])
				l.off++
			}
			if v > utf8.MaxRune || (v >= 0xD800 && v <= 0xDFFF) {
				return token{}, l.errorf(esc, "\\%c escape %X is not a valid Unicode code point", c, v)
			}
			b = utf8.AppendRune(b, rune(v))
		default:
			return token{}, l.errorf(esc, "unknown escape sequence \\%c", c)
		}
	}
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// levenshtein is the edit distance between a and b, for "did you mean" hints.
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// closest returns the candidate nearest to s when it is near enough to be a
// likely typo, else "".
func closest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	for _, c := range candidates {
		if d := levenshtein(strings.ToLower(s), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if bestD <= max(2, len(s)/3) {
		return best
	}
	return ""
}
