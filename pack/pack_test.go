package pack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
)

// testRepo writes a repository of one model holding the real tinynet.onnx,
// with a kiln.json whose digests are the files' own and whose check
// record is rec (nil: none).
func testRepo(t *testing.T, runtime manifest.Runtime, build *manifest.Build, rec *check.Record) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	model := filepath.Join(dir, "tinynet_onnx_fp32", "1")
	if err := os.MkdirAll(model, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join("..", "testdata", "tinynet.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"1/model.onnx": src, "config.pbtxt": []byte("name: \"tinynet_onnx_fp32\"\nbackend: \"onnxruntime\"\n")}
	m := &manifest.Model{Name: "tinynet_onnx_fp32", Variant: manifest.Variant{Runtime: runtime, Precision: manifest.FP32},
		Source: manifest.DigestBytes(src), Version: 1, Status: manifest.StatusOK, Build: build}
	for _, rel := range []string{"1/model.onnx", "config.pbtxt"} {
		if err := os.WriteFile(filepath.Join(dir, "tinynet_onnx_fp32", rel), files[rel], 0o644); err != nil {
			t.Fatal(err)
		}
		m.Files = append(m.Files, manifest.File{Path: rel, Size: int64(len(files[rel])), Digest: manifest.DigestBytes(files[rel])})
	}
	if rec != nil {
		m.Checks, _ = json.Marshal(rec)
	}
	man := manifest.New("kiln test")
	man.PutSource(&manifest.Source{Name: "tinynet", Path: "tinynet.onnx", Format: "onnx", Digest: m.Source, Size: int64(len(src))})
	man.Put(m)
	data, err := man.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func passed() *check.Record {
	return &check.Record{Verdict: check.VerdictPass, By: "serve", Checked: time.Unix(1, 0).UTC()}
}

func testRegistry(t *testing.T) string {
	t.Helper()
	s := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

func dest(t *testing.T, s string) Destination {
	t.Helper()
	d, err := ParseDestination(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Push to a real registry, twice: the same digest; pull it back: the same files.
func TestPushPullRegistry(t *testing.T) {
	ctx := context.Background()
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	host := testRegistry(t)
	reg := WithRegistry(Registry{Insecure: true})
	for _, comp := range []Compression{Gzip, Zstd} {
		t.Run(string(comp), func(t *testing.T) {
			ref := host + "/kiln/tinynet:" + string(comp)
			cfg := Config{Repo: repo, To: []Destination{dest(t, "image:"+ref)}, Base: "scratch", Compression: comp}
			first, err := Run(ctx, cfg, reg)
			if err != nil {
				t.Fatal(err)
			}
			second, err := Run(ctx, cfg, reg)
			if err != nil {
				t.Fatal(err)
			}
			if first[0].Digest != second[0].Digest || first[0].Digest.Validate() != nil {
				t.Fatalf("digests %s then %s, want one valid digest twice", first[0].Digest, second[0].Digest)
			}
			out := filepath.Join(t.TempDir(), "back")
			got, err := Pull(ctx, dest(t, "image:"+ref), out, reg)
			if err != nil || got != first[0].Digest {
				t.Fatalf("Pull = %s, %v; want %s", got, err, first[0].Digest)
			}
			sameFiles(t, repo, out)
			img, err := Registry{Insecure: true}.image(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			cf, _ := img.ConfigFile()
			if cf.Config.Labels[KeyModels] != "tinynet_onnx_fp32" || !strings.Contains(cf.Config.Labels[KeyChecks], "pass@serve") {
				t.Errorf("labels = %v, want the model and its verdict", cf.Config.Labels)
			}
		})
	}
}

// sameFiles compares the model files of two repositories, and their
// kiln.json but for the source's record of where it was published.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	for _, rel := range []string{"tinynet_onnx_fp32/1/model.onnx", "tinynet_onnx_fp32/config.pbtxt"} {
		x, err1 := os.ReadFile(filepath.Join(a, rel))
		y, err2 := os.ReadFile(filepath.Join(b, rel))
		if err1 != nil || err2 != nil || string(x) != string(y) {
			t.Errorf("%s differs between %s and %s (%v, %v)", rel, a, b, err1, err2)
		}
	}
	ma, err1 := manifest.Read(a)
	mb, err2 := manifest.Read(b)
	if err1 != nil || err2 != nil {
		t.Fatalf("reading kiln.json: %v, %v", err1, err2)
	}
	if len(mb.Published) != 0 {
		t.Errorf("%s: the published copy records publications %+v", b, mb.Published)
	}
	ma.Published = nil
	x, _ := ma.Marshal()
	y, _ := mb.Marshal()
	if string(x) != string(y) {
		t.Errorf("kiln.json differs between %s and %s beyond its publications", a, b)
	}
}

// A serving image on a base from the registry keeps the base's layers and
// gets Triton's entrypoint, ports and the base's provenance.
func TestServingImageOnBase(t *testing.T) {
	ctx := context.Background()
	host := testRegistry(t)
	reg := Registry{Insecure: true}
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	if _, err := Run(ctx, Config{Repo: repo, To: []Destination{dest(t, "image:"+host+"/base:1")}, Base: "scratch"}, WithRegistry(reg)); err != nil {
		t.Fatal(err)
	}
	pubs, err := Run(ctx, Config{Repo: repo, To: []Destination{dest(t, "image:"+host+"/serve:1")}, Base: host + "/base:1"}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	img, err := reg.image(ctx, host+"/serve:1")
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	if strings.Join(cf.Config.Entrypoint, " ") != "tritonserver --model-repository=/models" || len(cf.Config.ExposedPorts) != 3 {
		t.Errorf("config = %+v, want tritonserver's entrypoint and ports 8000-8002", cf.Config)
	}
	if layers, _ := img.Layers(); len(layers) != 2 {
		t.Errorf("%d layers, want the base's and the repository's", len(layers))
	}
	m, _ := img.Manifest()
	if m.Annotations[keyOCIBaseName] != host+"/base:1" || pubs[0].Digest.Validate() != nil {
		t.Errorf("annotations = %v, digest %s", m.Annotations, pubs[0].Digest)
	}
}

// An OCI layout that go-containerregistry's layout package reads back,
// and a dir copy, both checked against the source.
func TestLayoutAndDir(t *testing.T) {
	ctx := context.Background()
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	tmp := t.TempDir()
	lay, dir := filepath.Join(tmp, "layout"), filepath.Join(tmp, "copy")
	pubs, err := Run(ctx, Config{Repo: repo, To: []Destination{dest(t, "oci-layout:"+lay+":v1"), dest(t, "dir:"+dir)}, Base: "scratch"})
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, repo, dir)
	p, err := layout.FromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != string(pubs[0].Digest) || im.Manifests[0].Annotations[keyOCIRefName] != "v1" {
		t.Fatalf("index.json = %+v, want one image %s named v1", im.Manifests, pubs[0].Digest)
	}
	back := filepath.Join(tmp, "back")
	if _, err := Pull(ctx, dest(t, "oci-layout:"+lay+":v1"), back); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, repo, back)
}

// A file changed after kiln built it is refused before anything is written.
func TestChangedFileRefused(t *testing.T) {
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	if err := os.WriteFile(filepath.Join(repo, "tinynet_onnx_fp32", "config.pbtxt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "copy")
	_, err := Run(context.Background(), Config{Repo: repo, To: []Destination{dest(t, "dir:"+out)}})
	var me *MismatchError
	if !errors.As(err, &me) {
		t.Fatalf("Run = %v, want a MismatchError", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s exists after a refused run", out)
	}
}
