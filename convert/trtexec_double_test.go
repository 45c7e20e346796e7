package convert

// trtexecDouble is a TEST DOUBLE for NVIDIA's trtexec, which cannot run on
// machines without a GPU and TensorRT. The test binary re-executes itself
// with KILN_TRTEXEC_DOUBLE=1 and then acts as trtexec: it replays a real
// console log captured from trtexec (../../shared/corpus/trt-logs/trtexec),
// chosen by TRTEXEC_DOUBLE_LOG.
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
// It hooks in through init rather than TestMain, so that other test files
// of this package stay free to define TestMain.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

const (
	doubleEnv        = "KILN_TRTEXEC_DOUBLE"
	doubleLogEnv     = "TRTEXEC_DOUBLE_LOG"
	doubleVersionEnv = "TRTEXEC_DOUBLE_VERSION"
	doubleArgvEnv    = "TRTEXEC_DOUBLE_ARGV"
	doubleModeEnv    = "TRTEXEC_DOUBLE_MODE"
	doubleHelpEnv    = "TRTEXEC_DOUBLE_HELP"
)

// doublePlanContent is what the double writes as an "engine".
const doublePlanContent = "kiln trtexec double: not a TensorRT engine\n"

func init() {
	if os.Getenv(doubleEnv) == "" {
		return
	}
	os.Exit(trtexecDouble(os.Args[1:]))
}

var doubleBannerRE = regexp.MustCompile(`^(&&&& \S+ \S+ \[TensorRT v)(\d+)(\].*?)(?: # .*)?$`)

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
		help, err := os.ReadFile(os.Getenv(doubleHelpEnv))
		if err != nil {
			fmt.Fprintln(os.Stderr, "trtexec double:", err)
			return 2
		}
		for _, l := range strings.Split(string(help), "\n") {
			fmt.Println(rewrite(l))
		}
		return 0
	}

	save := ""
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--saveEngine="); ok {
			save = v
		}
	}
	mode := os.Getenv(doubleModeEnv)
	out := bufio.NewWriter(os.Stdout)
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
	out.Flush()
	if status != "PASSED" {
		return 1
	}
	if save != "" && mode != "noplan" {
		if err := os.WriteFile(save, []byte(doublePlanContent), 0o644); err != nil {
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
