package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// run executes the command line in-process and returns stdout, stderr and the exit code.
func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Execute(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

func relCorpus(t *testing.T, elem ...string) string {
	t.Helper()
	abs := testutil.Corpus(t, elem...)
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, abs)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func TestInspectGolden(t *testing.T) {
	cases := map[string]string{
		"resnet50":    relCorpus(t, "models", "onnx-light", "light_resnet50.onnx"),
		"qlinearconv": relCorpus(t, "onnx-node", "test_qlinearconv", "model.onnx"),
		"tinynet":     filepath.Join("..", "testdata", "tinynet.onnx"),
	}
	for name, path := range cases {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := run(t, "inspect", "--format", "json", path)
			if code != 0 {
				t.Fatalf("kiln inspect %s = exit %d: %s", path, code, errOut)
			}
			testutil.Golden(t, "json", []byte(out))
		})
	}
}

// Every ONNX file in the corpus inspects without error, in both formats.
func TestInspectCorpus(t *testing.T) {
	root := testutil.Corpus(t)
	var n int
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".onnx") {
			return err
		}
		n++
		for _, format := range []string{"text", "json"} {
			out, errOut, code := run(t, "inspect", "--format", format, p)
			if code != 0 {
				t.Errorf("kiln inspect --format %s %s = exit %d: %s", format, p, code, errOut)
			}
			if format == "json" && !json.Valid([]byte(out)) {
				t.Errorf("kiln inspect --format json %s printed invalid JSON", p)
			}
		}
		return nil
	})
	if n < 70 {
		t.Errorf("inspected %d corpus models, want at least 70", n)
	}
}

func TestInspectErrors(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile(filepath.Join("..", "testdata", "tinynet.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	trunc := filepath.Join(dir, "trunc.onnx")
	os.WriteFile(trunc, good[:len(good)/3], 0o644)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", trunc}, 1, "trunc.onnx"},
		{[]string{"inspect", filepath.Join(dir, "missing.onnx")}, 1, "missing.onnx"},
		{[]string{"inspect", dir}, 1, "is a directory"},
		{[]string{"inspect"}, 2, "requires at least 1 arg"},
		{[]string{"inspect", "--format", "yaml", trunc}, 2, `invalid argument "yaml" for "--format" flag: want one of text, json`},
		{[]string{"inspect", "--bogus"}, 2, "unknown flag"},
		{[]string{"inspect", "--run", "--ort-lib", filepath.Join(dir, "nope.so"), filepath.Join("..", "testdata", "tinynet.onnx")}, 1, "make deps"},
	}
	for _, c := range cases {
		_, errOut, code := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("kiln %v = exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errOut, c.code, c.want)
		}
		if strings.Contains(errOut, "panic") {
			t.Errorf("kiln %v panicked: %s", c.args, errOut)
		}
	}
}

func TestInspectRun(t *testing.T) {
	out, errOut, code := run(t, "inspect", "--run", "--batch", "3", "--iterations", "2", "--format", "json", filepath.Join("..", "testdata", "tinynet.onnx"))
	if code != 0 {
		t.Fatalf("inspect --run = exit %d: %s", code, errOut)
	}
	var got struct {
		Run struct {
			Batch   int
			Outputs []struct {
				Name   string
				Shape  []int64
				Finite bool
				Mean   float64
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	o := got.Run.Outputs
	// Softmax over 10 classes: each row sums to 1, so the mean is 0.1.
	if len(o) != 1 || o[0].Name != "probs" || len(o[0].Shape) != 2 || o[0].Shape[0] != 3 || !o[0].Finite || o[0].Mean < 0.0999 || o[0].Mean > 0.1001 {
		t.Errorf("inspect --run outputs = %+v, want probs [3 10] finite with mean 0.1", o)
	}
}

// inspect --run feeds inputs by name and shape: a detector with dynamic
// spatial dimensions is refused without --shape (a 1x1 image would time
// nothing), and Silero gets its sample rate and state by name.
func TestInspectRunShapes(t *testing.T) {
	det := testutil.NPMModel(t, "ch_PP-OCRv4_det_infer.onnx")
	if _, errOut, code := run(t, "inspect", "--run", det); code == 0 || !strings.Contains(errOut, "--shape x=") {
		t.Errorf("inspect --run of a detector without --shape = exit %d (%s), want an error asking for --shape x=...", code, errOut)
	}
	out, errOut, code := run(t, "inspect", "--run", "--iterations", "1", "--shape", "x=1x3x320x320", "--format", "json", det)
	if code != 0 || !strings.Contains(out, `"shape": [
          1,
          1,
          320,
          320
        ]`) {
		t.Errorf("inspect --run --shape x=1x3x320x320 = exit %d (%s)\n%s\nwant the output map [1,1,320,320]", code, errOut, out)
	}
	vad := testutil.NPMModel(t, "silero_vad_v5.onnx")
	if out, errOut, code := run(t, "inspect", "--run", "--input", "sr=16000", "--shape", "input=1x512", "--shape", "state=2x1x128", vad); code != 0 || !strings.Contains(out, "stateN float32 [2 1 128]") {
		t.Errorf("inspect --run of Silero by name = exit %d (%s)\n%s", code, errOut, out)
	}
}
