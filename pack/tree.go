package pack

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// epoch is the time every published entry carries, so that the same
// repository always gives the same bytes (and the same image digest).
var epoch = time.Unix(0, 0).UTC()

// entry is one file or directory of a repository, relative to its root
// with '/' separators.
type entry struct {
	rel  string
	dir  bool
	src  string // the file on disk; empty for data
	data []byte // kiln.json as published
	size int64
}

// tree is what a destination receives: every directory and file of the
// repository in lexical order, kiln.json last (a reader that sees the
// manifest sees a complete repository).
type tree struct {
	entries []entry
	man     *manifest.Manifest
}

// readTree lists repo and checks every file kiln.json records against
// its size and digest, so that what is published is what was built.
func readTree(repo string, man *manifest.Manifest) (*tree, error) {
	t := &tree{man: man}
	err := filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repo, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case atomicfile.IsTemp(d.Name()):
			return skip(d)
		case rel == manifest.FileName:
			return nil
		case d.IsDir():
			t.entries = append(t.entries, entry{rel: rel, dir: true})
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s: is a %s, not a regular file; kiln publishes files and directories only", p, d.Type())
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		t.entries = append(t.entries, entry{rel: rel, src: p, size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading repository %s: %w", repo, err)
	}
	published := *man
	published.Published = nil // where it went is not part of what is published
	data, err := published.Marshal()
	if err != nil {
		return nil, fmt.Errorf("repository %s: %s: %w", repo, manifest.FileName, err)
	}
	t.entries = append(t.entries, entry{rel: manifest.FileName, data: data, size: int64(len(data))})
	if err := verifyFiles(repo, man); err != nil {
		return nil, err
	}
	return t, nil
}

func skip(d fs.DirEntry) error {
	if d.IsDir() {
		return filepath.SkipDir
	}
	return nil
}

// verifyFiles checks every file of every model of man under dir against
// the size and digest kiln.json records for it.
func verifyFiles(dir string, man *manifest.Manifest) error {
	for _, m := range man.Models {
		for _, f := range m.Files {
			p := filepath.Join(dir, m.Name, filepath.FromSlash(f.Path))
			d, n, err := manifest.DigestFile(p)
			if err != nil {
				return fmt.Errorf("model %s: %w", m.Name, err)
			}
			if n != f.Size || d != f.Digest {
				return &MismatchError{Path: p, Size: n, Digest: d, WantSize: f.Size, WantDigest: f.Digest}
			}
		}
	}
	return nil
}

// MismatchError says that a file is not what kiln.json records.
type MismatchError struct {
	Path               string
	Size, WantSize     int64
	Digest, WantDigest manifest.Digest
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s: %d bytes %s, but kiln.json records %d bytes %s (the file changed after kiln built it)",
		e.Path, e.Size, e.Digest, e.WantSize, e.WantDigest)
}

// writeTar writes the tree as a tar stream under prefix ("models"), with
// fixed times and owners.
func (t *tree) writeTar(w io.Writer, prefix string) error {
	tw := tar.NewWriter(w)
	hdr := func(name string, mode int64, typ byte, size int64) *tar.Header {
		return &tar.Header{Name: name, Mode: mode, Typeflag: typ, Size: size, ModTime: epoch, Format: tar.FormatPAX}
	}
	if prefix != "" {
		if err := tw.WriteHeader(hdr(prefix+"/", 0o755, tar.TypeDir, 0)); err != nil {
			return err
		}
	}
	for _, e := range t.entries {
		name := path.Join(prefix, e.rel)
		if e.dir {
			if err := tw.WriteHeader(hdr(name+"/", 0o755, tar.TypeDir, 0)); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(hdr(name, 0o644, tar.TypeReg, e.size)); err != nil {
			return err
		}
		if err := e.copyTo(tw); err != nil {
			return err
		}
	}
	return tw.Close()
}

// copyTo writes the entry's content to w; a file that changed size since
// it was listed is an error, not a short or long tar entry.
func (e entry) copyTo(w io.Writer) error {
	if e.src == "" {
		_, err := w.Write(e.data)
		return err
	}
	f, err := os.Open(e.src)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, e.size+1))
	if err == nil && n != e.size {
		err = fmt.Errorf("%s: changed size while being published (%d bytes, listed %d)", e.src, n, e.size)
	}
	return err
}
