package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	if err := WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(got) != "two" || st.Mode().Perm() != 0o644 {
		t.Errorf("WriteFile twice = %q %v, want \"two\" -rw-r--r--", got, st.Mode().Perm())
	}
	if names := testutil.DirNames(t, dir); !slices.Equal(names, []string{"f.json"}) {
		t.Errorf("directory after WriteFile = %v, want only f.json", names)
	}
}

func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "model.onnx")
	os.WriteFile(p, []byte("old"), 0o644)
	boom := errors.New("boom")
	err := Write(p, 0o644, func(w io.Writer) error {
		io.WriteString(w, "half of the new")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want the writer's error", err)
	}
	got, _ := os.ReadFile(p)
	if string(got) != "old" {
		t.Errorf("after a failed Write the file holds %q, want \"old\"", got)
	}
	if names := testutil.DirNames(t, dir); !slices.Equal(names, []string{"model.onnx"}) {
		t.Errorf("a failed Write left %v, want only model.onnx", names)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o644); err == nil {
		t.Error("WriteFile into a missing directory = nil error")
	}
}

func TestWriteFilesAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("old a"), 0o644)
	err := WriteFiles(map[string][]byte{a: []byte("new a"), filepath.Join(dir, "nodir", "c"): []byte("c")}, 0o644)
	if err == nil {
		t.Fatal("WriteFiles with an unwritable path = nil error")
	}
	if got, _ := os.ReadFile(a); string(got) != "old a" {
		t.Errorf("a failed WriteFiles changed a to %q", got)
	}
	if names := testutil.DirNames(t, dir); !slices.Equal(names, []string{"a"}) {
		t.Errorf("a failed WriteFiles left %v, want only a", names)
	}
	if err := WriteFiles(map[string][]byte{a: []byte("new a"), b: []byte("new b")}, 0o644); err != nil {
		t.Fatal(err)
	}
	ga, _ := os.ReadFile(a)
	gb, _ := os.ReadFile(b)
	if string(ga) != "new a" || string(gb) != "new b" {
		t.Errorf("WriteFiles wrote %q, %q", ga, gb)
	}
}

func TestReplaceDir(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "out")
	fill := func(content string) func(string) error {
		return func(tmp string) error { return os.WriteFile(filepath.Join(tmp, "f"), []byte(content), 0o644) }
	}
	if err := ReplaceDir(dir, fill("first")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "stale"), nil, 0o644)
	if err := ReplaceDir(dir, fill("second")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "f")); string(got) != "second" {
		t.Errorf("after ReplaceDir f = %q, want second", got)
	}
	if names := testutil.DirNames(t, dir); !slices.Equal(names, []string{"f"}) {
		t.Errorf("replaced directory holds %v, want only f (the old content goes)", names)
	}
	boom := errors.New("boom")
	err := ReplaceDir(dir, func(tmp string) error {
		fill("third")(tmp)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("ReplaceDir with a failing fill = %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "f")); string(got) != "second" {
		t.Errorf("after a failed ReplaceDir f = %q, want second", got)
	}
	if names := testutil.DirNames(t, parent); !slices.Equal(names, []string{"out"}) {
		t.Errorf("a failed ReplaceDir left %v next to out", names)
	}
}

func TestRecover(t *testing.T) {
	parent := t.TempDir()
	// An interruption between the two renames: out moved aside, nothing in its place.
	os.MkdirAll(filepath.Join(parent, ".out.kiln-old"), 0o755)
	os.WriteFile(filepath.Join(parent, ".out.kiln-old", "f"), []byte("kept"), 0o644)
	// An interruption while filling, and a moved-aside copy of a directory that is back.
	os.MkdirAll(filepath.Join(parent, ".out.kiln-tmp-123"), 0o755)
	os.MkdirAll(filepath.Join(parent, "m"), 0o755)
	os.MkdirAll(filepath.Join(parent, ".m.kiln-old"), 0o755)
	os.MkdirAll(filepath.Join(parent, ".hidden"), 0o755)
	for name, want := range map[string]string{".out.kiln-old": "out", ".m.kiln-old": "m"} {
		if got, ok := MovedAside(name); !ok || got != want {
			t.Errorf("MovedAside(%q) = %q, %v, want %q", name, got, ok, want)
		}
	}
	for _, name := range []string{"out", ".kiln-old", ".hidden", ".out.kiln-tmp-1"} {
		if got, ok := MovedAside(name); ok {
			t.Errorf("MovedAside(%q) = %q, true, want false", name, got)
		}
	}
	changed, err := Recover(parent)
	if err != nil || !changed {
		t.Fatalf("Recover = %v, %v, want true, nil", changed, err)
	}
	if names := testutil.DirNames(t, parent); !slices.Equal(names, []string{".hidden", "m", "out"}) {
		t.Errorf("after Recover the directory holds %v, want .hidden, m, out", names)
	}
	if got, _ := os.ReadFile(filepath.Join(parent, "out", "f")); string(got) != "kept" {
		t.Errorf("recovered out/f = %q, want kept", got)
	}
	if changed, err := Recover(parent); changed || err != nil {
		t.Errorf("second Recover = %v, %v, want false, nil", changed, err)
	}
}
