package convert

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

// A non-empty directory that is not a kiln repository is refused before
// anything is written.
func TestRunRefusesForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), Config{Source: tinynet, Repo: dir, Variants: variants(t, "onnx-fp32")})
	var re *RepoError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "not a kiln repository") {
		t.Fatalf("Run into a foreign directory = %v, want a *RepoError saying it is not a kiln repository", err)
	}
	if names := dirNames(t, dir); len(names) != 1 {
		t.Errorf("foreign directory now holds %v, want only notes.txt", names)
	}
}

// A run whose every variant fails leaves no repository behind (here: its
// one variant misses an impossible threshold).
func TestRunBuildingNothingLeavesNothing(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "repo")
	cfg := Config{Source: tinynet, Repo: repo, FP16: fp16.Options{KeepIOTypes: true}, Variants: variants(t, "onnx-fp16"),
		Check: CheckConfig{Thresholds: []check.Override{{Metric: "atol", Value: 1e-12}, {Metric: "rtol", Value: 1e-12}}}}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ce *CheckError
	if len(res.Failed()) != 1 || !errors.As(res.Failed()[0].Err, &ce) {
		t.Fatalf("rows = %+v, want the fp16 variant failed its check", res.Rows)
	}
	if _, err := os.Stat(repo); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a run that built nothing left %s behind (%v)", repo, err)
	}
}

// Two source models in one repository keep a source record each.
func TestRunKeepsEverySource(t *testing.T) {
	repo := t.TempDir()
	other := filepath.Join(t.TempDir(), "other.onnx")
	m, err := onnx.Load(tinynet)
	if err != nil {
		t.Fatal(err)
	}
	doc := "another model"
	m.Proto.DocString = &doc
	if err := m.Save(other); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{tinynet, other} {
		if _, err := Run(context.Background(), Config{Source: src, Repo: repo, Variants: variants(t, "onnx-fp32")}); err != nil {
			t.Fatal(err)
		}
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Sources) != 2 || man.SourceNamed("tinynet") == nil || man.SourceNamed("other") == nil || man.Source != nil {
		t.Fatalf("sources = %+v (top-level %+v), want tinynet and other", man.Sources, man.Source)
	}
	for _, name := range []string{"tinynet", "other"} {
		if rec := man.Model(name + "_onnx_fp32"); rec == nil || rec.Source != man.SourceNamed(name).Digest {
			t.Errorf("model %s_onnx_fp32 = %+v, want its own source's digest", name, rec)
		}
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
