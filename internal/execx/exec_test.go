package execx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the tool under test: with EXECX_HELPER set it
// runs helperMain instead of the tests. This gives real processes with
// exactly the behaviour a test needs (ignore SIGTERM, fork a grandchild, ...).
const helperEnv = "EXECX_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		helperMain(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helperMain(mode string) {
	switch mode {
	case "lines":
		// Interleaved output on both streams, then the exit code asked for.
		for i := 0; i < 3; i++ {
			fmt.Fprintf(os.Stdout, "out %d\n", i)
			fmt.Fprintf(os.Stderr, "err %d\n", i)
		}
		code, _ := strconv.Atoi(os.Getenv("EXECX_EXIT"))
		os.Exit(code)
	case "flood":
		// 1 MiB of numbered lines on stdout.
		line := strings.Repeat("x", 100)
		for i := 0; i < (1<<20)/110; i++ {
			fmt.Fprintf(os.Stdout, "%07d %s\n", i, line)
		}
		fmt.Fprintln(os.Stdout, "last line")
	case "stubborn":
		// Ignore SIGTERM, start a grandchild that ignores it too, record both
		// pids, say ready and wait forever.
		signal.Ignore(syscall.SIGTERM)
		gc, err := startSelf("stubborn-grandchild")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		writePids(os.Getpid(), gc)
		fmt.Println("ready")
		time.Sleep(time.Hour)
	case "stubborn-grandchild":
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Hour)
	case "sleep":
		// Default SIGTERM behaviour: dies at once.
		fmt.Println("ready")
		time.Sleep(time.Hour)
	case "suicide":
		fmt.Fprintln(os.Stderr, "about to die")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	}
}

func startSelf(mode string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	env := []string{helperEnv + "=" + mode}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, helperEnv+"=") {
			env = append(env, kv)
		}
	}
	attr := &os.ProcAttr{Env: env,
		Files: []*os.File{nil, os.Stdout, os.Stderr}}
	p, err := os.StartProcess(exe, []string{exe}, attr)
	if err != nil {
		return 0, err
	}
	return p.Pid, nil
}

func writePids(pids ...int) {
	var b strings.Builder
	for _, p := range pids {
		fmt.Fprintln(&b, p)
	}
	_ = os.WriteFile(os.Getenv("EXECX_PIDFILE"), []byte(b.String()), 0o644)
}

func helperCmd(t *testing.T, mode string, env ...string) Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Cmd{Path: exe, Env: append(append(os.Environ(), helperEnv+"="+mode), env...)}
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Format: pid (comm) state ...; comm may contain spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitDead(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still alive after Run returned", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("helper wrote no pid file: %v", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, n)
	}
	if len(pids) != 2 {
		t.Fatalf("pid file = %q, want 2 pids", b)
	}
	return pids
}

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		wantCode int
		wantMsg  string
	}{
		{"success", "echo hi", 0, ""},
		{"exit 1", "echo '[E] Error[4]: bad model' >&2; exit 1", 1, "sh exited 1: [E] Error[4]: bad model"},
		{"exit 7 quiet", "exit 7", 7, "sh exited 7"},
		{"last lines only", "for i in 1 2 3 4 5 6 7; do echo line$i >&2; done; exit 2", 2,
			"sh exited 2: line3 | line4 | line5 | line6 | line7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Exec{}.Run(context.Background(), Cmd{Path: "sh", Args: []string{"-c", tt.script}})
			if res == nil {
				t.Fatalf("Run(%q) result = nil, err %v", tt.script, err)
			}
			if res.ExitCode != tt.wantCode {
				t.Errorf("Run(%q).ExitCode = %d, want %d", tt.script, res.ExitCode, tt.wantCode)
			}
			if tt.wantCode == 0 {
				if err != nil {
					t.Errorf("Run(%q) err = %v, want nil", tt.script, err)
				}
				return
			}
			var te *ToolError
			if !errors.As(err, &te) {
				t.Fatalf("Run(%q) err = %v, want *ToolError", tt.script, err)
			}
			if te.ExitCode != tt.wantCode || te.Tool != "sh" {
				t.Errorf("ToolError = %+v, want Tool sh ExitCode %d", te, tt.wantCode)
			}
			if got := err.Error(); got != tt.wantMsg {
				t.Errorf("Run(%q) err = %q, want %q", tt.script, got, tt.wantMsg)
			}
		})
	}
}

func TestRunLinesAndOutput(t *testing.T) {
	var mu sync.Mutex
	got := map[Stream][]string{}
	var out bytes.Buffer
	cmd := helperCmd(t, "lines", "EXECX_EXIT=0")
	cmd.OnLine = func(l Line) {
		mu.Lock()
		got[l.Stream] = append(got[l.Stream], l.Text)
		mu.Unlock()
	}
	cmd.Output = &out
	res, err := Exec{}.Run(context.Background(), cmd)
	if err != nil {
		t.Fatalf("Run(lines) err = %v", err)
	}
	wantOut := []string{"out 0", "out 1", "out 2"}
	wantErr := []string{"err 0", "err 1", "err 2"}
	if fmt.Sprint(got[Stdout]) != fmt.Sprint(wantOut) || fmt.Sprint(got[Stderr]) != fmt.Sprint(wantErr) {
		t.Errorf("OnLine got stdout %q stderr %q, want %q and %q", got[Stdout], got[Stderr], wantOut, wantErr)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Errorf("Output = %q, want 6 whole lines", out.String())
	}
	if res.StdoutTail != "out 0\nout 1\nout 2\n" || res.StderrTail != "err 0\nerr 1\nerr 2\n" {
		t.Errorf("tails = %q / %q", res.StdoutTail, res.StderrTail)
	}
}

func TestRunTailBounded(t *testing.T) {
	cmd := helperCmd(t, "flood")
	cmd.TailBytes = 4096
	n := 0
	cmd.OnLine = func(Line) { n++ }
	res, err := Exec{}.Run(context.Background(), cmd)
	if err != nil {
		t.Fatalf("Run(flood) err = %v", err)
	}
	if len(res.StdoutTail) > 4096 {
		t.Errorf("len(StdoutTail) = %d, want <= 4096", len(res.StdoutTail))
	}
	if !res.StdoutTruncated {
		t.Errorf("StdoutTruncated = false, want true")
	}
	if !strings.HasSuffix(res.StdoutTail, "last line\n") {
		t.Errorf("StdoutTail ends %q, want the last line", res.StdoutTail[len(res.StdoutTail)-40:])
	}
	// Cut at a line boundary: the tail starts with a full numbered line.
	if first := strings.SplitN(res.StdoutTail, "\n", 2)[0]; len(first) != 108 {
		t.Errorf("StdoutTail starts with %q, want a whole line", first)
	}
	if want := (1<<20)/110 + 1; n != want {
		t.Errorf("OnLine calls = %d, want %d", n, want)
	}
}

func TestRunTimeoutKillsProcessGroup(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	cmd := helperCmd(t, "stubborn", "EXECX_PIDFILE="+pidfile)
	// Long enough for the helper to start and ignore SIGTERM on a loaded
	// machine; the test is that a stubborn group dies, not how fast.
	cmd.Timeout = 3 * time.Second
	cmd.Grace = 300 * time.Millisecond
	start := time.Now()
	res, err := Exec{Drain: 200 * time.Millisecond}.Run(context.Background(), cmd)
	elapsed := time.Since(start)
	var te *ToolError
	if !errors.As(err, &te) || !te.TimedOut {
		t.Fatalf("Run(stubborn) err = %v, want ToolError with TimedOut", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, DeadlineExceeded) = false, want true", err)
	}
	if want := fmt.Sprintf("%s timed out after 3s", te.Tool); err.Error() != want {
		t.Errorf("err = %q, want %q", err.Error(), want)
	}
	if res == nil || res.Signal != "killed" {
		t.Errorf("Result = %+v, want Signal killed (SIGTERM was ignored)", res)
	}
	if elapsed > 10*time.Second {
		t.Errorf("Run took %s, want about timeout+grace", elapsed)
	}
	waitDead(t, readPids(t, pidfile))
}

func TestRunCancelKillsProcessGroup(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := helperCmd(t, "stubborn", "EXECX_PIDFILE="+pidfile)
	cmd.Grace = 300 * time.Millisecond
	cmd.OnLine = func(l Line) {
		if l.Text == "ready" {
			cancel()
		}
	}
	_, err := Exec{Drain: 200 * time.Millisecond}.Run(ctx, cmd)
	var te *ToolError
	if !errors.As(err, &te) || !te.Canceled {
		t.Fatalf("Run(stubborn) err = %v, want ToolError with Canceled", err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("errors.Is(%v, Canceled) = false, want true", err)
	}
	waitDead(t, readPids(t, pidfile))
}

func TestRunCancelHonouredSIGTERMIsQuick(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := helperCmd(t, "sleep")
	cmd.Grace = 20 * time.Second
	cmd.OnLine = func(l Line) {
		if l.Text == "ready" {
			cancel()
		}
	}
	start := time.Now()
	res, err := Exec{}.Run(ctx, cmd)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run(sleep) err = %v, want canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %s; a tool that exits on SIGTERM must not wait for the grace period", d)
	}
	if res.Signal != "terminated" {
		t.Errorf("Signal = %q, want terminated", res.Signal)
	}
}

func TestRunAlreadyCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Exec{}.Run(ctx, Cmd{Path: "sh", Args: []string{"-c", "exit 0"}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run(canceled ctx) err = %v, want context.Canceled", err)
	}
}

func TestRunSignalDeath(t *testing.T) {
	_, err := Exec{}.Run(context.Background(), helperCmd(t, "suicide"))
	var te *ToolError
	if !errors.As(err, &te) {
		t.Fatalf("Run(suicide) err = %v, want *ToolError", err)
	}
	if te.Signal != "killed" || te.ExitCode != -1 {
		t.Errorf("ToolError = %+v, want Signal killed, ExitCode -1", te)
	}
	if want := te.Tool + " killed by signal killed: about to die"; err.Error() != want {
		t.Errorf("err = %q, want %q", err.Error(), want)
	}
}

func TestRunBackgroundChildHoldingPipe(t *testing.T) {
	// The shell exits at once but leaves a child holding stdout open. Run
	// must not hang on the pipe, and must not leave the child running.
	pidfile := filepath.Join(t.TempDir(), "pid")
	script := `sleep 30 & echo $! > ` + pidfile + `; echo done`
	start := time.Now()
	res, err := Exec{Drain: 200 * time.Millisecond}.Run(context.Background(),
		Cmd{Path: "sh", Args: []string{"-c", script}})
	if err != nil {
		t.Fatalf("Run err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %s, want about the drain delay", d)
	}
	if res.StdoutTail != "done\n" {
		t.Errorf("StdoutTail = %q, want %q", res.StdoutTail, "done\n")
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitDead(t, []int{pid})
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestRunOutputWriteError(t *testing.T) {
	_, err := Exec{}.Run(context.Background(), Cmd{Path: "sh", Args: []string{"-c", "echo hi"}, Output: failWriter{}})
	if err == nil || !strings.Contains(err.Error(), "writing output of sh: disk full") {
		t.Errorf("Run with failing Output err = %v, want writing output error", err)
	}
}

func TestRunNotFound(t *testing.T) {
	_, err := Exec{}.Run(context.Background(), Cmd{Path: "kiln-no-such-tool"})
	var nf *NotFoundError
	if !errors.As(err, &nf) || nf.Name != "kiln-no-such-tool" {
		t.Fatalf("Run(missing) err = %v, want *NotFoundError", err)
	}
	if want := "kiln-no-such-tool not found in PATH"; err.Error() != want {
		t.Errorf("err = %q, want %q", err.Error(), want)
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "trtexec")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	tests := []struct {
		name, explicit string
		want           string
		wantErr        string
	}{
		{"trtexec", "", exe, ""},
		{"trtexec", exe, exe, ""},
		{"trtexec", "trtexec", exe, ""},
		{"nvidia-smi", "", "", "nvidia-smi not found in PATH"},
		{"trtexec", filepath.Join(dir, "missing"), "", "trtexec not usable at " + filepath.Join(dir, "missing") + ": stat"},
		{"trtexec", plain, "", "trtexec not usable at " + plain + ": permission denied"},
		{"trtexec", dir + "/", "", "is a directory"},
	}
	for _, tt := range tests {
		got, err := LookPath(tt.name, tt.explicit)
		if tt.wantErr == "" {
			if err != nil || got != tt.want {
				t.Errorf("LookPath(%q, %q) = %q, %v, want %q", tt.name, tt.explicit, got, err, tt.want)
			}
			continue
		}
		var nf *NotFoundError
		if !errors.As(err, &nf) || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("LookPath(%q, %q) = %q, %v, want NotFoundError containing %q", tt.name, tt.explicit, got, err, tt.wantErr)
		}
	}
}

func TestToolErrorMessage(t *testing.T) {
	tests := []struct {
		err  *ToolError
		want string
	}{
		{&ToolError{Tool: "trtexec", ExitCode: 1, StderrTail: "[E] a\n\n[E] b\n"}, "trtexec exited 1: [E] a | [E] b"},
		{&ToolError{Tool: "trtexec", TimedOut: true, Timeout: 10 * time.Minute}, "trtexec timed out after 10m0s"},
		{&ToolError{Tool: "trtexec", Canceled: true, Cause: context.Canceled}, "trtexec canceled (context canceled)"},
		{&ToolError{Tool: "trtexec", ExitCode: -1, Signal: "segmentation fault"}, "trtexec killed by signal segmentation fault"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("(%+v).Error() = %q, want %q", *tt.err, got, tt.want)
		}
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		max     int
		writes  []string
		want    string
		wantCut bool
	}{
		{10, []string{"ab\n", "cd\n"}, "ab\ncd\n", false},
		{6, []string{"aaaa\n", "bb\n", "cc\n"}, "cc\n", true},
		{4, []string{"0123456789\n"}, "789\n", true},
		{8, []string{"12\n", "34\n", "56\n", "78\n", "90\n", "ab\n", "cd\n"}, "ab\ncd\n", true},
	}
	for _, tt := range tests {
		tl := &tail{max: tt.max}
		for _, w := range tt.writes {
			tl.write([]byte(w))
		}
		got, cut := tl.String()
		if got != tt.want || cut != tt.wantCut {
			t.Errorf("tail{%d} after %q = %q, %v, want %q, %v", tt.max, tt.writes, got, cut, tt.want, tt.wantCut)
		}
	}
}
