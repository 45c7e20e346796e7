package ort

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A real ONNX Runtime error line (captured from ONNX Runtime 1.24.1 on a
// model it refused) and a line that is not ONNX Runtime's.
const (
	capturedORTLine = "\x1b[1;31m2026-12-01 09:55:26.233326641 [E:onnxruntime:, inference_session.cc:2579 operator()] Exception during initialization: Attempting to get index by a name which does not exist\x1b[m"
	otherLine       = "panic: something of Go's own"
)

func TestForwardLogs(t *testing.T) {
	var logs, out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	forwardLogs(strings.NewReader(capturedORTLine+"\n\x1b[m\n"+otherLine+"\n"+
		"2026-12-01 09:55:26.1 [W:onnxruntime:Default, graph.cc:1234 Cleanup] Removing initializer 'x'\n"), &out, logger)
	if out.String() != otherLine+"\n" {
		t.Errorf("lines passed through = %q, want only %q", out.String(), otherLine)
	}
	got := logs.String()
	for _, want := range []string{
		`level=ERROR msg="Exception during initialization: Attempting to get index by a name which does not exist" tool=onnxruntime src="inference_session.cc:2579 operator()"`,
		`level=WARN msg="Removing initializer 'x'" tool=onnxruntime src="graph.cc:1234 Cleanup" logid=Default`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("logged:\n%s\nwant a record containing\n%s", got, want)
		}
	}
	if strings.Contains(got, "\x1b") {
		t.Errorf("colour codes reached the logger: %q", got)
	}
}
