package cmd

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/ort"
)

func init() {
	advisors = append(advisors, func(err error) string {
		var nf *ort.LibraryNotFoundError
		if errors.As(err, &nf) {
			return "run `make deps` in the kiln checkout (it fetches ONNX Runtime into .cache/ort/), or pass --ort-lib / set KILN_ORT_LIB to a libonnxruntime.so of version >= " + ort.MinVersion
		}
		var pu *ort.ProviderUnavailableError
		if errors.As(err, &pu) {
			return "this ONNX Runtime library has no " + string(pu.Provider) + " execution provider: point --ort-lib at an ONNX Runtime GPU build, or use --device cpu"
		}
		var ie *ort.InitError
		if errors.As(err, &ie) {
			return "kiln needs ONNX Runtime >= " + ort.MinVersion + "; `make deps` fetches a matching CPU build"
		}
		return ""
	})
}

// initORT finds and loads ONNX Runtime: --ort-lib, then $KILN_ORT_LIB, then
// .cache/ort/ in the working directory or any parent (a kiln checkout), then
// next to the kiln binary, then the system.
func (g *globalOptions) initORT() error {
	env := os.Getenv("KILN_ORT_LIB")
	var lastErr error
	for _, dir := range projectDirs() {
		path, err := ort.FindLibrary(g.ortLib, env, dir)
		if err == nil {
			if err := ort.Init(path); err != nil {
				return err
			}
			if g.routeORTLogs {
				if err := ort.RouteLogs(g.logger); err != nil {
					g.logger(os.Stderr).Debug("ONNX Runtime's log lines stay raw on stderr", "err", err)
				}
			}
			return nil
		}
		lastErr = err
		if g.ortLib != "" || env != "" {
			break // an explicit choice that does not exist is an error, not a fallback
		}
	}
	return lastErr
}

func projectDirs() []string {
	var dirs []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, ".cache", "ort")); err == nil {
				dirs = append(dirs, d)
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	if len(dirs) == 0 {
		dirs = append(dirs, ".")
	}
	return dirs
}

// sessionFlags are the ONNX Runtime flags of commands that run models:
// --device and --threads.
type sessionFlags struct {
	device  string
	threads int
}

// addFlags defines the flags; prefix starts their help ("with --run: ").
func (s *sessionFlags) addFlags(f *pflag.FlagSet, prefix string) {
	choice(f, &s.device, "device", string(ort.ProviderCPU), prefix+"ONNX Runtime execution provider: cpu, cuda or tensorrt (the GPU ones need a GPU build of ONNX Runtime, see --ort-lib)",
		string(ort.ProviderCPU), string(ort.ProviderCUDA), string(ort.ProviderTensorRT))
	f.IntVar(&s.threads, "threads", 0, prefix+"ONNX Runtime intra-op threads (0: its default)")
}

func (s *sessionFlags) options() ort.SessionOptions {
	return ort.SessionOptions{Provider: ort.Provider(s.device), IntraOpThreads: s.threads}
}

// resolveThreads is kiln calibrate's --threads: 0 means one ONNX Runtime
// thread per CPU (runtime.NumCPU), where ONNX Runtime's own default counts
// physical cores as it finds them and gave one thread on a 2-vCPU VM.
func resolveThreads(n int) int {
	if n == 0 {
		return runtime.NumCPU()
	}
	return n
}

// defaultMemoryBudget is calibrate's default --memory-budget: a quarter of
// the machine's memory (MemTotal in /proc/meminfo), or no cap (0) where
// that cannot be read.
func defaultMemoryBudget() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10 / 4
		}
	}
	return 0
}
