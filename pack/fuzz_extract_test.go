package pack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// tarOf writes headers (and size bytes of content each) as a tar stream.
func tarOf(tb testing.TB, hdrs ...*tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatal(err)
		}
		tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
	}
	tw.Close()
	return buf.Bytes()
}

// FuzzExtract: whatever a layer holds, the extractor writes nothing
// outside its target and leaves no symbolic link there that points out of
// it; a refusal names the entry and why.
func FuzzExtract(f *testing.F) {
	reg := func(name string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}
	}
	link := func(name, to string, typ byte) *tar.Header {
		return &tar.Header{Name: name, Typeflag: typ, Linkname: to}
	}
	dir := &tar.Header{Name: "models/", Typeflag: tar.TypeDir, Mode: 0o755}
	for _, hdrs := range [][]*tar.Header{
		{dir, reg("models/a/1/model.onnx"), reg("models/kiln.json")},
		{reg("models/../evil")}, {reg("models/a/../../evil")}, {reg("/models/evil")}, {reg("etc/passwd")},
		{link("models/link", "../../evil", tar.TypeSymlink)}, {link("models/link", "/etc/passwd", tar.TypeSymlink)},
		{link("models/link", "etc/passwd", tar.TypeLink)},
		{link("models/d", ".", tar.TypeSymlink), reg("models/d/../../evil")},
		{link("models/d", ".", tar.TypeSymlink), link("models/d/x", "..", tar.TypeSymlink)},
		{link("models/a/l", "../x", tar.TypeSymlink), link("models/m", "models/a/l", tar.TypeLink)},
		{link("models/ok", "a/1", tar.TypeSymlink), reg("models/a/1/f")},
		{{Name: "models/dev", Typeflag: tar.TypeChar}},
	} {
		f.Add(tarOf(f, hdrs...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		target := filepath.Join(parent, "target")
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		err := untar(context.Background(), bytes.NewReader(data), target)
		var ee *EscapeError
		if errors.As(err, &ee) && ee.Entry == "" && ee.Reason == "" {
			t.Errorf("untar = %v: an EscapeError names the entry and why", err)
		}
		if left, _ := os.ReadDir(parent); len(left) != 1 {
			t.Fatalf("untar (err %v) wrote outside its target: %v", err, left)
		}
		filepath.WalkDir(target, func(p string, d fs.DirEntry, werr error) error {
			if werr != nil || d.Type()&fs.ModeSymlink == 0 {
				return nil
			}
			to, _ := os.Readlink(p)
			rel, _ := filepath.Rel(target, p)
			if filepath.IsAbs(to) || !filepath.IsLocal(filepath.Join(filepath.Dir(rel), to)) {
				t.Errorf("untar (err %v) left the link %s -> %s, which points out of the target", err, rel, to)
			}
			return nil
		})
	})
}

// Links that each look local but together point out are refused: an
// entry below a symbolic link, and a hard link to a symbolic link.
func TestExtractRefusesLinkChains(t *testing.T) {
	sym := func(name, to string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to}
	}
	cases := map[string][]*tar.Header{
		"link below a link":      {sym("models/d", "."), sym("models/d/x", "..")},
		"file below a link":      {sym("models/d", "."), {Name: "models/d/f", Typeflag: tar.TypeReg}},
		"hard link to a symlink": {sym("models/a/l", "../x"), {Name: "models/m", Typeflag: tar.TypeLink, Linkname: "models/a/l"}},
	}
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			err := untar(context.Background(), bytes.NewReader(tarOf(t, hdrs...)), t.TempDir())
			var ee *EscapeError
			if !errors.As(err, &ee) {
				t.Fatalf("untar = %v, want an EscapeError", err)
			}
		})
	}
}
