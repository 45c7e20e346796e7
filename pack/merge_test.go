package pack

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
)

// renamed rewrites repo's one model as name (directory, record and
// config), with build as its build record, and returns repo.
func renamed(t *testing.T, repo, name string, build *manifest.Build) string {
	t.Helper()
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	m := man.Models[0]
	if err := os.Rename(filepath.Join(repo, m.Name), filepath.Join(repo, name)); err != nil {
		t.Fatal(err)
	}
	m.Name, m.Build = name, build
	setFile(t, repo, m, "config.pbtxt", "name: \""+name+"\"\nbackend: \"onnxruntime\"\n")
	man.Models = []*manifest.Model{m}
	writeTestManifest(t, repo, man)
	return repo
}

// setFile writes a file of model m and its record.
func setFile(t *testing.T, repo string, m *manifest.Model, rel, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(repo, m.Name, rel), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, f := range m.Files {
		if f.Path == rel {
			m.Files[i] = manifest.File{Path: rel, Size: int64(len(content)), Digest: manifest.DigestBytes([]byte(content))}
		}
	}
}

func writeTestManifest(t *testing.T, repo string, man *manifest.Manifest) {
	t.Helper()
	if err := writeManifest(repo, man); err != nil {
		t.Fatal(err)
	}
}

// Three repositories, one on the GCS emulator and two local, one of them
// holding the same model as the emulator's: the merge holds each model
// once with its own build record, one source record, every file checked,
// and reads back the same from a second merge into an existing target.
func TestMerge(t *testing.T) {
	ctx := context.Background()
	s := inProcessGCS(t)
	g := GCS{Client: s.client}
	fp32 := testRepo(t, manifest.RuntimeONNX, &manifest.Build{Tool: "kiln", GPU: "NVIDIA L4"}, passed())
	const cached = "gs://" + testBucket + "/cache/fp32"
	if _, err := Run(ctx, Config{Repo: fp32, To: []Destination{dest(t, cached)}}, WithGCS(g)); err != nil {
		t.Fatal(err)
	}
	fp16 := renamed(t, testRepo(t, manifest.RuntimeONNX, nil, passed()), "tinynet_onnx_fp16", &manifest.Build{Tool: "kiln", GPU: "NVIDIA RTX PRO 6000"})
	target := filepath.Join(t.TempDir(), "merged")
	srcs := []Destination{dest(t, cached), dest(t, "dir:"+fp16), dest(t, "dir:"+fp32)}
	digests, err := Merge(ctx, srcs, target, WithGCS(g))
	if err != nil {
		t.Fatal(err)
	}
	if len(digests) != 3 {
		t.Fatalf("Merge returned %d digests, want one per source", len(digests))
	}
	man, err := manifest.Read(target)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Models) != 2 || man.Models[0].Name != "tinynet_onnx_fp16" || man.Models[1].Name != "tinynet_onnx_fp32" {
		t.Fatalf("merged models = %+v, want fp16 and fp32", man.Models)
	}
	if man.Models[0].Build.GPU != "NVIDIA RTX PRO 6000" || man.Models[1].Build.GPU != "NVIDIA L4" || len(man.Models[1].Checks) == 0 {
		t.Errorf("merged records lost their provenance: %+v %+v", man.Models[0].Build, man.Models[1])
	}
	if len(man.Sources) != 1 || man.Published != nil {
		t.Errorf("merged sources %+v, published %+v; want one source and no publications", man.Sources, man.Published)
	}
	if err := verifyFiles(target, man); err != nil {
		t.Error(err)
	}
	entries, _ := os.ReadDir(target)
	if len(entries) != 3 {
		t.Errorf("merged repository holds %d entries, want two models and kiln.json", len(entries))
	}
	// Merging into the target itself adds to it.
	int8 := renamed(t, testRepo(t, manifest.RuntimeONNX, nil, passed()), "tinynet_onnx_int8", nil)
	if _, err := Merge(ctx, []Destination{dest(t, "dir:"+target), dest(t, "dir:"+int8)}, target); err != nil {
		t.Fatal(err)
	}
	if man, err = manifest.Read(target); err != nil || len(man.Models) != 3 {
		t.Fatalf("after merging into the target: %v, %d models", err, len(man.Models))
	}
}

// A model two sources hold with different bytes, or with a file only one
// has, is an error naming the model and the file, and the target is left
// as it was; a record without files gives way to one with files; two
// sources of one name with different digests are refused.
func TestMergeRefuses(t *testing.T) {
	ctx := context.Background()
	a := testRepo(t, manifest.RuntimeONNX, nil, passed())
	target := filepath.Join(t.TempDir(), "merged")
	if _, err := Merge(ctx, []Destination{dest(t, "dir:"+a)}, target); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(target, manifest.FileName))

	changed := testRepo(t, manifest.RuntimeONNX, nil, passed())
	man, _ := manifest.Read(changed)
	setFile(t, changed, man.Models[0], "config.pbtxt", "name: \"tinynet_onnx_fp32\"\nbackend: \"onnxruntime\"\nmax_batch_size: 8\n")
	writeTestManifest(t, changed, man)

	extra := testRepo(t, manifest.RuntimeONNX, nil, passed())
	man, _ = manifest.Read(extra)
	os.WriteFile(filepath.Join(extra, "tinynet_onnx_fp32", "labels.txt"), []byte("a\n"), 0o644)
	man.Models[0].Files = append(man.Models[0].Files, manifest.File{Path: "labels.txt", Size: 2, Digest: manifest.DigestBytes([]byte("a\n"))})
	writeTestManifest(t, extra, man)

	otherSource := testRepo(t, manifest.RuntimeONNX, nil, passed())
	man, _ = manifest.Read(otherSource)
	man.Sources[0].Digest = manifest.DigestBytes([]byte("another model"))
	writeTestManifest(t, otherSource, man)

	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"different bytes", changed, []string{"model tinynet_onnx_fp32: file config.pbtxt differs between dir:" + a, "and dir:" + changed}},
		{"extra file", extra, []string{"model tinynet_onnx_fp32: file labels.txt is in dir:" + extra + " but not in dir:" + a}},
		{"source digest", otherSource, []string{"source tinynet: dir:" + a + " has digest", "one source per base name"}},
	} {
		_, err := Merge(ctx, []Destination{dest(t, "dir:"+a), dest(t, "dir:"+c.src)}, target)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: Merge = %v, want %q", c.name, err, w)
			}
		}
		if c.name != "source digest" {
			if ce := (*CollisionError)(nil); !errors.As(err, &ce) {
				t.Errorf("%s: Merge = %T, want a *CollisionError", c.name, err)
			}
		}
		if after, _ := os.ReadFile(filepath.Join(target, manifest.FileName)); string(after) != string(before) {
			t.Errorf("%s: a failed merge changed the target", c.name)
		}
	}

	// A variant one machine could not build (no files) and another built.
	unbuilt := testRepo(t, manifest.RuntimeONNX, nil, passed())
	man, _ = manifest.Read(unbuilt)
	os.RemoveAll(filepath.Join(unbuilt, "tinynet_onnx_fp32"))
	man.Models[0].Files, man.Models[0].Status = nil, manifest.StatusNeedsGPU
	writeTestManifest(t, unbuilt, man)
	for _, order := range [][]string{{unbuilt, a}, {a, unbuilt}} {
		if _, err := Merge(ctx, []Destination{dest(t, "dir:"+order[0]), dest(t, "dir:"+order[1])}, target); err != nil {
			t.Fatal(err)
		}
		if m, err := manifest.Read(target); err != nil || m.Models[0].Status != manifest.StatusOK || len(m.Models[0].Files) != 2 {
			t.Errorf("merge of an unbuilt and a built record kept %+v (%v), want the built one", m.Models[0], err)
		}
	}
}
