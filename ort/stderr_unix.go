//go:build unix

package ort

import (
	"os"

	"golang.org/x/sys/unix"
)

// redirectStderr puts a pipe on descriptor 2 and returns a file for the
// original stderr, the pipe's write end (now also descriptor 2) and its
// read end.
func redirectStderr() (orig, w, r *os.File, err error) {
	fd, err := unix.Dup(2)
	if err != nil {
		return nil, nil, nil, err
	}
	orig = os.NewFile(uintptr(fd), "/dev/stderr")
	r, w, err = os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := unix.Dup2(int(w.Fd()), 2); err != nil {
		return nil, nil, nil, err
	}
	return orig, w, r, nil
}

// restoreStderr puts orig back on descriptor 2.
func restoreStderr(orig *os.File) error { return unix.Dup2(int(orig.Fd()), 2) }
