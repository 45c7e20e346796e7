// Package trtexectest is a TEST DOUBLE for NVIDIA's trtexec, for the tests
// of convert, serve and internal/trtexec: trtexec cannot run on machines without a
// GPU and TensorRT. Install makes the test binary re-execute itself with
// KILN_TRTEXEC_DOUBLE=1, and then act as trtexec: it replays a real console
// log captured from trtexec (the corpus's trt-logs/trtexec), chosen by
// TRTEXEC_DOUBLE_LOG.
//
// What it changes in the replayed log, and nothing else:
//   - the banner's version number ("[TensorRT v101601]"), only when
//     TRTEXEC_DOUBLE_VERSION is set, so that a test can present a log as
//     another TensorRT major version (there is no TensorRT 11 log in the
//     corpus);
//   - the banner's command line, replaced by the argv it received, as real
//     trtexec prints its own argv there.
//
// Like trtexec it writes [E] and [F] lines to stderr and the rest to stdout,
// writes an engine to --saveEngine when the log PASSED (a dummy file: never
// a real engine), and exits 0 for PASSED and 1 otherwise. "--help" replays
// the real help text with the banner version of the log. Every argv it gets
// is appended as a JSON line to TRTEXEC_DOUBLE_ARGV.
//
// TRTEXEC_DOUBLE_MODE changes the ending: "hang" writes part of an engine
// and then sleeps (a stuck build), "crash" writes part of an engine and
// kills itself with SIGKILL, "noplan" passes without writing an engine.
//
// It hooks in through init rather than TestMain, so that the test files of
// the packages importing it stay free to define TestMain. Only tests import
// it.
package trtexectest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/testutil"
)

const (
	doubleEnv        = "KILN_TRTEXEC_DOUBLE"
	doubleLogEnv     = "TRTEXEC_DOUBLE_LOG"
	doubleVersionEnv = "TRTEXEC_DOUBLE_VERSION"
	doubleArgvEnv    = "TRTEXEC_DOUBLE_ARGV"
	doubleModeEnv    = "TRTEXEC_DOUBLE_MODE"
	doubleHelpEnv    = "TRTEXEC_DOUBLE_HELP"
)

// PlanContent is what the double writes as an "engine".
const PlanContent = "kiln trtexec double: not a TensorRT engine\n"

func init() {
	if os.Getenv(doubleEnv) == "" {
		return
	}
	os.Exit(trtexecDouble(os.Args[1:]))
}

var doubleBannerRE = regexp.MustCompile(`^(&&&& \S+ \S+ \[TensorRT v)(\d+)(\].*?)(?: # .*)?$`)

// trtexecDouble acts as trtexec with args and returns its exit status.
func trtexecDouble(args []string) int {
	if f := os.Getenv(doubleArgvEnv); f != "" {
		b, _ := json.Marshal(args)
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fh.Write(append(b, '\n'))
			fh.Close()
		}
	}
	logData, err := os.ReadFile(os.Getenv(doubleLogEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "trtexec double:", err)
		return 2
	}
	lines := strings.Split(strings.TrimRight(string(logData), "\n"), "\n")
	version := os.Getenv(doubleVersionEnv)
	if version == "" {
		if m := doubleBannerRE.FindStringSubmatch(lines[0]); m != nil {
			version = m[2]
		}
	}
	command := "trtexec " + strings.Join(args, " ")
	rewrite := func(line string) string {
		m := doubleBannerRE.FindStringSubmatch(line)
		if m == nil {
			return line
		}
		return m[1] + version + m[3] + " # " + command
	}
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		return help(rewrite)
	}
	save := ""
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--saveEngine="); ok {
			save = v
		}
	}
	mode := os.Getenv(doubleModeEnv)
	if status := replay(lines, rewrite, save, mode); status != "PASSED" {
		return 1
	}
	return writeOutputs(args, save, mode)
}

// help prints the corpus's --help text.
func help(rewrite func(string) string) int {
	text, err := os.ReadFile(os.Getenv(doubleHelpEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "trtexec double:", err)
		return 2
	}
	for _, l := range strings.Split(string(text), "\n") {
		fmt.Println(rewrite(l))
	}
	return 0
}

// replay prints the log, [E] and [F] lines to stderr, and returns its
// verdict; "hang" and "crash" stop halfway with part of an engine written.
func replay(lines []string, rewrite func(string) string, save, mode string) string {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	status := "unknown"
	for i, l := range lines {
		l = rewrite(l)
		if strings.HasPrefix(l, "&&&& ") && !strings.HasPrefix(l, "&&&& RUNNING") {
			status = strings.Fields(l)[1]
		}
		if (mode == "hang" || mode == "crash") && i == len(lines)/2 {
			out.Flush()
			if save != "" {
				os.WriteFile(save, []byte("half an engine"), 0o644)
			}
			if mode == "crash" {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			time.Sleep(time.Hour)
		}
		if strings.Contains(l, "] [E] ") || strings.Contains(l, "] [F] ") {
			out.Flush()
			fmt.Fprintln(os.Stderr, l)
			continue
		}
		fmt.Fprintln(out, l)
	}
	return status
}

// writeOutputs writes the engine and the layer information a passed build
// leaves.
func writeOutputs(args []string, save, mode string) int {
	if save != "" && mode != "noplan" {
		if err := os.WriteFile(save, []byte(PlanContent), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "trtexec double:", err)
			return 1
		}
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--exportLayerInfo="); ok {
			src := filepath.Join(filepath.Dir(os.Getenv(doubleHelpEnv)), "trt10.16_model-trained-exportLayerInfo.json")
			if b, err := os.ReadFile(src); err == nil {
				os.WriteFile(v, b, 0o644)
			}
		}
	}
	return 0
}

// Double chooses what the double replays for one test.
type Double struct {
	// Log is a corpus log name (trt-logs/trtexec) or an absolute path.
	Log string
	// Version is the banner number to present; "" keeps the log's.
	Version string
	// Mode is "", "hang", "crash" or "noplan".
	Mode string
}

// Install makes the test binary act as trtexec for the rest of the test,
// and returns the program to run as trtexec and the file where the double
// records each argv it receives. It skips the test when the corpus is not
// there.
func (d Double) Install(t *testing.T) (exe, argvFile string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := d.Log
	if !filepath.IsAbs(logPath) {
		logPath = testutil.Corpus(t, "trt-logs", "trtexec", d.Log)
	}
	help := testutil.Corpus(t, "trt-logs", "trtexec", "trt10.16_trtexec_help.txt")
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	argvFile = filepath.Join(t.TempDir(), "argv.jsonl")
	t.Setenv(doubleEnv, "1")
	t.Setenv(doubleLogEnv, abs(logPath))
	t.Setenv(doubleHelpEnv, abs(help))
	t.Setenv(doubleArgvEnv, argvFile)
	t.Setenv(doubleVersionEnv, d.Version)
	t.Setenv(doubleModeEnv, d.Mode)
	return exe, argvFile
}

// RecordedArgv returns every argv the double received, in order.
func RecordedArgv(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the double recorded no argv: %v", err)
	}
	defer f.Close()
	var all [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var a []string
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatal(err)
		}
		all = append(all, a)
	}
	return all
}
