// Command gen writes the models kiln ships under testdata/ (run through
// `go generate ./...` or `make generate`), or with -images DIR synthetic
// images for calibration runs (scripts/gpu-check.sh uses them).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

func main() {
	out := flag.String("o", "testdata", "output directory")
	images := flag.String("images", "", "instead of the models, write synthetic PNG images to this directory")
	n := flag.Int("n", 64, "with -images: how many")
	size := flag.Int("size", 32, "with -images: width and height")
	flag.Parse()
	if *images != "" {
		if err := testmodels.WriteImages(*images, *n, *size, *size, 1); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		return
	}
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
	return atomicfile.WriteFile(filepath.Join(dir, "tinynet_labels.txt"), []byte(labels), 0o644)
}
