package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
)

// FuzzParseSize: sizes never panic the parser, and an accepted size is
// written back by formatSize and read again unchanged.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0", "512MiB", "4GiB", "1.5GiB", "100B", "4GB", "1e3KiB", "-1MiB", "9223372036854775807B", "0x10MiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("parseSize(%q) = %d, a negative size", s, n)
		}
		if back, err := parseSize(formatSize(n)); err != nil || back != n {
			t.Fatalf("parseSize(%q) = %d, but formatSize gives %q, which reads back as %d, %v", s, n, formatSize(n), back, err)
		}
	})
}

// FuzzPipeline: a pipeline file never panics the reader, every error names
// the file, and every variant it accepts is valid and survives its ID.
func FuzzPipeline(f *testing.F) {
	for _, s := range []string{
		"model: x.onnx\nrepository: r\nvariants:\n  - onnx-fp32\n  - {runtime: onnx, precision: fp16, max_batch: 4}\n",
		"variants:\n  - {runtime: trt, precision: int8, instances: 2, target: sm86}\n",
		"target: {gpu_types: [nvidia-l4, x]}\nplan: {cache: gs://b/c, image: i}\n", "variants: [onnx-fp33]\n", "calibrate: {}\n", "- a\n", "", "model: [1]\n", "variants:\n  - {runtime: [x]}\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "pipeline.yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := readPipeline(path)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("readPipeline error %q does not name the file", err)
			}
			return
		}
		for _, v := range p.variants() {
			if err := v.Validate(); err != nil {
				t.Fatalf("readPipeline accepted variant %+v: %v", v, err)
			}
			if back, err := manifest.ParseVariant(v.ID()); err != nil || back != v {
				t.Fatalf("variant %+v has ID %q, which reads back as %+v, %v", v, v.ID(), back, err)
			}
		}
	})
}
