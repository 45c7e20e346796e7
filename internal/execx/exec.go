package execx

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Exec runs commands as real processes, each in its own process group.
// The zero value is ready to use.
type Exec struct {
	// Drain is how long to wait, after the tool exits, for children still
	// holding its output open; zero means DefaultDrain.
	Drain time.Duration
}

// Run starts cmd, streams its output, and waits for it to finish, be
// canceled through ctx, or time out. Whatever the outcome, no process of
// the tool's process group is left running when Run returns: after the tool
// exits, the rest of its group is killed.
//
// A tool that ran returns a non-nil Result, also with an error; the error is
// a *ToolError when the tool exited non-zero, died of a signal, timed out or
// was canceled. A tool that could not be found gives a *NotFoundError.
func (e Exec) Run(ctx context.Context, cmd Cmd) (*Result, error) {
	if cmd.Path == "" {
		return nil, errors.New("running a tool: empty command path")
	}
	tool := filepath.Base(cmd.Path)
	path := cmd.Path
	if !strings.ContainsRune(path, filepath.Separator) {
		p, err := LookPath(path, "")
		if err != nil {
			return nil, err
		}
		path = p
	}
	if err := ctx.Err(); err != nil {
		return nil, &ToolError{Tool: tool, Args: cmd.Args, ExitCode: -1, Canceled: true, Cause: err}
	}
	pr, err := start(tool, path, cmd)
	if err != nil {
		return nil, err
	}
	timedOut, canceled := pr.wait(ctx, cmd.Timeout, orDefault(cmd.Grace, DefaultGrace))
	dur := time.Since(pr.started)
	pr.reap(orDefault(e.Drain, DefaultDrain))
	return pr.result(ctx, tool, cmd, dur, timedOut, canceled)
}

// process is one started tool: its process group, the goroutines reading
// its output and the one waiting for it.
type process struct {
	p          *exec.Cmd
	pgid       int
	outR, errR *os.File
	sink       *sink
	pumpsDone  chan struct{} // closed when both output streams hit EOF
	waitDone   chan error    // the leader's exit
	started    time.Time
}

// start launches the tool in its own process group, with pipes for its
// output and goroutines that read them line by line.
func start(tool, path string, cmd Cmd) (*process, error) {
	tailBytes := cmd.TailBytes
	if tailBytes <= 0 {
		tailBytes = DefaultTailBytes
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", tool, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("starting %s: %w", tool, err)
	}
	p := exec.Command(path, cmd.Args...)
	p.Dir = cmd.Dir
	p.Env = cmd.Env
	p.Stdin = cmd.Stdin
	p.Stdout = outW
	p.Stderr = errW
	// Its own process group, so that signals reach the tool's children too.
	p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr := &process{p: p, outR: outR, errR: errR, started: time.Now()}
	if err := p.Start(); err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW} {
			f.Close()
		}
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return nil, &NotFoundError{Name: tool, Path: path, Err: err}
		}
		return nil, fmt.Errorf("starting %s: %w", tool, err)
	}
	// The child holds its own copies; ours must go so that EOF arrives.
	outW.Close()
	errW.Close()
	pr.pgid = p.Process.Pid
	pr.sink = &sink{onLine: cmd.OnLine, output: cmd.Output,
		tails: [2]*tail{{max: tailBytes}, {max: tailBytes}}}
	var pumps sync.WaitGroup
	pumps.Add(2)
	go pr.sink.pump(outR, Stdout, &pumps)
	go pr.sink.pump(errR, Stderr, &pumps)
	pr.pumpsDone = make(chan struct{})
	go func() { pumps.Wait(); close(pr.pumpsDone) }()
	pr.waitDone = make(chan error, 1)
	go func() { pr.waitDone <- p.Wait() }()
	return pr, nil
}

// wait returns when the leader exits, or after stopping the group when ctx
// is canceled or the timeout (zero: none) passes first.
func (pr *process) wait(ctx context.Context, timeout, grace time.Duration) (timedOut, canceled bool) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-pr.waitDone:
	case <-ctx.Done():
		canceled = true
		terminate(pr.pgid, grace, pr.waitDone, pr.pumpsDone)
	case <-expired:
		timedOut = true
		terminate(pr.pgid, grace, pr.waitDone, pr.pumpsDone)
	}
	return timedOut, canceled
}

// reap runs after the leader is gone. Children may still hold the pipes:
// give them drain to finish writing, then kill whatever is left of the
// group (the group id stays reserved while any member lives, so this cannot
// hit an unrelated process) and stop reading.
func (pr *process) reap(drain time.Duration) {
	select {
	case <-pr.pumpsDone:
	case <-time.After(drain):
	}
	_ = syscall.Kill(-pr.pgid, syscall.SIGKILL)
	select {
	case <-pr.pumpsDone:
	case <-time.After(drain):
		// A child that left the group still holds a pipe; stop reading.
		pr.outR.Close()
		pr.errR.Close()
		<-pr.pumpsDone
	}
	pr.outR.Close()
	pr.errR.Close()
}

// result says how the tool ended: its Result and, unless it exited 0 with
// its output written, the error.
func (pr *process) result(ctx context.Context, tool string, cmd Cmd, dur time.Duration, timedOut, canceled bool) (*Result, error) {
	s := pr.sink
	res := &Result{Duration: dur}
	res.StdoutTail, res.StdoutTruncated = s.tails[Stdout].String()
	res.StderrTail, res.StderrTruncated = s.tails[Stderr].String()
	if ws, ok := pr.p.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.ExitCode = -1
		res.Signal = ws.Signal().String()
	} else {
		res.ExitCode = pr.p.ProcessState.ExitCode()
	}
	te := &ToolError{Tool: tool, Args: cmd.Args, ExitCode: res.ExitCode, Signal: res.Signal, StderrTail: res.StderrTail}
	switch {
	case timedOut:
		te.TimedOut, te.Timeout = true, cmd.Timeout
		return res, te
	case canceled:
		te.Canceled, te.Cause = true, ctx.Err()
		return res, te
	case res.ExitCode != 0:
		return res, te
	}
	if s.outErr != nil {
		return res, fmt.Errorf("writing output of %s: %w", tool, s.outErr)
	}
	return res, nil
}

// terminate sends SIGTERM to the process group and waits until the leader
// has exited and the pipes are closed, or the grace period is over; then it
// sends SIGKILL to the group and waits for the leader.
func terminate(pgid int, grace time.Duration, waitDone <-chan error, pumpsDone <-chan struct{}) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	exited := false
	for !exited || pumpsDone != nil {
		select {
		case <-waitDone:
			exited = true
		case <-pumpsDone:
			pumpsDone = nil
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			if !exited {
				<-waitDone
			}
			return
		}
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// sink receives the output of both streams, one whole line at a time.
type sink struct {
	mu     sync.Mutex
	onLine func(Line)
	output io.Writer
	outErr error
	tails  [2]*tail
}

// maxLine is the longest line handed over in one piece; longer lines are
// delivered in pieces of this size.
const maxLine = 64 << 10

func (s *sink) pump(r io.Reader, st Stream, wg *sync.WaitGroup) {
	defer wg.Done()
	br := bufio.NewReaderSize(r, maxLine)
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			s.line(st, chunk)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (s *sink) line(st Stream, raw []byte) {
	text := bytes.TrimRight(raw, "\r\n")
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tails[st]
	t.write(text)
	t.write([]byte{'\n'})
	if s.output != nil && s.outErr == nil {
		buf := make([]byte, 0, len(text)+1)
		buf = append(append(buf, text...), '\n')
		if _, err := s.output.Write(buf); err != nil {
			s.outErr = err
		}
	}
	if s.onLine != nil {
		s.onLine(Line{Stream: st, Text: string(text)})
	}
}

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	buf []byte
	cut bool
}

func (t *tail) write(p []byte) {
	t.buf = append(t.buf, p...)
	// Compact only when twice the bound is reached, so that appends stay
	// amortized O(1) and memory stays under 2*max plus one line.
	if len(t.buf) > 2*t.max {
		t.buf = append(make([]byte, 0, 2*t.max), t.buf[len(t.buf)-t.max:]...)
		t.cut = true
	}
}

// String returns the tail, starting at a line boundary when it was cut, and
// whether it was cut.
func (t *tail) String() (string, bool) {
	b := t.buf
	cut := t.cut
	if len(b) > t.max {
		b = b[len(b)-t.max:]
		cut = true
	}
	if cut {
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), cut
}
