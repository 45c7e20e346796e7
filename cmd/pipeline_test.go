package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// The committed JSON Schema is the one the pipeline types generate
// (go test ./cmd -run TestPipelineSchema -update rewrites it).
func TestPipelineSchema(t *testing.T) {
	b, err := pipelineSchema()
	if err != nil {
		t.Fatal(err)
	}
	testutil.GoldenFile(t, filepath.Join("..", "testdata", "pipeline.schema.json"), b)
}

// The example pipeline reads, and is complete enough for kiln run.
func TestPipelineExample(t *testing.T) {
	p, err := readPipeline(filepath.Join("..", "testdata", "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.requireRun(); err != nil {
		t.Fatal(err)
	}
	if len(p.Destinations) != 2 || p.Calibration == nil || len(p.Variants) != 3 {
		t.Errorf("example pipeline = %+v", p)
	}
}

// A typo'd field, a missing source, int8 without calibration data and bad
// values fail when the file is read, naming its line and field.
func TestPipelineErrorsNameTheLine(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"schemaVersion: 1\nsource: m.onnx\nrepository: r\nvariantz: []\n", `:4: "variantz" is not a setting`},
		{"schemaVersion: 1\nsource: m.onnx\ncalibration:\n  data: d\n  preproces: imagenet\n", `:5: calibration."preproces" is not a setting`},
		{"schemaVersion: 1\nrepository: r\n", `:1: source: is missing`},
		{"schemaVersion: 1\nsource: m.onnx\nrepository: r\nvariants:\n  - onnx-fp32\n  - onnx-int8\n", `:6: variants[1]: onnx-int8 needs calibration data`},
		{"schemaVersion: 1\nsource: m.onnx\nrepository: r\nvariants:\n  - {runtime: onnx, precison: fp16}\n", `:5: variants[0]."precison" is not a setting`},
		{"schemaVersion: 2\nsource: m.onnx\n", `:1: schemaVersion: 2: this kiln reads schemaVersion 1`},
		{"schemaVersion: 1\nsource: m.onnx\nrepository: r\ndestinations:\n  - ftp:x\n", `:5: destinations[0]:`},
		{"schemaVersion: 1\nsource: m.onnx\nchecks:\n  window: soon\n", `:4: checks.window:`},
		{"schemaVersion: 1\nsource: m.onnx\nchecks:\n  thresholds: [cosin=0.9]\n", `:4: checks.thresholds[0]:`},
		{"schemaVersion: 1\nsource: m.onnx\nversion: x\n", `:3: version: cannot unmarshal`},
		{"schemaVersion: 1\nsource: m.onnx\nsource: n.onnx\n", `:3: "source" is given twice`},
		{"source: m.onnx\nrepository: r\n", `:1: schemaVersion: 1 is missing`},
		{"schemaVersion: 1\nsource: m.onnx\ntarget:\n  gpu_types: [nvidia-l4, nvidia-k80]\n", `:4: target.gpu_types[1]:`},
		{"schemaVersion: 1\nsource: m.onnx\nplan:\n  cache: /tmp/cache\n", `:4: plan.cache: "/tmp/cache": want gs://BUCKET/PREFIX`},
		{"schemaVersion: 1\nsource: m.onnx\nplan:\n  imag: reg/kiln:1\n", `:4: plan."imag" is not a setting`},
		{"schemaVersion: 1\nsource: m\nshapes:\n  - X=16\n  - X=abc\n", `:5: shapes[1]:`},
		{"schemaVersion: 1\nsource: m\nshapes: [X=16, X=8]\n", `:3: shapes: --shape: input "X" is given twice`},
	} {
		path := filepath.Join(t.TempDir(), "pipeline.yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := readPipeline(path)
		if err == nil {
			err = p.requireRun()
		}
		if err == nil || !strings.Contains(err.Error(), path+tc.want) {
			t.Errorf("pipeline\n%s= %v; want %q", tc.file, err, path+tc.want)
		}
	}
}
