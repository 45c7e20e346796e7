package trtexec

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/manifest"
)

// Result describes a finished engine build.
type Result struct {
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
	// PlanPath, PlanDigest and Size describe the engine file.
	PlanPath   string
	PlanDigest manifest.Digest
	Size       int64
}

// BuildError reports a trtexec run that failed: a build that produced no
// engine (Tool.Build), or an inference run on an engine that did not pass
// (Tool.Infer, with Engine set).
type BuildError struct {
	// ONNX is the model a build was building.
	ONNX string
	// Engine is the engine an inference run was running; empty for builds.
	Engine string
	// Version is the TensorRT release that ran; zero when unknown (an
	// inference run whose log has no banner).
	Version manifest.TRTVersion
	// Status is trtexec's verdict; unknown when it stopped without one.
	Status Status
	// Errors are the [E] lines of the log (the first few).
	Errors []string
	// Tail holds the last lines of the log when it has no [E] lines.
	Tail []string
	// LogPath is the full log; empty when it was not kept (an inference
	// run without InferSpec.LogPath).
	LogPath string
	// Err is the underlying failure: an *execx.ToolError for a non-zero
	// exit, a signal, a timeout or a cancellation; nil when trtexec exited
	// 0 without producing an engine.
	Err error
}

// Error names the TensorRT release, the model or engine, how trtexec ended,
// the log's error lines (or its last lines) and where the full log is.
func (e *BuildError) Error() string {
	var b strings.Builder
	b.WriteString("trtexec")
	if !e.Version.IsZero() {
		fmt.Fprintf(&b, " (TensorRT %s)", e.Version)
	}
	if e.Engine != "" {
		fmt.Fprintf(&b, " running %s: ", e.Engine)
	} else {
		fmt.Fprintf(&b, " building %s: ", e.ONNX)
	}
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
