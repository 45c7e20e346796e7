package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/manifest"
)

// Builder builds a TensorRT engine from an ONNX model.
type Builder interface {
	Build(ctx context.Context, spec BuildSpec) (*BuildResult, error)
}

// Trtexec builds engines by running NVIDIA's trtexec. The zero value runs
// "trtexec" from PATH with no timeout.
type Trtexec struct {
	// Path is the trtexec executable: a path, or a name looked up in PATH;
	// empty means "trtexec". execx.LookPath resolves a --trtexec flag.
	Path string
	// Runner runs trtexec; nil means execx.Exec{}.
	Runner execx.Runner
	// Timeout bounds one build; zero means none.
	Timeout time.Duration
	// Version, when set, skips asking trtexec for its version.
	Version manifest.TRTVersion
	// OnLine, when set, sees every line trtexec prints (progress, logs).
	OnLine func(execx.Line)
	// Logger receives debug records; nil discards them.
	Logger *slog.Logger
}

var _ Builder = (*Trtexec)(nil)

// BuildResult describes a finished engine build.
type BuildResult struct {
	// Version is the TensorRT release that built the engine.
	Version manifest.TRTVersion
	// PrecisionPath says how the precision was asked for.
	PrecisionPath PrecisionPath
	// Command is the argv that ran, program first.
	Command []string
	// Log is the parsed console log; LogPath is the full log on disk.
	Log     *Log
	LogPath string
	// Duration is the wall time of the trtexec run.
	Duration time.Duration
	// PlanPath, PlanSHA256 and Size describe the engine file.
	PlanPath   string
	PlanSHA256 string
	Size       int64
}

// BuildError reports a trtexec run that produced no engine.
type BuildError struct {
	ONNX    string
	Version manifest.TRTVersion
	// Status is trtexec's verdict; unknown when it stopped without one.
	Status Status
	// Errors are the [E] lines of the log (the first few).
	Errors []string
	// Tail holds the last lines of the log when it has no [E] lines.
	Tail []string
	// LogPath is the full log.
	LogPath string
	// Err is the underlying failure: an *execx.ToolError for a non-zero
	// exit, a signal, a timeout or a cancellation; nil when trtexec exited
	// 0 without producing an engine.
	Err error
}

// Error names the TensorRT release, the model, how trtexec ended, the log's
// error lines (or its last lines) and where the full log is.
func (e *BuildError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "trtexec (TensorRT %s) building %s: ", e.Version, e.ONNX)
	switch {
	case e.Err != nil:
		// The tool error says exit code, signal or timeout; its stderr tail
		// is replaced by the log's error lines below.
		var te *execx.ToolError
		if errors.As(e.Err, &te) {
			c := *te
			c.Tool, c.StderrTail = "trtexec", ""
			b.WriteString(c.Error())
		} else {
			b.WriteString(e.Err.Error())
		}
		if e.Status != StatusUnknown {
			fmt.Fprintf(&b, ", %s", e.Status)
		}
	case e.Status == StatusPassed:
		b.WriteString("PASSED but wrote no engine")
	default:
		fmt.Fprintf(&b, "status %s", e.Status)
	}
	lines := e.Errors
	if len(lines) == 0 {
		lines = e.Tail
	}
	if len(lines) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(lines, " | "))
	}
	if e.LogPath != "" {
		fmt.Fprintf(&b, " (log: %s)", e.LogPath)
	}
	return b.String()
}

// Unwrap returns the underlying tool error, if any.
func (e *BuildError) Unwrap() error { return e.Err }

// How many [E] lines, or else last lines, a BuildError quotes.
const (
	maxErrorLines = 5
	maxTailLines  = 3
)

func (t *Trtexec) runner() execx.Runner {
	if t.Runner == nil {
		return execx.Exec{}
	}
	return t.Runner
}

func (t *Trtexec) path() string {
	if t.Path == "" {
		return "trtexec"
	}
	return t.Path
}

func (t *Trtexec) logger() *slog.Logger {
	if t.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return t.Logger
}

// versionTimeout bounds "trtexec --help", which loads the TensorRT libraries
// but touches no model.
const versionTimeout = 2 * time.Minute

// DetectVersion asks trtexec for its TensorRT version: "trtexec --help"
// prints the banner "&&&& RUNNING TensorRT.trtexec [TensorRT v101601] ..."
// first (corpus trt10.16_trtexec_help.txt). Its exit status is not relied
// upon; the banner is.
func (t *Trtexec) DetectVersion(ctx context.Context) (manifest.TRTVersion, error) {
	if !t.Version.IsZero() {
		return t.Version, nil
	}
	var banner string
	res, err := t.runner().Run(ctx, execx.Cmd{Path: t.path(), Args: []string{"--help"}, Timeout: versionTimeout,
		OnLine: func(l execx.Line) {
			if banner == "" && strings.HasPrefix(l.Text, "&&&& ") {
				banner = l.Text
			}
		}})
	if banner == "" && res != nil {
		// A Runner that does not stream lines still leaves the tail.
		for _, line := range strings.Split(res.StdoutTail, "\n") {
			if strings.HasPrefix(line, "&&&& ") {
				banner = line
				break
			}
		}
	}
	if banner == "" {
		if err != nil {
			return manifest.TRTVersion{}, fmt.Errorf("asking trtexec for its version: %w", err)
		}
		return manifest.TRTVersion{}, fmt.Errorf("asking trtexec for its version: no \"&&&& RUNNING\" banner in the output of %s --help", t.path())
	}
	b, perr := ParseBanner(banner)
	if perr != nil {
		return manifest.TRTVersion{}, fmt.Errorf("asking trtexec for its version: %w", perr)
	}
	return b.Version, nil
}

// Build runs trtexec for spec. The engine is written under a temporary name
// in the plan's directory and renamed to spec.Plan only when trtexec
// reports PASSED; on any failure, timeout or cancellation no plan file is
// left. The full console log always goes to spec.Plan + ".log".
func (t *Trtexec) Build(ctx context.Context, spec BuildSpec) (*BuildResult, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	v, err := t.DetectVersion(ctx)
	if err != nil {
		return nil, err
	}
	if spec.Target != nil {
		if err := spec.Target.Check(GPUInfo{}, v); err != nil {
			return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
		}
	}
	dir, base := filepath.Split(spec.Plan)
	if dir == "" {
		dir = "."
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	tmp, err := tempName(dir, "."+base+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	keep := false
	defer func() {
		if !keep {
			os.Remove(tmp)
		}
	}()
	runSpec := spec
	runSpec.Plan = tmp
	args, path, err := buildArgs(runSpec, v)
	if err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}

	logPath := spec.Plan + ".log"
	logTmp, err := os.CreateTemp(dir, "."+base+".log.*.tmp")
	if err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	defer os.Remove(logTmp.Name()) // no-op after the rename
	t.logger().Debug("running trtexec", "tool", t.path(), "path", spec.Plan, "args", args)
	res, runErr := t.runner().Run(ctx, execx.Cmd{Path: t.path(), Args: args, Timeout: t.Timeout,
		Output: logTmp, OnLine: t.OnLine})
	if st, err := logTmp.Stat(); err == nil && st.Size() == 0 && res != nil {
		// A Runner that ignores Cmd.Output still returns the tails.
		io.WriteString(logTmp, res.StdoutTail+res.StderrTail)
	}
	if err := logTmp.Close(); err != nil && runErr == nil {
		runErr = err
	}
	var nf *execx.NotFoundError
	if errors.As(runErr, &nf) {
		return nil, runErr
	}
	if err := os.Rename(logTmp.Name(), logPath); err != nil {
		return nil, fmt.Errorf("building engine %s: saving the log: %w", spec.Plan, err)
	}
	parsed, err := parseLogFile(logPath)
	if err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	fail := func(err error) (*BuildResult, error) {
		be := &BuildError{ONNX: spec.ONNX, Version: v, Status: parsed.Status, LogPath: logPath, Err: err}
		be.Errors = parsed.Errors
		if len(be.Errors) > maxErrorLines {
			be.Errors = be.Errors[:maxErrorLines]
		}
		if len(be.Errors) == 0 {
			be.Tail = logTail(logPath, maxTailLines)
		}
		return nil, be
	}
	if runErr != nil || parsed.Status != StatusPassed {
		return fail(runErr)
	}
	st, err := os.Stat(tmp)
	if err != nil || st.Size() == 0 {
		return fail(nil)
	}
	if spec.Target != nil {
		gpu := GPUInfo{Name: parsed.Device, ComputeCapability: parsed.ComputeCapability}
		if err := spec.Target.Check(gpu, v); err != nil {
			return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
		}
	}
	sum, size, err := syncAndHash(tmp)
	if err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	if err := os.Rename(tmp, spec.Plan); err != nil {
		return nil, fmt.Errorf("building engine %s: %w", spec.Plan, err)
	}
	keep = true
	t.logger().Debug("built engine", "tool", t.path(), "path", spec.Plan, "dur", res.Duration)
	return &BuildResult{
		Version:       v,
		PrecisionPath: path,
		Command:       append([]string{t.path()}, args...),
		Log:           parsed,
		LogPath:       logPath,
		Duration:      res.Duration,
		PlanPath:      spec.Plan,
		PlanSHA256:    sum,
		Size:          size,
	}, nil
}

// tempName reserves a fresh file name in dir for trtexec to write to.
func tempName(dir, pattern string) (string, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	name := f.Name()
	if err := f.Close(); err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

func parseLogFile(path string) (*Log, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseLog(f)
}

// logTail returns the last n non-blank lines of the log that are not the
// final "&&&&" line (it only repeats the command), without timestamps.
func logTail(path string, n int) []string {
	b, err := readTail(path, 64<<10)
	if err != nil {
		return nil
	}
	var keep []string
	for _, l := range execx.LastLines(string(b), n+1) {
		if !strings.HasPrefix(l, "&&&& ") {
			keep = append(keep, timestampRE.ReplaceAllString(l, ""))
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return keep
}

// timestampRE matches the "[07/07/2026-02:10:45] " prefix of log lines.
var timestampRE = regexp.MustCompile(`^\[[0-9/:.\- ]+\] `)

func readTail(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off := st.Size() - max; off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(f)
}

// syncAndHash flushes the file to disk and returns its sha256 and size.
func syncAndHash(path string) (string, int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return "", 0, err
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
