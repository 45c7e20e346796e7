package pack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kiln-ml/kiln/manifest"
)

// craftedImage is an image of one gzip layer holding the given tar entries.
func craftedImage(t *testing.T, hdrs []*tar.Header) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	zw.Close()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(buf.Bytes(), types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Layers whose entries would land outside the target are refused, and
// nothing is written outside it (nor the target itself).
func TestExtractRefusesEscapes(t *testing.T) {
	reg := func(name string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}
	}
	cases := map[string][]*tar.Header{
		"dotdot":         {reg("models/../evil")},
		"dotdot deep":    {reg("models/a/../../evil")},
		"absolute":       {reg("/models/evil")},
		"outside models": {reg("etc/passwd")},
		"symlink out":    {{Name: "models/link", Typeflag: tar.TypeSymlink, Linkname: "../../evil"}},
		"symlink abs":    {{Name: "models/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
		"hardlink out":   {{Name: "models/link", Typeflag: tar.TypeLink, Linkname: "etc/passwd"}},
		"write via link": {{Name: "models/d", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "models/d/../../evil", Typeflag: tar.TypeReg}},
		"device":         {{Name: "models/dev", Typeflag: tar.TypeChar}},
	}
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			target := filepath.Join(parent, "sub", "target")
			err := extractImage(context.Background(), craftedImage(t, hdrs), target)
			var ee *EscapeError
			if !errors.As(err, &ee) {
				t.Fatalf("extractImage = %v, want an EscapeError", err)
			}
			left, _ := os.ReadDir(filepath.Join(parent, "sub"))
			if _, serr := os.Stat(filepath.Join(parent, "evil")); serr == nil || len(left) != 0 {
				t.Errorf("files left after a refused layer: %v", left)
			}
		})
	}
}

// A layer whose bytes are not what the manifest records is refused.
func TestExtractChecksDigest(t *testing.T) {
	img := craftedImage(t, []*tar.Header{{Name: "models/", Typeflag: tar.TypeDir}})
	l, _ := img.Layers()
	rc, _ := l[0].Compressed()
	data, _ := io.ReadAll(rc)
	desc, _ := partialDesc(img)
	desc.Size++
	err := unpackLayer(context.Background(), bytes.NewReader(data), desc, mustDiffID(t, l[0]), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "the manifest records") {
		t.Fatalf("unpackLayer with a wrong size = %v, want a refusal", err)
	}
}

func partialDesc(img v1.Image) (v1.Descriptor, error) {
	d, _, err := repoLayerDesc(img)
	return d, err
}

func mustDiffID(t *testing.T, l v1.Layer) v1.Hash {
	h, err := l.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// An oci-archive is a tar of an OCI layout: oci-layout, index.json and
// blobs/sha256/<digest> whose contents hash to their names, plus docker
// load's manifest.json.
func TestArchiveStructure(t *testing.T) {
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	file := filepath.Join(t.TempDir(), "repo.tar")
	pubs, err := Run(context.Background(), Config{Repo: repo, To: []Destination{dest(t, "oci-archive:"+file)}, Base: "scratch"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	seen := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		seen[h.Name] = data
		if hex, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && h.Typeflag == tar.TypeReg {
			if d := manifest.DigestBytes(data); d.Hex() != hex {
				t.Errorf("blob %s has digest %s", h.Name, d)
			}
		}
	}
	var layoutFile struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(seen["oci-layout"], &layoutFile); err != nil || layoutFile.Version != "1.0.0" {
		t.Errorf("oci-layout = %q, want imageLayoutVersion 1.0.0", seen["oci-layout"])
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(seen["index.json"], &idx); err != nil || len(idx.Manifests) != 1 || string(pubs[0].Digest) != idx.Manifests[0].Digest.String() {
		t.Fatalf("index.json = %s, want the image %s", seen["index.json"], pubs[0].Digest)
	}
	if _, ok := seen["blobs/sha256/"+idx.Manifests[0].Digest.Hex]; !ok || seen["manifest.json"] == nil {
		t.Errorf("archive lacks the manifest blob or manifest.json: %v", keys(seen))
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
