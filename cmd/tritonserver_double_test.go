package cmd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A TEST DOUBLE for NVIDIA's tritonserver, which cannot run here (and of
// which the corpus holds no captured output): when the test binary is run
// as "tritonserver" (KILN_TRITONSERVER_DOUBLE=1), it reads the flags kiln
// passes (--model-repository, --http-port) and serves that repository with
// kiln's own KServe v2 endpoint on that port until SIGINT or SIGTERM, as
// tritonserver does. It proves --start-triton's launch, readiness wait and
// stop; what it serves is kiln's endpoint, not Triton.
func init() {
	if os.Getenv("KILN_TRITONSERVER_DOUBLE") != "1" {
		return
	}
	repo, port := "", ""
	for _, a := range os.Args[1:] {
		if v, ok := strings.CutPrefix(a, "--model-repository="); ok {
			repo = v
		}
		if v, ok := strings.CutPrefix(a, "--http-port="); ok {
			port = v
		}
	}
	if repo == "" || port == "" {
		fmt.Fprintln(os.Stderr, "tritonserver double: --model-repository and --http-port are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Execute(ctx, []string{"serve", repo, "--listen", "127.0.0.1:" + port}, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// installTritonserverDouble puts a "tritonserver" on PATH that runs this
// test binary as the double.
func installTritonserverDouble(t *testing.T) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nKILN_TRITONSERVER_DOUBLE=1 exec " + exe + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "tritonserver"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// --start-triton launches tritonserver (here the double) on the
// repository, waits until it is ready, checks every model through it and
// stops it.
func TestServeStartTriton(t *testing.T) {
	repo, calib := servedRepo(t)
	installTritonserverDouble(t)
	stdout, errOut, code := run(t, "serve", repo, "--start-triton", "--calib-dir", calib, "--perf=false", "--format", "json")
	if code != 0 || !strings.Contains(stdout, `"device": "tritonserver started by kiln"`) || strings.Count(stdout, `"verdict": "pass"`) < 4 {
		t.Fatalf("serve --start-triton = exit %d\n%s\n%s\nwant every model passed through the started server", code, stdout, errOut)
	}
	t.Setenv("PATH", t.TempDir())
	if _, errOut, code := run(t, "serve", repo, "--start-triton"); code == 0 || !strings.Contains(errOut, "tritonserver") {
		t.Errorf("serve --start-triton without tritonserver = exit %d (%s), want an error naming tritonserver", code, errOut)
	}
}
