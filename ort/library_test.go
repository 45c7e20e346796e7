package ort_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/ort"
)

func touch(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("not really a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFindLibrary(t *testing.T) {
	tmp := t.TempDir()
	flag := touch(t, filepath.Join(tmp, "flag", "libonnxruntime.so.1"))
	envLib := touch(t, filepath.Join(tmp, "env", "custom-name.so"))
	dirLib := touch(t, filepath.Join(tmp, "dir", "libonnxruntime.so"))
	// Numeric version order: 1.24.1 beats 1.9.0 (lexically larger); 1.30.0
	// holds no library and "nightly" is not a version.
	proj := filepath.Join(tmp, "proj")
	touch(t, filepath.Join(proj, ".cache/ort/1.9.0/libonnxruntime.so.1"))
	cached := touch(t, filepath.Join(proj, ".cache/ort/1.24.1/libonnxruntime.so.1.24.1"))
	touch(t, filepath.Join(proj, ".cache/ort/nightly/libonnxruntime.so.1"))
	if err := os.MkdirAll(filepath.Join(proj, ".cache/ort/1.30.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	sys1, sys2 := filepath.Join(tmp, "sys1"), filepath.Join(tmp, "sys2")
	sysLib := touch(t, filepath.Join(sys2, "libonnxruntime.so"))
	empty := filepath.Join(tmp, "empty")

	tests := []struct {
		name                   string
		explicit, env, project string
		sys                    []string
		want                   string
		wantTried              []string // nil: expect success
	}{
		{"flag wins over everything", flag, envLib, proj, []string{sys2}, flag, nil},
		{"environment next", "", envLib, proj, []string{sys2}, envLib, nil},
		{"flag may name a directory", filepath.Join(tmp, "dir"), "", "", nil, dirLib, nil},
		{"newest cached version", "", "", proj, []string{sys2}, cached, nil},
		{"system directories last", "", "", empty, []string{sys1, sys2}, sysLib, nil},
		{"missing flag is not passed over", filepath.Join(tmp, "nope.so"), envLib, proj, nil, "",
			[]string{filepath.Join(tmp, "nope.so")}},
		{"missing environment value is not passed over", "", filepath.Join(tmp, "nope.so"), proj, nil, "",
			[]string{filepath.Join(tmp, "nope.so")}},
		{"nothing anywhere", "", "", empty, []string{sys1}, "", []string{
			filepath.Join(empty, ".cache/ort/*/libonnxruntime.so*"),
			filepath.Join(sys1, "libonnxruntime.so.1"),
			filepath.Join(sys1, "libonnxruntime.so"),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ort.FindLibraryIn(tc.explicit, tc.env, tc.project, tc.sys)
			if tc.wantTried == nil {
				if err != nil || got != tc.want {
					t.Fatalf("findLibrary = %q, %v, want %q", got, err, tc.want)
				}
				return
			}
			var nf *ort.LibraryNotFoundError
			if !errors.As(err, &nf) {
				t.Fatalf("findLibrary = %q, %v, want *LibraryNotFoundError", got, err)
			}
			if !reflect.DeepEqual(nf.Tried, tc.wantTried) {
				t.Errorf("Tried = %q, want %q", nf.Tried, tc.wantTried)
			}
			for _, p := range tc.wantTried {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q does not name %s", err, p)
				}
			}
		})
	}
}

func TestFindLibrarySystemDefaults(t *testing.T) {
	_, err := ort.FindLibrary("", "", "")
	var nf *ort.LibraryNotFoundError
	if errors.As(err, &nf) {
		for _, d := range ort.SystemDirs {
			if !strings.Contains(err.Error(), filepath.Join(d, "libonnxruntime.so")) {
				t.Errorf("error %q does not list %s", err, d)
			}
		}
	}
}

func TestInitIdempotent(t *testing.T) {
	ortest.Init(t)
	lib, _ := ort.FindLibrary("", os.Getenv("KILN_ORT_LIB"), testutil.RepoRoot(t))
	done := make(chan error, 4)
	for range 4 {
		go func() { done <- ort.Init(lib) }()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Errorf("Init(%s) again = %v", lib, err)
		}
	}
	other := touch(t, filepath.Join(t.TempDir(), "libonnxruntime.so.1"))
	if err := ort.Init(other); err == nil || !strings.Contains(err.Error(), "already initialized") {
		t.Errorf("Init(other library) = %v, want already-initialized error", err)
	}
	if v := ort.Version(); !strings.HasPrefix(v, "1.") {
		t.Errorf("Version() = %q, want 1.x", v)
	}
}

// TestInitBadLibrary loads a file that is no library, in a child process:
// this process already holds ONNX Runtime.
func TestInitBadLibrary(t *testing.T) {
	if os.Getenv("KILN_ORT_TEST_CHILD") == "bad-library" {
		bad := touch(t, filepath.Join(t.TempDir(), "libonnxruntime.so.1"))
		err := ort.Init(bad)
		var ie *ort.InitError
		if !errors.As(err, &ie) || ie.Path != bad || !strings.Contains(err.Error(), ">= "+ort.MinVersion) {
			t.Fatalf("Init(%s) = %v, want *InitError naming the path and %s", bad, err, ort.MinVersion)
		}
		if ort.Initialized() || ort.Version() != "" {
			t.Fatal("failed Init left the environment initialized")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInitBadLibrary$", "-test.v")
	cmd.Env = append(os.Environ(), "KILN_ORT_TEST_CHILD=bad-library")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestInitBadLibrary") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
