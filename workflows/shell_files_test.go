package workflows_test

import (
	"fmt"
	"regexp"
	"strings"
)

// shellCmd is one simple command of a shell script: its words after
// quoting and expansion, the line it starts on, and the variables it used
// that the script's environment does not define.
type shellCmd struct {
	line    int
	words   []string
	unknown []string
}

// shellLexer splits a POSIX shell script into simple commands as far as the
// workflow files need it: quotes, backslash escapes and continuations,
// comments, $NAME and ${NAME[:-default]} expansion (unquoted ones split
// into fields at blanks), $(...) taken as one
// opaque value, redirections dropped, here-documents skipped, and commands
// separated by newlines, ;, &, &&, |, || and parentheses. Assignments alone
// on a command set variables for the commands after them.
type shellLexer struct {
	src      []rune
	i, line  int
	vars     map[string]string
	cmds     []shellCmd
	cur      shellCmd
	word     strings.Builder
	inWord   bool
	dropNext bool // the next word is a redirection target
	heredoc  bool // the next word is a here-document terminator
	pending  []string
}

// opaque stands for what the lexer does not evaluate ($(...), $1, $@).
const opaque = "x"

var (
	assignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	nameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*`)
)

// shellCommands lexes script, whose first line is line first of its file,
// with vars as the environment.
func shellCommands(script string, first int, vars map[string]string) ([]shellCmd, error) {
	env := make(map[string]string, len(vars))
	for k, v := range vars {
		env[k] = v
	}
	lx := &shellLexer{src: []rune(script), line: first, vars: env}
	if err := lx.run(); err != nil {
		return nil, fmt.Errorf("line %d: %w", lx.line, err)
	}
	return lx.cmds, nil
}

func (lx *shellLexer) peek(k int) rune {
	if lx.i+k < len(lx.src) {
		return lx.src[lx.i+k]
	}
	return 0
}

// index is the position of the first r at or after from, or -1.
func (lx *shellLexer) index(from int, r rune) int {
	for j := from; j < len(lx.src); j++ {
		if lx.src[j] == r {
			return j
		}
	}
	return -1
}

func (lx *shellLexer) run() error {
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		switch {
		case c == '\\' && lx.peek(1) == '\n':
			lx.i += 2
			lx.line++
		case c == '\\':
			lx.add(string(lx.peek(1)))
			lx.i += 2
		case c == '\'':
			end := lx.index(lx.i+1, '\'')
			if end < 0 {
				return fmt.Errorf("unterminated single quote")
			}
			s := string(lx.src[lx.i+1 : end])
			lx.add(s)
			lx.line += strings.Count(s, "\n")
			lx.i = end + 1
		case c == '"':
			if err := lx.double(); err != nil {
				return err
			}
		case c == '$':
			lx.split(lx.dollar())
		case c == '#' && !lx.inWord:
			for lx.i < len(lx.src) && lx.src[lx.i] != '\n' {
				lx.i++
			}
		case c == ' ' || c == '\t':
			lx.endWord()
			lx.i++
		case c == '\n':
			lx.endCmd()
			lx.i++
			lx.line++
			lx.skipHeredocs()
		case strings.ContainsRune(";&|()", c):
			lx.endCmd()
			lx.i++
		case c == '<' || c == '>':
			lx.redirect()
		default:
			lx.add(string(c))
			lx.i++
		}
	}
	lx.endCmd()
	return nil
}

func (lx *shellLexer) add(s string) {
	if !lx.inWord && len(lx.cur.words) == 0 {
		lx.cur.line = lx.line
	}
	lx.word.WriteString(s)
	lx.inWord = true
}

// split adds an unquoted expansion: its fields split at blanks, as the
// shell splits them (an empty one adds no word).
func (lx *shellLexer) split(s string) {
	for i, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' }) {
		if i > 0 || strings.IndexAny(s[:1], " \t\n") == 0 {
			lx.endWord()
		}
		lx.add(f)
	}
	if s != "" && strings.ContainsAny(s[len(s)-1:], " \t\n") {
		lx.endWord()
	}
}

// double reads a double-quoted string: only \ before $ ` " \ newline
// escapes, and $ expands.
func (lx *shellLexer) double() error {
	lx.add("")
	lx.i++
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		switch {
		case c == '"':
			lx.i++
			return nil
		case c == '\\' && lx.peek(1) == '\n':
			lx.i += 2
			lx.line++
		case c == '\\' && strings.ContainsRune("$`\"\\", lx.peek(1)):
			lx.add(string(lx.peek(1)))
			lx.i += 2
		case c == '$':
			lx.add(lx.dollar())
		default:
			if c == '\n' {
				lx.line++
			}
			lx.add(string(c))
			lx.i++
		}
	}
	return fmt.Errorf("unterminated double quote")
}

// dollar expands the parameter or substitution at lx.i.
func (lx *shellLexer) dollar() string {
	lx.i++
	switch c := lx.peek(0); {
	case c == '(':
		depth := 0
		for ; lx.i < len(lx.src); lx.i++ {
			switch lx.src[lx.i] {
			case '(':
				depth++
			case ')':
				depth--
			}
			if depth == 0 {
				lx.i++
				return opaque
			}
		}
		return opaque
	case c == '{':
		end := lx.index(lx.i, '}')
		if end < 0 {
			return "$"
		}
		body := string(lx.src[lx.i+1 : end])
		lx.i = end + 1
		return lx.brace(body)
	case strings.ContainsRune("@*#?$!-0123456789", c):
		lx.i++
		return opaque
	}
	name := nameRE.FindString(string(lx.src[lx.i:]))
	if name == "" {
		return "$"
	}
	lx.i += len(name)
	return lx.lookup(name)
}

// brace expands ${NAME}, ${NAME:-word}, ${NAME-word} and, taking the
// value as it is, the other operators.
func (lx *shellLexer) brace(body string) string {
	name := nameRE.FindString(body)
	if name == "" {
		return opaque
	}
	op := body[len(name):]
	if v, ok := lx.vars[name]; ok {
		return v
	}
	for _, p := range []string{":-", "-"} {
		if strings.HasPrefix(op, p) {
			return op[len(p):]
		}
	}
	return lx.lookup(name)
}

func (lx *shellLexer) lookup(name string) string {
	if v, ok := lx.vars[name]; ok {
		return v
	}
	lx.cur.unknown = append(lx.cur.unknown, name)
	return opaque
}

// redirect drops a redirection: its operator, the file descriptor number
// before it and the word after it; a here-document's word is its
// terminator.
func (lx *shellLexer) redirect() {
	if lx.inWord && strings.Trim(lx.word.String(), "0123456789") == "" {
		lx.word.Reset()
		lx.inWord = false
	}
	lx.endWord()
	if lx.peek(0) == '<' && lx.peek(1) == '<' && lx.peek(2) != '<' {
		lx.heredoc = true
	}
	for lx.i < len(lx.src) && strings.ContainsRune("<>&-", lx.src[lx.i]) {
		lx.i++
	}
	lx.dropNext = true
}

func (lx *shellLexer) endWord() {
	if !lx.inWord {
		return
	}
	w := lx.word.String()
	lx.word.Reset()
	lx.inWord = false
	switch {
	case lx.heredoc:
		lx.pending = append(lx.pending, w)
		lx.heredoc, lx.dropNext = false, false
	case lx.dropNext:
		lx.dropNext = false
	default:
		lx.cur.words = append(lx.cur.words, w)
	}
}

// endCmd closes the current command; a command of assignments only sets
// its variables.
func (lx *shellLexer) endCmd() {
	lx.endWord()
	lx.dropNext, lx.heredoc = false, false
	words := lx.cur.words
	if len(words) == 0 {
		lx.cur = shellCmd{}
		return
	}
	all := true
	for _, w := range words {
		all = all && assignRE.MatchString(w)
	}
	if all {
		for _, w := range words {
			k, v, _ := strings.Cut(w, "=")
			lx.vars[k] = v
		}
	} else {
		lx.cmds = append(lx.cmds, lx.cur)
	}
	lx.cur = shellCmd{}
}

// skipHeredocs skips the bodies of the here-documents opened on the line
// just ended.
func (lx *shellLexer) skipHeredocs() {
	for _, term := range lx.pending {
		for lx.i < len(lx.src) {
			end := lx.index(lx.i, '\n')
			if end < 0 {
				end = len(lx.src)
			}
			l := string(lx.src[lx.i:end])
			lx.i = end + 1
			lx.line++
			if strings.TrimLeft(l, "\t") == term {
				break
			}
		}
	}
	lx.pending = nil
}

// shellKeywords may stand before a command's name.
var shellKeywords = map[string]bool{
	"if": true, "then": true, "else": true, "elif": true, "do": true, "while": true,
	"until": true, "!": true, "time": true, "exec": true, "{": true, "command": true,
}

// commandWords is a command's name and arguments, without the keywords and
// assignments before them.
func commandWords(words []string) []string {
	for len(words) > 0 && (shellKeywords[words[0]] || assignRE.MatchString(words[0])) {
		words = words[1:]
	}
	return words
}

// isKiln says whether a command name runs kiln.
func isKiln(name string) bool { return name == "kiln" || strings.HasSuffix(name, "/kiln") }
