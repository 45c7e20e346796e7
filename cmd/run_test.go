package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// writeRunPipeline writes a pipeline for tinynet (fp32 and fp16, no
// calibration) into a temporary directory and points the user cache there.
func writeRunPipeline(t *testing.T, extra string) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	src, err := filepath.Abs(tinynetPath)
	if err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(dir, "pipeline.yaml")
	text := fmt.Sprintf(`schemaVersion: 1
source: %s
variants: [onnx-fp32, onnx-fp16]
checks: {perf: false}
repository: repo
base: scratch
destinations: [dir:published, oci-layout:oci]
%s`, src, extra)
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

// runStagesOf runs kiln run with --format json and returns stage → status.
func runStagesOf(t *testing.T, args ...string) map[string]string {
	t.Helper()
	out, errOut, code := run(t, append([]string{"run", "--format", "json", "--progress", "none"}, args...)...)
	if code != 0 {
		t.Fatalf("kiln run %v = exit %d: %s", args, code, errOut)
	}
	var res struct{ Stages []runRow }
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := map[string]string{}
	for _, r := range res.Stages {
		got[r.Stage] = r.Status
	}
	return got
}

// A rerun with nothing changed does no stage work; a changed check
// setting runs serve again, and a new destination is published alone.
func TestRunSkipsUnchangedStages(t *testing.T) {
	dir, file := writeRunPipeline(t, "")
	first := runStagesOf(t, "-f", file)
	if first["convert"] != "ran" || first["serve"] != "ran" || first["pack"] != "ran" {
		t.Fatalf("first run = %v", first)
	}
	for _, p := range []string{"repo/kiln.json", "repo-report/report.html", "published/kiln.json", "oci/index.json"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("after kiln run: %v", err)
		}
	}
	second := runStagesOf(t, "-f", file)
	for _, s := range runStages {
		if second[s] != "skipped" {
			t.Errorf("rerun: %s %s, want skipped (%v)", s, second[s], second)
		}
	}
	third := runStagesOf(t, "-f", file, "--to", "dir:"+filepath.Join(dir, "published"), "--to", "dir:"+filepath.Join(dir, "more"))
	if third["serve"] != "skipped" || third["pack"] != "ran" {
		t.Errorf("with a new destination: %v", third)
	}
	if _, err := os.Stat(filepath.Join(dir, "more", "kiln.json")); err != nil {
		t.Error(err)
	}
}

// A SavedModel source is imported once: a rerun with its files unchanged
// does no stage work, import included; changed variables import again
// and rebuild the variants.
func TestRunSavedModelSkipsImport(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	sm := filepath.Join(dir, "chain")
	if _, err := smtest.MatMulChain(sm, 64, 2, 1); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "pipeline.yaml")
	text := "schemaVersion: 1\nsource: chain\nvariants: [onnx-fp32, onnx-fp16]\nchecks: {perf: false}\nrepository: repo\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if first := runStagesOf(t, "-f", file); first["import"] != "ran" || first["convert"] != "ran" {
		t.Fatalf("first run = %v", first)
	}
	second := runStagesOf(t, "-f", file)
	for _, s := range runStages {
		if second[s] != "skipped" {
			t.Errorf("rerun: %s %s, want skipped (%v)", s, second[s], second)
		}
	}
	man, err := manifest.Read(filepath.Join(dir, "repo"))
	if err != nil || len(man.Sources) != 1 || man.Sources[0].Imported == nil || man.Sources[0].Imported.Signature != "serving_default" {
		t.Fatalf("kiln.json after the rerun: %v, sources %+v; want the import record", err, man.Sources)
	}
	// A new modification time, the same bytes: hashed again, the same key.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(sm, "saved_model.pb"), later, later); err != nil {
		t.Fatal(err)
	}
	if touched := runStagesOf(t, "-f", file); touched["import"] != "skipped" {
		t.Errorf("after touching saved_model.pb: %v, want import skipped (its content is unchanged)", touched)
	}
	if _, err := smtest.MatMulChain(sm, 64, 2, 2); err != nil { // other weights, same names and sizes
		t.Fatal(err)
	}
	if third := runStagesOf(t, "-f", file); third["import"] != "ran" || third["convert"] != "ran" {
		t.Errorf("after the variables changed = %v, want import and convert to run", third)
	}
}

// --until stops after a stage; --only runs one on what the others left.
func TestRunUntilOnly(t *testing.T) {
	dir, file := writeRunPipeline(t, "")
	got := runStagesOf(t, "-f", file, "--until", "convert")
	if _, ok := got["serve"]; ok || got["convert"] != "ran" {
		t.Errorf("--until convert = %v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "repo-report")); err == nil {
		t.Error("--until convert ran serve")
	}
	got = runStagesOf(t, "-f", file, "--only", "serve")
	if got["serve"] != "ran" || got["convert"] != "" || got["pack"] != "" {
		t.Errorf("--only serve = %v", got)
	}
	got = runStagesOf(t, "-f", file, "--only", "pack")
	if got["pack"] != "ran" {
		t.Errorf("--only pack = %v", got)
	}
}

// A bad pipeline fails with exit 2 before any work, naming the line; a
// flag and KILN_REPO override the file's repository.
func TestRunRefusesBeforeWork(t *testing.T) {
	dir, file := writeRunPipeline(t, "calibration: {data: imgs, preproces: imagenet}\n")
	_, errOut, code := run(t, "run", "-f", file)
	if code != ExitUsage || !strings.Contains(errOut, "pipeline.yaml:8: calibration.\"preproces\"") {
		t.Errorf("typo = exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "repo")); err == nil {
		t.Error("a refused pipeline wrote the repository")
	}
	_, file = writeRunPipeline(t, "")
	t.Setenv("KILN_REPO", filepath.Join(dir, "from-env"))
	runStagesOf(t, "-f", file, "--until", "convert")
	if _, err := os.Stat(filepath.Join(dir, "from-env", "kiln.json")); err != nil {
		t.Errorf("KILN_REPO: %v", err)
	}
	runStagesOf(t, "-f", file, "--until", "convert", "--repo", filepath.Join(dir, "from-flag"))
	if _, err := os.Stat(filepath.Join(dir, "from-flag", "kiln.json")); err != nil {
		t.Errorf("--repo over KILN_REPO: %v", err)
	}
}

// BenchmarkRunRerun times kiln run on a model with 100 MB of weights, an
// ONNX file (testmodels.Wide(100)) or a SavedModel (smtest.MatMulChain:
// six 2048×2048 kernels), then the rerun with nothing changed, side by
// side (BENCHMARKS.md, "kiln run: rerun"):
//
//	go test ./cmd -run '^$' -bench RunRerun -benchtime 1x
func BenchmarkRunRerun(b *testing.B) {
	b.Run("onnx", func(b *testing.B) {
		benchRerun(b, "wide.onnx", func(src string) error { return (&onnx.Model{Proto: testmodels.Wide(100, 1)}).Save(src) })
	})
	b.Run("savedmodel", func(b *testing.B) {
		benchRerun(b, "chain", func(src string) error { _, err := smtest.MatMulChain(src, 2048, 6, 1); return err })
	})
}

func benchRerun(b *testing.B, name string, write func(string) error) {
	dir := b.TempDir()
	b.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	if err := write(filepath.Join(dir, name)); err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(dir, "pipeline.yaml")
	text := "schemaVersion: 1\nsource: " + name + "\nvariants: [onnx-fp32, onnx-fp16]\nchecks: {window: 200ms}\n" +
		"repository: repo\nbase: scratch\ndestinations: [dir:published, oci-layout:oci]\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	var first, rerun, reimport time.Duration
	for range b.N {
		for _, p := range []string{"repo", "repo-report", "published", "oci", "cache"} {
			os.RemoveAll(filepath.Join(dir, p))
		}
		start := time.Now()
		runOnce(b, file)
		first += time.Since(start)
		start = time.Now()
		runOnce(b, file)
		rerun += time.Since(start)
		// The rerun as it was before imports were recorded: the SavedModel
		// imported again, every other stage skipped.
		os.RemoveAll(filepath.Join(dir, "cache", "kiln", "import", "keys"))
		start = time.Now()
		runOnce(b, file)
		reimport += time.Since(start)
	}
	b.ReportMetric(first.Seconds()/float64(b.N), "first-s")
	b.ReportMetric(rerun.Seconds()/float64(b.N), "rerun-s")
	b.ReportMetric(100*rerun.Seconds()/first.Seconds(), "rerun-%")
	if strings.HasSuffix(name, ".onnx") {
		return
	}
	b.ReportMetric(reimport.Seconds()/float64(b.N), "reimport-s")
	b.ReportMetric(100*rerun.Seconds()/reimport.Seconds(), "rerun/reimport-%")
}

func runOnce(b *testing.B, file string) {
	var out, errOut bytes.Buffer
	if code := Execute(context.Background(), []string{"run", "-f", file, "--progress", "none"}, &out, &errOut); code != 0 {
		b.Fatalf("kiln run = exit %d: %s", code, errOut.String())
	}
}
