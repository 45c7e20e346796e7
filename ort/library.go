// Package ort runs ONNX models with ONNX Runtime. It is the only cgo package
// of kiln: it finds the ONNX Runtime shared library, loads it once per
// process, opens sessions on the CPU, CUDA or TensorRT execution providers and
// converts between onnx.Tensor and ONNX Runtime's values.
//
// It wraps github.com/yalue/onnxruntime_go v1.27.0, which speaks the ONNX
// Runtime C API version 24 (ONNX Runtime 1.24.1) and dlopens the library at
// Init, so building and vetting need no library; running needs ONNX Runtime
// 1.24.1 or newer (older libraries refuse API version 24).
package ort

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	ortgo "github.com/yalue/onnxruntime_go"
)

// MinVersion is the oldest ONNX Runtime release whose library works with the
// binding (it needs C API version 24).
const MinVersion = "1.24.1"

// libNames are the file names FindLibrary accepts in a directory, best first.
var libNames = []string{"libonnxruntime.so.1", "libonnxruntime.so"}

// systemDirs are searched last, in order.
var systemDirs = []string{"/usr/lib", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu"}

// LibraryNotFoundError is returned by FindLibrary when no ONNX Runtime library
// exists in any place it looked.
type LibraryNotFoundError struct {
	// Tried lists the paths and patterns that were checked, in order.
	Tried []string
}

func (e *LibraryNotFoundError) Error() string {
	return "ONNX Runtime library not found (tried " + strings.Join(e.Tried, ", ") + ")"
}

// FindLibrary returns the path of the ONNX Runtime shared library. It checks,
// in order: explicit (the --ort-lib flag), envValue (the caller passes
// KILN_ORT_LIB; this package never reads the environment), the newest
// version directory of <projectDir>/.cache/ort/*/ (skipped when projectDir is
// empty), then /usr/lib, /usr/local/lib and /usr/lib/x86_64-linux-gnu. A path
// given explicitly or through envValue must exist: it is not silently passed
// over for another library. It may name the library or a directory holding it.
// When nothing is found the error is a *LibraryNotFoundError.
func FindLibrary(explicit, envValue, projectDir string) (string, error) {
	return findLibrary(explicit, envValue, projectDir, systemDirs)
}

func findLibrary(explicit, envValue, projectDir string, sysDirs []string) (string, error) {
	for _, given := range []string{explicit, envValue} {
		if given == "" {
			continue
		}
		if isFile(given) {
			return given, nil
		}
		if !isDir(given) {
			return "", &LibraryNotFoundError{Tried: []string{given}}
		}
		p, tried := inDir(given)
		if p == "" {
			return "", &LibraryNotFoundError{Tried: tried}
		}
		return p, nil
	}
	var tried []string
	if projectDir != "" {
		pattern := filepath.Join(projectDir, ".cache", "ort", "*", "libonnxruntime.so*")
		tried = append(tried, pattern)
		if p := newestCached(filepath.Join(projectDir, ".cache", "ort")); p != "" {
			return p, nil
		}
	}
	for _, d := range sysDirs {
		p, t := inDir(d)
		if p != "" {
			return p, nil
		}
		tried = append(tried, t...)
	}
	return "", &LibraryNotFoundError{Tried: tried}
}

// inDir looks for the library's usual names in dir.
func inDir(dir string) (string, []string) {
	var tried []string
	for _, n := range libNames {
		p := filepath.Join(dir, n)
		tried = append(tried, p)
		if isFile(p) {
			return p, tried
		}
	}
	return "", tried
}

// newestCached picks the library in the highest-versioned subdirectory of
// cache (what `make deps` writes: .cache/ort/<version>/libonnxruntime.so.1).
func newestCached(cache string) string {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return ""
	}
	var dirs []string
	for _, e := range entries {
		if isDir(filepath.Join(cache, e.Name())) {
			dirs = append(dirs, e.Name())
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return versionLess(dirs[j], dirs[i]) })
	for _, d := range dirs {
		if p, _ := inDir(filepath.Join(cache, d)); p != "" {
			return p
		}
		// Any other libonnxruntime.so.X.Y.Z in the directory.
		matches, _ := filepath.Glob(filepath.Join(cache, d, "libonnxruntime.so*"))
		sort.Strings(matches)
		for _, m := range matches {
			if isFile(m) {
				return m
			}
		}
	}
	return ""
}

// versionLess orders dotted versions numerically; names that are not
// versions sort before every version, alphabetically among themselves.
func versionLess(a, b string) bool {
	va, oka := parseVersion(a)
	vb, okb := parseVersion(b)
	switch {
	case !oka && !okb:
		return a < b
	case !oka || !okb:
		return !oka
	}
	for i := 0; i < len(va) && i < len(vb); i++ {
		if va[i] != vb[i] {
			return va[i] < vb[i]
		}
	}
	return len(va) < len(vb)
}

func parseVersion(s string) ([]int, bool) {
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// InitError is returned by Init when the library cannot be loaded: a file
// that is not a shared library, or an ONNX Runtime older than MinVersion.
type InitError struct {
	Path string
	Err  error
}

func (e *InitError) Error() string {
	return fmt.Sprintf("loading ONNX Runtime from %s (kiln needs ONNX Runtime >= %s): %v", e.Path, MinVersion, e.Err)
}

func (e *InitError) Unwrap() error { return e.Err }

var env struct {
	mu   sync.Mutex
	path string // set once the environment is up
}

// Init loads the ONNX Runtime library at libPath and creates the process-wide
// ONNX Runtime environment. It may be called any number of times, from any
// goroutine, with the same path; calling it with another path once the
// environment is up is an error (a process holds one ONNX Runtime). A failed
// Init may be retried. Load errors are *InitError.
func Init(libPath string) error {
	if libPath == "" {
		return errors.New("initializing ONNX Runtime: no library path")
	}
	abs, err := filepath.Abs(libPath)
	if err != nil {
		return &InitError{Path: libPath, Err: err}
	}
	env.mu.Lock()
	defer env.mu.Unlock()
	if env.path != "" {
		if env.path != abs {
			return fmt.Errorf("initializing ONNX Runtime from %s: already initialized from %s", abs, env.path)
		}
		return nil
	}
	if !isFile(abs) {
		return &InitError{Path: abs, Err: errors.New("no such file")}
	}
	ortgo.SetSharedLibraryPath(abs)
	// Warnings (unused initializers, fallbacks) go to stderr from C++; a
	// library stays quiet unless something fails, which Run reports anyway.
	if err := ortgo.InitializeEnvironment(ortgo.WithLogLevelError()); err != nil {
		return &InitError{Path: abs, Err: err}
	}
	env.path = abs
	return nil
}

// Initialized reports whether Init has succeeded in this process.
func Initialized() bool {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.path != ""
}

// Version returns the loaded library's version ("1.24.1"), or "" before Init.
func Version() string {
	if !Initialized() {
		return ""
	}
	return ortgo.GetVersion()
}
