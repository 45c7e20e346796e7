// Package execx runs external tools (trtexec, nvidia-smi, tritonserver) for
// kiln's stages.
//
// A tool runs in its own process group so that cancellation and timeouts
// stop it and every child it started: the group first gets SIGTERM, then,
// after a grace period, SIGKILL. Output is handed over line by line as it
// arrives (for progress and logs), copied whole to an optional writer (a log
// file), and kept as a bounded tail for error messages. Failures are typed:
// ToolError for a tool that ran and failed, NotFoundError for one that could
// not be found.
package execx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Defaults used when the corresponding Cmd field is zero.
const (
	// DefaultTailBytes is how much of the end of stdout and stderr Result keeps.
	DefaultTailBytes = 64 << 10
	// DefaultGrace is how long a tool may take to exit after SIGTERM before
	// its process group gets SIGKILL.
	DefaultGrace = 5 * time.Second
	// DefaultDrain is how long Run waits, after the tool exits, for children
	// that still hold its stdout or stderr open before killing them.
	DefaultDrain = 2 * time.Second
)

// Runner runs one external command to completion. Exec is the implementation
// that starts real processes; tests may substitute their own.
type Runner interface {
	Run(ctx context.Context, cmd Cmd) (*Result, error)
}

// Stream names the output stream a line came from.
type Stream int

// The two output streams of a tool.
const (
	Stdout Stream = iota
	Stderr
)

// String returns "stdout" or "stderr".
func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// Cmd describes one run of a tool. Only Path is required.
type Cmd struct {
	// Path is the executable: a path, or a bare name looked up in PATH.
	Path string
	// Args are the arguments, without the program name.
	Args []string
	// Dir is the working directory; empty means the current one.
	Dir string
	// Env is the environment; nil means the current process's environment.
	Env []string
	// Stdin is the tool's standard input; nil means /dev/null.
	Stdin io.Reader
	// Timeout stops the tool after this long; zero means no timeout.
	Timeout time.Duration
	// Grace is the time between SIGTERM and SIGKILL on cancel or timeout;
	// zero means DefaultGrace.
	Grace time.Duration
	// TailBytes bounds the tails kept in Result; zero means DefaultTailBytes.
	TailBytes int
	// OnLine, when set, is called with every output line (without its line
	// ending) as it arrives. Calls are serialized; it must return quickly.
	OnLine func(Line)
	// Output, when set, receives every line of stdout and stderr, each with a
	// trailing newline, in arrival order (a combined log file). Lines from
	// the two streams never interleave within a line.
	Output io.Writer
}

// Line is one line of tool output.
type Line struct {
	Stream Stream
	Text   string
}

// Result is what a run left behind. Run returns it also when the tool
// failed, so callers can inspect the output.
type Result struct {
	// ExitCode is the exit status; -1 when the tool was killed by a signal.
	ExitCode int
	// Signal names the signal that killed the tool, if one did.
	Signal string
	// Duration is the wall time from start to exit.
	Duration time.Duration
	// StdoutTail and StderrTail are the last TailBytes of each stream,
	// starting at a line boundary when cut.
	StdoutTail, StderrTail string
	// StdoutTruncated and StderrTruncated report whether the tails were cut.
	StdoutTruncated, StderrTruncated bool
}

// ToolError reports a tool that started but did not succeed: it exited
// non-zero, was killed by a signal, timed out, or was canceled.
type ToolError struct {
	Tool       string
	Args       []string
	ExitCode   int
	Signal     string
	StderrTail string
	TimedOut   bool
	Timeout    time.Duration
	Canceled   bool
	// Cause is the context error for a canceled run.
	Cause error
}

// maxErrorLines bounds how many lines of stderr an error message quotes.
const maxErrorLines = 5

// Error reads "trtexec exited 1: <last stderr lines>" or "trtexec timed out
// after 10m0s".
func (e *ToolError) Error() string {
	var b strings.Builder
	b.WriteString(e.Tool)
	switch {
	case e.TimedOut:
		fmt.Fprintf(&b, " timed out after %s", e.Timeout)
	case e.Canceled:
		b.WriteString(" canceled")
		if e.Cause != nil {
			fmt.Fprintf(&b, " (%v)", e.Cause)
		}
	case e.Signal != "":
		fmt.Fprintf(&b, " killed by signal %s", e.Signal)
	default:
		fmt.Fprintf(&b, " exited %d", e.ExitCode)
	}
	if lines := LastLines(e.StderrTail, maxErrorLines); len(lines) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(lines, " | "))
	}
	return b.String()
}

// Unwrap returns the context error of a canceled or timed-out run, so that
// errors.Is(err, context.Canceled) and context.DeadlineExceeded work.
func (e *ToolError) Unwrap() error {
	if e.TimedOut {
		return context.DeadlineExceeded
	}
	return e.Cause
}

// LastLines returns up to n last non-blank lines of s, trimmed.
func LastLines(s string, n int) []string {
	var out []string
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0 && len(out) < n; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			out = append(out, l)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// NotFoundError reports a tool that could not be found or is not executable.
type NotFoundError struct {
	// Name is the tool's name ("trtexec").
	Name string
	// Path is the explicit path that was tried; empty when PATH was searched.
	Path string
	Err  error
}

// Error says where the tool was looked for.
func (e *NotFoundError) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("%s not usable at %s: %v", e.Name, e.Path, e.Err)
	}
	return fmt.Sprintf("%s not found in PATH", e.Name)
}

// Unwrap returns the lookup error.
func (e *NotFoundError) Unwrap() error { return e.Err }

// LookPath resolves a tool: explicit (from a flag such as --trtexec) wins
// when set and is taken as a path when it contains a path separator, or as
// a command name looked up in PATH otherwise; an empty explicit looks up
// name in PATH. The result is an absolute path to an executable regular
// file, or a *NotFoundError.
func LookPath(name, explicit string) (string, error) {
	if explicit == "" {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", &NotFoundError{Name: name, Err: err}
		}
		return filepath.Abs(p)
	}
	if !strings.ContainsRune(explicit, filepath.Separator) {
		p, err := exec.LookPath(explicit)
		if err != nil {
			return "", &NotFoundError{Name: name, Path: explicit, Err: err}
		}
		return filepath.Abs(p)
	}
	fi, err := os.Stat(explicit)
	if err != nil {
		return "", &NotFoundError{Name: name, Path: explicit, Err: err}
	}
	if fi.IsDir() {
		return "", &NotFoundError{Name: name, Path: explicit, Err: errors.New("is a directory")}
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return "", &NotFoundError{Name: name, Path: explicit, Err: fs.ErrPermission}
	}
	return filepath.Abs(explicit)
}
