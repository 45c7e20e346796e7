//go:build !unix

package ort

import (
	"errors"
	"os"
)

func redirectStderr() (orig, w, r *os.File, err error) {
	return nil, nil, nil, errors.New("routing ONNX Runtime's log needs a Unix system")
}

func restoreStderr(*os.File) error { return errors.New("not supported") }
