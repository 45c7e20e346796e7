package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kiln init writes a starter that kiln run reads, with the model's
// signature in comments, and refuses to overwrite without --force.
func TestInitStarter(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "pipeline.yaml")
	if _, errOut, code := run(t, "init", tinynetPath, "-o", out); code != 0 {
		t.Fatalf("kiln init = exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"schemaVersion: 1", "#   images  float32  [N,3,32,32]", "#   probs  float32  [N,10]", "# calibration:"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("starter lacks %q:\n%s", want, b)
		}
	}
	p, err := readPipeline(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.requireRun(); err != nil {
		t.Fatal(err)
	}
	if abs, _ := filepath.Abs(tinynetPath); p.Source != abs {
		t.Errorf("source = %s, want %s", p.Source, abs)
	}
	if _, errOut, code := run(t, "init", tinynetPath, "-o", out); code != ExitUsage || !strings.Contains(errOut, "--force") {
		t.Errorf("init over a file = exit %d: %s", code, errOut)
	}
	if _, errOut, code := run(t, "init", tinynetPath, "-o", out, "--force"); code != 0 {
		t.Errorf("init --force = exit %d: %s", code, errOut)
	}
}
