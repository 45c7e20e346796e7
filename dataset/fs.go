package dataset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// FS is the storage a dataset is read from. Names are the strings a user
// types: local paths, or gs://bucket/object for a GCS backend.
//
// A GCS backend implements Open with an object reader, List with an object
// listing under dir+"/", and RangeFS with range readers and object sizes; it
// hands local names to Local so one FS serves both.
type FS interface {
	// Open opens a file for reading.
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// List returns the names of all files below dir, recursively, in any
	// order; the names can be passed to Open. If dir names a file, List
	// returns just that name.
	List(ctx context.Context, dir string) ([]string, error)
}

// RangeFS is an FS that reads part of a file without reading what comes
// before it. Sources use it to fetch one TFRecord record or one row of a
// large .npy file; without it they read from the start of the file.
type RangeFS interface {
	FS
	// OpenRange opens length bytes of name starting at offset; a negative
	// length reads to the end.
	OpenRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error)
	// Size returns the size of name in bytes.
	Size(ctx context.Context, name string) (int64, error)
}

// ErrNeedGCS is returned for a gs:// dataset when no FS that reads GCS was given.
var ErrNeedGCS = errors.New("gs:// sources need the GCS backend")

// Local reads the local file system. It refuses gs:// names with ErrNeedGCS.
type Local struct{}

var _ RangeFS = Local{}

func checkLocal(name string) error {
	if isGCS(name) {
		return fmt.Errorf("%s: %w", name, ErrNeedGCS)
	}
	return nil
}

func isGCS(name string) bool { return strings.HasPrefix(name, "gs://") }

// Open opens a local file.
func (Local) Open(_ context.Context, name string) (io.ReadCloser, error) {
	if err := checkLocal(name); err != nil {
		return nil, err
	}
	return os.Open(name)
}

// OpenRange opens part of a local file.
func (Local) OpenRange(_ context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if err := checkLocal(name); err != nil {
		return nil, err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	if length < 0 {
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, offset, length), f}, nil
}

// Size returns the size of a local file.
func (Local) Size(_ context.Context, name string) (int64, error) {
	if err := checkLocal(name); err != nil {
		return 0, err
	}
	st, err := os.Stat(name)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// List walks a local directory. Hidden files and directories (".*") are skipped.
func (Local) List(_ context.Context, dir string) ([]string, error) {
	if err := checkLocal(dir); err != nil {
		return nil, err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{dir}, nil
	}
	var out []string
	// The trailing separator makes WalkDir follow a root that is a symlink.
	root := strings.TrimSuffix(dir, string(filepath.Separator)) + string(filepath.Separator)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		regular := d.Type().IsRegular()
		if d.Type()&fs.ModeSymlink != 0 { // a linked file counts; a linked directory is not walked
			st, err := os.Stat(p)
			regular = err == nil && st.Mode().IsRegular()
		}
		if regular {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// listSorted lists dir and sorts the names, so that indices (and the samples
// Select picks) do not depend on the order storage returns them in.
func listSorted(ctx context.Context, fsys FS, dir string) ([]string, error) {
	names, err := fsys.List(ctx, dir)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

// openRange reads [offset, offset+length) of name, with a range read when
// fsys supports it and by skipping otherwise.
func openRange(ctx context.Context, fsys FS, name string, offset, length int64) (io.ReadCloser, error) {
	if r, ok := fsys.(RangeFS); ok {
		return r.OpenRange(ctx, name, offset, length)
	}
	rc, err := fsys.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, rc, offset); err != nil {
		rc.Close()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	var r io.Reader = rc
	if length >= 0 {
		r = io.LimitReader(rc, length)
	}
	return struct {
		io.Reader
		io.Closer
	}{r, rc}, nil
}

// readerAt gives random access to a whole file (for ZIP archives): the file
// itself for Local, range reads for another RangeFS, otherwise the file read
// into memory. The caller calls close when done.
func readerAt(ctx context.Context, fsys FS, name string) (ra io.ReaderAt, size int64, close func() error, err error) {
	if _, ok := fsys.(Local); ok {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, nil, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, nil, err
		}
		return f, st.Size(), f.Close, nil
	}
	if r, ok := fsys.(RangeFS); ok {
		size, err := r.Size(ctx, name)
		if err != nil {
			return nil, 0, nil, err
		}
		return rangeReaderAt{ctx, r, name}, size, func() error { return nil }, nil
	}
	b, err := readAll(ctx, fsys, name)
	if err != nil {
		return nil, 0, nil, err
	}
	return bytes.NewReader(b), int64(len(b)), func() error { return nil }, nil
}

// rangeReaderAt adapts a RangeFS file to io.ReaderAt. It holds the context of
// the one call that created it and does not outlive that call.
type rangeReaderAt struct {
	ctx  context.Context
	fsys RangeFS
	name string
}

func (r rangeReaderAt) ReadAt(p []byte, off int64) (int, error) {
	rc, err := r.fsys.OpenRange(r.ctx, r.name, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, p)
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	return n, err
}

// readAll reads a whole file.
func readAll(ctx context.Context, fsys FS, name string) ([]byte, error) {
	rc, err := fsys.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}
