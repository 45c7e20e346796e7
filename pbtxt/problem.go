package pbtxt

import (
	"fmt"
	"sort"
	"strings"
)

// Severity says whether a problem stops Triton from loading the model.
type Severity int

// Severities, most severe first.
const (
	// SeverityError: Triton refuses the config or the model fails to load
	// or serve.
	SeverityError Severity = iota
	// SeverityWarning: Triton loads the model, but the config is probably
	// not what was meant (an ignored setting, a setting filled in by
	// auto-complete).
	SeverityWarning
)

// String returns "error" or "warning".
func (s Severity) String() string {
	if s == SeverityWarning {
		return "warning"
	}
	return "error"
}

// MarshalText writes "error" or "warning" (used by JSON output).
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads "error" or "warning".
func (s *Severity) UnmarshalText(b []byte) error {
	switch string(b) {
	case "error":
		*s = SeverityError
	case "warning":
		*s = SeverityWarning
	default:
		return fmt.Errorf("unknown severity %q (want error or warning)", b)
	}
	return nil
}

// Problem is one thing wrong with a config or a repository. Path names the
// field (`input[1].dims`, `dynamic_batching.preferred_batch_size[0]`) or is
// empty for the config as a whole; Message says what is wrong and what would
// be right. File is the config or model directory it was found in, when known.
type Problem struct {
	File     string   `json:"file,omitempty"`
	Path     string   `json:"path"`
	Message  string   `json:"message"`
	Severity Severity `json:"severity"`
}

// String formats the problem as "file: severity: path: message".
func (p Problem) String() string {
	var sb strings.Builder
	if p.File != "" {
		sb.WriteString(p.File + ": ")
	}
	sb.WriteString(p.Severity.String() + ": ")
	if p.Path != "" {
		sb.WriteString(p.Path + ": ")
	}
	sb.WriteString(p.Message)
	return sb.String()
}

// Problems is a list of problems with helpers for reporting.
type Problems []Problem

// Errors returns only the problems of severity SeverityError.
func (ps Problems) Errors() Problems {
	var out Problems
	for _, p := range ps {
		if p.Severity == SeverityError {
			out = append(out, p)
		}
	}
	return out
}

// HasErrors reports whether any problem is of severity SeverityError.
func (ps Problems) HasErrors() bool { return len(ps.Errors()) > 0 }

// Sort orders problems by file, then errors before warnings, keeping the
// order of discovery otherwise (which follows the config's field order).
func (ps Problems) Sort() {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].File != ps[j].File {
			return ps[i].File < ps[j].File
		}
		return ps[i].Severity < ps[j].Severity
	})
}

// WithFile sets File on every problem that has none.
func (ps Problems) WithFile(file string) Problems {
	for i := range ps {
		if ps[i].File == "" {
			ps[i].File = file
		}
	}
	return ps
}

// collector gathers problems while checking.
type collector struct {
	ps Problems
}

func (c *collector) errorf(path, format string, args ...any) {
	c.ps = append(c.ps, Problem{Path: path, Message: fmt.Sprintf(format, args...), Severity: SeverityError})
}

func (c *collector) warnf(path, format string, args ...any) {
	c.ps = append(c.ps, Problem{Path: path, Message: fmt.Sprintf(format, args...), Severity: SeverityWarning})
}

// at formats a field path with an index: at("input", 1) = "input[1]".
func at(field string, i int) string { return fmt.Sprintf("%s[%d]", field, i) }

// key formats a map entry path: key("parameters", "x") = `parameters["x"]`.
func key(field string, k any) string {
	if s, ok := k.(string); ok {
		return fmt.Sprintf("%s[%q]", field, s)
	}
	return fmt.Sprintf("%s[%v]", field, k)
}

// dimsString prints dims the way Triton does in messages: [-1,3,224,224].
func dimsString(d []int64) string {
	parts := make([]string, len(d))
	for i, v := range d {
		parts[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(parts, ",") + "]"
}
