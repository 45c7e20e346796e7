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
// For an inference run (--loadEngine) it reads every --loadInputs file,
// splitting the spec as trtexec 10.x does, and fails (exit 2, before
// replaying anything) when one is missing or empty; it cannot check their
// sizes, not knowing the engine. It appends the files' bytes by input name
// as a JSON line to TRTEXEC_DOUBLE_INPUTS, so that a test can check the
// encoding. When the log PASSED it writes --exportOutput by copying the file
// TRTEXEC_DOUBLE_OUTPUTS names: outputs the test wrote itself. Those values
// do NOT come from TensorRT, and the replayed log is not changed to match
// them or the inputs: its lines about inputs, bindings and dumped outputs
// stay those of the captured run.
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
	doubleInputsEnv  = "TRTEXEC_DOUBLE_INPUTS"
	doubleOutputsEnv = "TRTEXEC_DOUBLE_OUTPUTS"
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
	save := flagValue(args, "--saveEngine")
	if flagValue(args, "--loadEngine") != "" {
		if err := readInputs(flagValue(args, "--loadInputs")); err != nil {
			fmt.Fprintln(os.Stderr, "trtexec double:", err)
			return 2
		}
	}
	mode := os.Getenv(doubleModeEnv)
	if status := replay(lines, rewrite, save, mode); status != "PASSED" {
		return 1
	}
	return writeOutputs(args, save, mode)
}

// flagValue returns the value of the last --flag=value in args.
func flagValue(args []string, flag string) string {
	v := ""
	for _, a := range args {
		if s, ok := strings.CutPrefix(a, flag+"="); ok {
			v = s
		}
	}
	return v
}

// readInputs reads the files of a --loadInputs spec and records their
// bytes. The spec is split as trtexec 10.x splits it (sampleOptions.cpp
// splitNameAndValue): items on ',', then a 'quoted' name before ":file",
// else the name before the last ':'.
func readInputs(spec string) error {
	got := map[string][]byte{}
	for item := range strings.SplitSeq(spec, ",") {
		if item == "" {
			continue
		}
		var name, file string
		if parts := strings.Split(item, "'"); len(parts) == 3 && strings.HasPrefix(parts[2], ":") {
			name, file = parts[0]+parts[1], parts[2][1:]
		} else if i := strings.LastIndexByte(item, ':'); i >= 0 && len(parts) == 1 {
			name, file = item[:i], item[i+1:]
		} else {
			return fmt.Errorf("--loadInputs item %q is not name:file", item)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("input %q: %w", name, err)
		}
		if len(b) == 0 {
			return fmt.Errorf("input %q: file %s is empty", name, file)
		}
		got[name] = b
	}
	if f := os.Getenv(doubleInputsEnv); f != "" {
		b, _ := json.Marshal(got)
		fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer fh.Close()
		if _, err := fh.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	return nil
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
// leaves, and the outputs a passed inference exports.
func writeOutputs(args []string, save, mode string) int {
	if out := flagValue(args, "--exportOutput"); out != "" && flagValue(args, "--loadEngine") != "" {
		b, err := os.ReadFile(os.Getenv(doubleOutputsEnv))
		if err == nil {
			err = os.WriteFile(out, b, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "trtexec double: --exportOutput needs Double.Outputs:", err)
			return 2
		}
	}
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
	// Outputs is a JSON file in trtexec's --exportOutput layout, which the
	// double copies to --exportOutput after an inference run that passed.
	// The test writes it with the values it expects (they do not come from
	// TensorRT); a relative path is taken from the test's directory.
	Outputs string
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
	outputs := d.Outputs
	if outputs != "" {
		outputs = abs(outputs)
	}
	argvFile = filepath.Join(t.TempDir(), "argv.jsonl")
	t.Setenv(doubleEnv, "1")
	t.Setenv(doubleInputsEnv, inputsFile(argvFile))
	t.Setenv(doubleOutputsEnv, outputs)
	t.Setenv(doubleLogEnv, abs(logPath))
	t.Setenv(doubleHelpEnv, abs(help))
	t.Setenv(doubleArgvEnv, argvFile)
	t.Setenv(doubleVersionEnv, d.Version)
	t.Setenv(doubleModeEnv, d.Mode)
	return exe, argvFile
}

func inputsFile(argvFile string) string {
	return strings.TrimSuffix(argvFile, ".jsonl") + ".inputs.jsonl"
}

// RecordedInputs returns, for every inference run (--loadEngine) the double
// received, in order, the bytes of each --loadInputs file by input name
// (an empty map for a run without --loadInputs); argvFile is the file
// Install returned.
func RecordedInputs(t *testing.T, argvFile string) []map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(inputsFile(argvFile))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var all []map[string][]byte
	for line := range strings.Lines(string(b)) {
		var m map[string][]byte
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		all = append(all, m)
	}
	return all
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
