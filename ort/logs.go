package ort

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
)

// ortLine matches a line of ONNX Runtime's default logger:
// "2026-12-01 09:55:26.233 [E:onnxruntime:, inference_session.cc:2579 operator()] message",
// possibly wrapped in ANSI colour codes.
var ortLine = regexp.MustCompile(`^(?:\x1b\[[0-9;]*m)*\d{4}-\d\d-\d\d [0-9:.]+ \[([VIWEF]):onnxruntime:([^,\]]*),? ?([^\]]*)\] (.*?)(?:\x1b\[[0-9;]*m)*$`)

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*m`)

var logRoute struct {
	once sync.Once
	err  error
	orig *os.File      // the original stderr
	w    *os.File      // the pipe's write end, also on descriptor 2
	done chan struct{} // closed when the forwarder has drained the pipe
}

// RouteLogs sends ONNX Runtime's own log lines to the logger newLogger
// makes (writing to the original stderr it is given) instead of raw to the
// process's stderr. ONNX Runtime's C++ logger writes to file descriptor
// 2, and the Go binding offers no custom-logger hook (that needs a C
// callback, which kiln does not build), so RouteLogs puts a pipe on
// descriptor 2 once per process: lines in ONNX Runtime's format become
// records of logger at their severity (V debug, I info, W warning, E and F
// error, with the source location as "src"); every other line (kiln's own
// stderr output) is copied to the original stderr unchanged. Go's crash
// output is also sent to the original stderr (debug.SetCrashOutput), so a
// fatal error is never lost in the pipe; FlushLogs must run before a normal
// exit. It works where descriptors can be duplicated
// (Linux, macOS); elsewhere it returns an error and changes nothing.
func RouteLogs(newLogger func(stderr io.Writer) *slog.Logger) error {
	logRoute.once.Do(func() { logRoute.err = routeLogs(newLogger) })
	return logRoute.err
}

func routeLogs(newLogger func(io.Writer) *slog.Logger) error {
	origFile, w, r, err := redirectStderr()
	if err != nil {
		return err
	}
	_ = debug.SetCrashOutput(origFile, debug.CrashOptions{})
	logRoute.orig, logRoute.w, logRoute.done = origFile, w, make(chan struct{})
	go func() {
		forwardLogs(r, origFile, newLogger(origFile))
		close(logRoute.done)
	}()
	return nil
}

// FlushLogs undoes RouteLogs before the process exits: it puts the original
// stderr back on descriptor 2 and waits until every line written to the
// pipe was forwarded, so that nothing written just before exit is lost.
// It does nothing when RouteLogs did not run.
func FlushLogs() {
	if logRoute.done == nil {
		return
	}
	if err := restoreStderr(logRoute.orig); err != nil {
		return
	}
	logRoute.w.Close()
	<-logRoute.done
	logRoute.done = nil
}

// forwardLogs reads what is written to descriptor 2 and sends each line
// on: ONNX Runtime's to the logger, the rest to out.
func forwardLogs(r io.Reader, out io.Writer, logger *slog.Logger) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		m := ortLine.FindStringSubmatch(line)
		if m == nil && ansi.ReplaceAllString(line, "") == "" && line != "" {
			continue // the colour reset ending a multi-line ONNX Runtime message
		}
		if m == nil {
			io.WriteString(out, line+"\n")
			continue
		}
		level := map[string]slog.Level{"V": slog.LevelDebug, "I": slog.LevelInfo, "W": slog.LevelWarn}[m[1]]
		if m[1] == "E" || m[1] == "F" {
			level = slog.LevelError
		}
		attrs := []any{"tool", "onnxruntime", "src", strings.TrimSpace(m[3])}
		if id := strings.TrimSpace(m[2]); id != "" {
			attrs = append(attrs, "logid", id)
		}
		logger.Log(context.Background(), level, strings.TrimSpace(m[4]), attrs...)
	}
}
