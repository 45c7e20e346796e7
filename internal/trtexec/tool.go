package trtexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/manifest"
)

// Tool builds engines by running NVIDIA's trtexec. The zero value runs
// "trtexec" from PATH with no timeout.
type Tool struct {
	// Path is the trtexec executable: a path, or a name looked up in PATH;
	// empty means "trtexec". execx.LookPath resolves a user's choice.
	Path string
	// Runner runs trtexec; nil means execx.Exec{}.
	Runner execx.Runner
	// Timeout bounds one build unless its Spec sets one; zero means none.
	Timeout time.Duration
	// Version, when set, skips asking trtexec for its version.
	Version manifest.TRTVersion
	// OnLine, when set, sees every line trtexec prints (progress, logs).
	OnLine func(execx.Line)
	// Logger receives debug records; nil discards them.
	Logger *slog.Logger
}

func (t *Tool) runner() execx.Runner {
	if t.Runner == nil {
		return execx.Exec{}
	}
	return t.Runner
}

func (t *Tool) path() string {
	if t.Path == "" {
		return "trtexec"
	}
	return t.Path
}

func (t *Tool) logger() *slog.Logger {
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
func (t *Tool) DetectVersion(ctx context.Context) (manifest.TRTVersion, error) {
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
func (t *Tool) Build(ctx context.Context, spec Spec) (*Result, error) {
	j, err := t.prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer j.removeTemp()
	if err := t.run(ctx, j); err != nil {
		return nil, err
	}
	if err := j.verdict(); err != nil {
		return nil, err
	}
	digest, size, err := j.commit()
	if err != nil {
		return nil, err
	}
	t.logger().Debug("built engine", "tool", t.path(), "path", spec.Plan, "dur", j.duration)
	return &Result{
		Version:       j.version,
		PrecisionPath: j.path,
		Command:       append([]string{t.path()}, j.args...),
		Log:           j.log,
		LogPath:       j.logPath,
		Duration:      j.duration,
		PlanPath:      spec.Plan,
		PlanDigest:    digest,
		Size:          size,
	}, nil
}

// job is one engine build in progress.
type job struct {
	spec    Spec
	version manifest.TRTVersion
	dir     string
	base    string // the plan's file name
	tmp     string // the engine under its temporary name, until it passed
	kept    bool   // tmp became the plan
	args    []string
	path    PrecisionPath
	logPath string
	// What the run left: how it ended, how long it took, its parsed log.
	runErr   error
	duration time.Duration
	log      *Log
}

func (j *job) wrap(err error) error { return fmt.Errorf("building engine %s: %w", j.spec.Plan, err) }

func (j *job) removeTemp() {
	if !j.kept {
		os.Remove(j.tmp)
	}
}

// prepare checks the spec against the TensorRT release (and a target's
// version), reserves the temporary engine name and spells the arguments.
func (t *Tool) prepare(ctx context.Context, spec Spec) (*job, error) {
	j := &job{spec: spec, logPath: spec.Plan + ".log"}
	if err := spec.Validate(); err != nil {
		return nil, j.wrap(err)
	}
	v, err := t.DetectVersion(ctx)
	if err != nil {
		return nil, err
	}
	j.version = v
	if spec.Target != nil {
		if err := spec.Target.Check(GPU{}, v); err != nil {
			return nil, j.wrap(err)
		}
	}
	j.dir, j.base = filepath.Split(spec.Plan)
	if j.dir == "" {
		j.dir = "."
	}
	if err := os.MkdirAll(j.dir, 0o755); err != nil {
		return nil, j.wrap(err)
	}
	if j.tmp, err = tempName(j.dir, "."+j.base+".*.tmp"); err != nil {
		return nil, j.wrap(err)
	}
	runSpec := spec
	runSpec.Plan = j.tmp
	if j.args, j.path, err = buildArgs(runSpec, v); err != nil {
		j.removeTemp()
		return nil, j.wrap(err)
	}
	return j, nil
}

// run runs the build's trtexec and records how it ended in j. A failed run
// is recorded, not returned: the log says why; only a missing trtexec and a
// log that cannot be kept are errors here.
func (t *Tool) run(ctx context.Context, j *job) error {
	timeout := j.spec.Timeout
	if timeout == 0 {
		timeout = t.Timeout
	}
	t.logger().Debug("running trtexec", "tool", t.path(), "path", j.spec.Plan, "args", j.args)
	out, err := t.runLogged(ctx, j.args, j.logPath, timeout)
	if err != nil {
		var nf *execx.NotFoundError
		if errors.As(err, &nf) {
			return err
		}
		return j.wrap(err)
	}
	j.runErr, j.duration, j.log = out.err, out.duration, out.log
	return nil
}

// logged is a finished trtexec run whose console log was kept.
type logged struct {
	// err is how the run failed (an *execx.ToolError: exit status, signal,
	// timeout, cancellation); nil when trtexec exited 0.
	err      error
	duration time.Duration
	log      *Log
}

// runLogged runs trtexec with args, its console log going to logPath, and
// parses the log. A failed run is in logged.err, not returned: the log says
// why. The errors returned are a missing trtexec (*execx.NotFoundError,
// as it is) and a log that cannot be kept or read.
func (t *Tool) runLogged(ctx context.Context, args []string, logPath string, timeout time.Duration) (logged, error) {
	var res *execx.Result
	var runErr error
	// The log is written atomically, so a log next to a plan is always
	// that plan's whole log; it is kept for failed runs too.
	err := atomicfile.Write(logPath, 0o644, func(w io.Writer) error {
		out := &countingWriter{w: w}
		res, runErr = t.runner().Run(ctx, execx.Cmd{Path: t.path(), Args: args, Timeout: timeout,
			Output: out, OnLine: t.OnLine})
		var nf *execx.NotFoundError
		if errors.As(runErr, &nf) {
			return runErr // nothing ran: no log to keep
		}
		if out.n == 0 && res != nil {
			// A Runner that ignores Cmd.Output still returns the tails.
			_, err := io.WriteString(w, res.StdoutTail+res.StderrTail)
			return err
		}
		return nil
	})
	var nf *execx.NotFoundError
	switch {
	case errors.As(err, &nf):
		return logged{}, err
	case err != nil:
		return logged{}, fmt.Errorf("saving the log: %w", err)
	}
	out := logged{err: runErr}
	if res != nil {
		out.duration = res.Duration
	}
	if out.log, err = parseLogFile(logPath); err != nil {
		return logged{}, err
	}
	return out, nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// verdict returns a *BuildError unless trtexec passed and wrote an engine.
func (j *job) verdict() error {
	if j.runErr != nil || j.log.Status != StatusPassed {
		return j.buildError(j.runErr)
	}
	if st, err := os.Stat(j.tmp); err != nil || st.Size() == 0 {
		return j.buildError(nil)
	}
	return nil
}

func (j *job) buildError(err error) *BuildError {
	be := runError(j.log, j.logPath, err)
	be.ONNX, be.Version = j.spec.ONNX, j.version
	return be
}

// runError describes a trtexec run that failed from its parsed log: the
// log's first error lines, or its last lines when it has none.
func runError(l *Log, logPath string, err error) *BuildError {
	be := &BuildError{Status: l.Status, LogPath: logPath, Err: err}
	be.Errors = l.Errors
	if len(be.Errors) > maxErrorLines {
		be.Errors = be.Errors[:maxErrorLines]
	}
	if len(be.Errors) == 0 {
		be.Tail = logTail(logPath, maxTailLines)
	}
	return be
}

// commit checks the GPU trtexec built on against the target, flushes the
// engine to disk and gives it the plan's name.
func (j *job) commit() (manifest.Digest, int64, error) {
	if j.spec.Target != nil {
		gpu := GPU{Name: j.log.Device, ComputeCapability: j.log.ComputeCapability}
		if err := j.spec.Target.Check(gpu, j.version); err != nil {
			return "", 0, j.wrap(err)
		}
	}
	digest, size, err := syncAndDigest(j.tmp)
	if err != nil {
		return "", 0, j.wrap(err)
	}
	if err := os.Rename(j.tmp, j.spec.Plan); err != nil {
		return "", 0, j.wrap(err)
	}
	j.kept = true
	return digest, size, nil
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

// syncAndDigest flushes the file to disk and returns its digest and size.
func syncAndDigest(path string) (manifest.Digest, int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return "", 0, err
	}
	return manifest.DigestReader(f)
}
