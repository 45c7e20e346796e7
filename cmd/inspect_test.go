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
