// Package atomicfile writes files and directories so that a reader sees the
// old content or the new, never a part: everything is written under a
// temporary name in the destination's own directory, synced, and renamed
// into place. On any error the temporary copy is removed and the
// destination is left as it was. It is kiln's only copy of this mechanism.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// WriteFile writes data to path atomically with permissions perm.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write is WriteFile for content that is streamed rather than held in
// memory: write produces it through a buffered writer.
func Write(path string, perm os.FileMode, write func(w io.Writer) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// writeTemp writes a synced temporary file next to path and returns its name.
func writeTemp(path string, perm os.FileMode, write func(w io.Writer) error) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	bw := bufio.NewWriterSize(f, 256<<10)
	if err = write(bw); err == nil {
		if err = bw.Flush(); err == nil {
			if err = f.Chmod(perm); err == nil {
				if err = f.Sync(); err == nil {
					err = f.Close()
				}
			}
		}
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// WriteFiles writes several files (path -> content) so that none is renamed
// into place before every one is written and synced: a failure while
// writing leaves all of them as they were.
func WriteFiles(files map[string][]byte, perm os.FileMode) (err error) {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	tmps := make([]string, 0, len(paths))
	defer func() {
		if err != nil {
			for _, t := range tmps {
				os.Remove(t)
			}
		}
	}()
	for _, p := range paths {
		data := files[p]
		tmp, err := writeTemp(p, perm, func(w io.Writer) error {
			_, err := w.Write(data)
			return err
		})
		if err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		tmps = append(tmps, tmp)
	}
	for i, p := range paths {
		if err := os.Rename(tmps[i], p); err != nil {
			return err
		}
	}
	return nil
}

// The names ReplaceDir gives its temporary and moved-aside directories,
// hidden next to the destination: .<name>.kiln-tmp-<random> and .<name>.kiln-old.
const (
	tmpInfix  = ".kiln-tmp-"
	oldSuffix = ".kiln-old"
)

// ReplaceDir fills a fresh temporary directory next to dir with fill and
// then puts it in dir's place. On any failure the temporary directory is
// removed and dir is left as it was. The swap is two renames (dir aside,
// the new one in); if the process dies between them, the previous
// directory is left as .<name>.kiln-old, which MovedAside recognizes and
// Recover puts back. A directory has one writer at a time.
func ReplaceDir(dir string, fill func(tmp string) error) (err error) {
	dir = filepath.Clean(dir)
	parent, base := filepath.Dir(dir), filepath.Base(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+base+tmpInfix)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := fill(tmp); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	old := ""
	if _, serr := os.Lstat(dir); serr == nil {
		old = filepath.Join(parent, "."+base+oldSuffix)
		if err := os.RemoveAll(old); err != nil {
			return err
		}
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			if rerr := os.Rename(old, dir); rerr != nil {
				return fmt.Errorf("%w (and restoring the previous %s: %v; it is in %s)", err, base, rerr, old)
			}
		}
		return err
	}
	if old != "" {
		if err := os.RemoveAll(old); err != nil {
			return err
		}
	}
	return syncDir(parent)
}

// MovedAside reports whether entry, a name in some directory, is a
// directory ReplaceDir moved aside and never put back, and if so the name
// it belongs under.
func MovedAside(entry string) (string, bool) {
	if !strings.HasPrefix(entry, ".") {
		return "", false
	}
	name, ok := strings.CutSuffix(entry[1:], oldSuffix)
	return name, ok && name != ""
}

// IsTemp reports whether entry is a name ReplaceDir writes under: a
// temporary or moved-aside directory.
func IsTemp(entry string) bool {
	if _, ok := MovedAside(entry); ok {
		return true
	}
	return strings.HasPrefix(entry, ".") && strings.Contains(entry, tmpInfix)
}

// Recover cleans up after interrupted ReplaceDir calls in parent: a
// moved-aside directory whose destination is missing is put back, one
// whose destination exists is removed, and temporary directories are
// removed. It reports whether it changed anything.
func Recover(parent string) (bool, error) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return false, err
	}
	changed := false
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if name, ok := MovedAside(n); ok {
			changed = true
			dst := filepath.Join(parent, name)
			if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, os.Rename(filepath.Join(parent, n), dst))
			} else {
				errs = append(errs, os.RemoveAll(filepath.Join(parent, n)))
			}
			continue
		}
		if IsTemp(n) {
			changed = true
			errs = append(errs, os.RemoveAll(filepath.Join(parent, n)))
		}
	}
	return changed, errors.Join(errs...)
}

// syncDir flushes a directory's entries to disk, where the platform allows it.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
