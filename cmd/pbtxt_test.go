package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPbtxtGenLintRoundTrip(t *testing.T) {
	repo := t.TempDir()
	model := filepath.Join("..", "testdata", "tinynet.onnx")
	out, errOut, code := run(t, "pbtxt", "gen", model, "--max-batch", "16", "--labels", filepath.Join("..", "testdata", "tinynet_labels.txt"), "--repo", repo)
	if code != 0 {
		t.Fatalf("pbtxt gen --repo = exit %d: %s", code, errOut)
	}
	cfg, err := os.ReadFile(filepath.Join(repo, "tinynet", "config.pbtxt"))
	if err != nil {
		t.Fatalf("gen --repo wrote no config: %v (stdout %q)", err, out)
	}
	for _, want := range []string{`name: "tinynet"`, `platform: "onnxruntime_onnx"`, "max_batch_size: 16", `label_filename: "tinynet_labels.txt"`, "dynamic_batching"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("generated config lacks %q:\n%s", want, cfg)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, "tinynet", "1", "model.onnx")); err != nil {
		t.Errorf("gen --repo did not place the model: %v", err)
	}
	if _, errOut, code := run(t, "pbtxt", "lint", repo); code != 0 {
		t.Errorf("lint of a generated repository = exit %d: %s", code, errOut)
	}
	// fmt --check on the generated file finds nothing to change.
	if _, errOut, code := run(t, "pbtxt", "fmt", "--check", filepath.Join(repo, "tinynet", "config.pbtxt")); code != 0 {
		t.Errorf("fmt --check on a generated config = exit %d: %s", code, errOut)
	}
}

func TestPbtxtLintInvalid(t *testing.T) {
	bad := relCorpus(t, "triton-configs", "model_navigator", "invalid_config.pbtxt")
	out, _, code := run(t, "pbtxt", "lint", "--format", "json", bad)
	if code != ExitCheck {
		t.Fatalf("lint invalid_config.pbtxt = exit %d, want %d", code, ExitCheck)
	}
	if !json.Valid([]byte(out)) || !strings.Contains(out, "input[0].dims") {
		t.Errorf("lint --format json = %s, want JSON naming input[0].dims", out)
	}
}

func TestPbtxtFmtCheck(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.pbtxt")
	os.WriteFile(p, []byte("name:\"m\" platform:\"onnxruntime_onnx\" max_batch_size:0 input{name:\"x\" data_type:TYPE_FP32 dims:[1]}\n"), 0o644)
	_, _, code := run(t, "pbtxt", "fmt", "--check", p)
	if code != ExitCheck {
		t.Errorf("fmt --check on an unformatted file = exit %d, want %d", code, ExitCheck)
	}
	if _, errOut, code := run(t, "pbtxt", "fmt", p); code != 0 {
		t.Fatalf("fmt = exit %d: %s", code, errOut)
	}
	if _, _, code := run(t, "pbtxt", "fmt", "--check", p); code != 0 {
		t.Errorf("fmt --check after fmt = exit %d, want 0", code)
	}
	os.WriteFile(p, []byte("name: \"m\"\ninput [ { name: \"x\" data_tipe: TYPE_FP32 } ]\n"), 0o644)
	_, errOut, code := run(t, "pbtxt", "fmt", p)
	if code == 0 || !strings.Contains(errOut, "2:") {
		t.Errorf("fmt on a syntax error = exit %d, %q; want an error with line 2", code, errOut)
	}
}
