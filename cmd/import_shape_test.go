package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

// tf1-regression-tf2onnx's X is unranked and its graph elementwise, so
// nothing can infer a rank: --shape X=-1 gives one. kiln import takes it,
// convert applies it to the import and writes a repository whose kiln.json
// records the shape as given (pred's as inferred), and serve checks it on
// random data of --shape X=16.
func TestUnrankedSavedModelShape(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	src := testutil.Corpus(t, "savedmodel", "real", "tf1-regression-tf2onnx")
	out := filepath.Join(t.TempDir(), "reg.onnx")
	stdout, stderr, code := run(t, "import", src, "-o", out, "--shape", "X=-1", "--format", "json")
	if code != 0 {
		t.Fatalf("import --shape X=-1 = exit %d: %s", code, stderr)
	}
	var r importResult
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if in, o := r.Inputs[0], r.Outputs[0]; !slices.Equal(in.Shape, []int64{-1}) || in.ShapeFrom != "given" || !slices.Equal(o.Shape, []int64{-1}) || o.ShapeFrom != "inferred" {
		t.Errorf("import --shape X=-1: input %+v output %+v", in, o)
	}

	repo := filepath.Join(t.TempDir(), "repo")
	if stdout, stderr, code := run(t, "convert", src, "--repo", repo, "--shape", "X=-1", "--precision", "fp32,fp16", "--progress", "none"); code != 0 {
		t.Fatalf("convert --shape X=-1 = exit %d\n%s\n%s", code, stdout, stderr)
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	imp := man.Sources[0].Imported
	if imp == nil || !slices.Equal(imp.Inputs[0].Shape, []int64{-1}) || imp.Inputs[0].ShapeFrom != "given" || imp.Outputs[0].ShapeFrom != "inferred" {
		t.Errorf("kiln.json import record %+v, want X [-1] given, pred inferred", imp)
	}
	cfg, err := os.ReadFile(filepath.Join(repo, "tf1-regression-tf2onnx_onnx_fp32", "config.pbtxt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `name: "X"`) {
		t.Errorf("config.pbtxt has no input X:\n%s", cfg)
	}
	if stdout, stderr, code := run(t, "serve", repo, "--shape", "X=16", "--perf=false"); code != 0 {
		t.Errorf("serve --shape X=16 = exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// Without a shape, every command that makes random inputs for the
// unranked X says so, naming X and --shape.
func TestUnrankedRandomInputs(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	src := testutil.Corpus(t, "savedmodel", "real", "tf1-regression-tf2onnx")
	onnxFile := filepath.Join(t.TempDir(), "reg.onnx")
	if _, stderr, code := run(t, "import", src, "-o", onnxFile); code != 0 {
		t.Fatalf("import = exit %d: %s", code, stderr)
	}
	repo := filepath.Join(t.TempDir(), "repo")
	for _, args := range [][]string{
		{"inspect", "--run", src},
		{"inspect", "--run", onnxFile},
		{"convert", src, "--repo", repo, "--precision", "fp32", "--progress", "none"},
		{"serve", onnxFile, "--reference", onnxFile, "--precision", "fp32", "--perf=false"},
	} {
		_, stderr, code := run(t, args...)
		if code == 0 {
			t.Errorf("%v succeeded", args)
		}
		for _, w := range []string{`input "X" has no known rank`, "--shape X=DIMS"} {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr %q does not mention %q", args, stderr, w)
			}
		}
	}
}

// A pipeline file gives the unranked input its shape as --shape does:
// kiln run imports, converts and serves tf1-regression.
func TestRunUnrankedSavedModelShapes(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	src := testutil.Corpus(t, "savedmodel", "real", "tf1-regression-tf2onnx")
	dir := t.TempDir()
	file := filepath.Join(dir, "pipeline.yaml")
	text := "schemaVersion: 1\nsource: " + src + "\nshapes: [X=-1]\nvariants: [onnx-fp32, onnx-fp16]\nchecks: {perf: false}\nrepository: repo\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	stages := runStagesOf(t, "-f", file)
	if stages["import"] != "ran" || stages["convert"] != "ran" || stages["serve"] != "ran" {
		t.Fatalf("kiln run on tf1-regression with shapes: [X=-1] = %v", stages)
	}
	man, err := manifest.Read(filepath.Join(dir, "repo"))
	if err != nil {
		t.Fatal(err)
	}
	if imp := man.Sources[0].Imported; imp == nil || !slices.Equal(imp.Inputs[0].Shape, []int64{-1}) || imp.Inputs[0].ShapeFrom != "given" {
		t.Errorf("kiln.json import record %+v, want X [-1] given", imp)
	}
	for _, m := range man.Models {
		var rec struct{ Verdict, By string }
		if err := json.Unmarshal(m.Checks, &rec); err != nil || m.Status != manifest.StatusOK || rec.Verdict != "pass" || rec.By != "serve" {
			t.Errorf("model %s: status %s, check %+v (%v); want ok and a passing serve verdict", m.Name, m.Status, rec, err)
		}
	}
}
