// Command gen writes the models kiln ships under testdata/ (run through
// `go generate ./...` or `make generate`).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

func main() {
	out := flag.String("o", "testdata", "output directory")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m := &onnx.Model{Proto: testmodels.TinyNet(1)}
	if err := m.Save(filepath.Join(dir, "tinynet.onnx")); err != nil {
		return err
	}
	labels := strings.Join(testmodels.TinyNetLabels, "\n") + "\n"
	return onnx.WriteFileAtomic(filepath.Join(dir, "tinynet_labels.txt"), []byte(labels), 0o644)
}
