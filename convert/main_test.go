package convert

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/ort"
)

// TestMain loads ONNX Runtime once: convert checks every ONNX variant it
// builds in it. As in internal/ortest, a missing library fails the tests
// (make test fetches it first).
func TestMain(m *testing.M) {
	lib, err := ort.FindLibrary("", os.Getenv("KILN_ORT_LIB"), filepath.Join("..", "."))
	if err == nil {
		err = ort.Init(lib)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ONNX Runtime library missing, run make deps:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
