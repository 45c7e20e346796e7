package cmd

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"

	"github.com/google/go-containerregistry/pkg/registry"
)

// A repository kiln built and serve passed is pushed to a real registry
// (in-process), gives the same digest twice, and reads back intact; the
// same repository before serve checked it is refused (exit 3).
func TestPackConvertServePushPull(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "models")
	if _, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "--precision", "fp32"); code != 0 {
		t.Fatalf("convert: exit %d: %s", code, errOut)
	}
	s := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer s.Close()
	ref := strings.TrimPrefix(s.URL, "http://") + "/kiln/tinynet:1"
	if _, errOut, code := run(t, "pack", repo, "--to", "image:"+ref, "--base", "scratch", "--insecure"); code != ExitCheck ||
		!strings.Contains(errOut, "kiln serve has not checked it") {
		t.Fatalf("pack before serve = exit %d, %q; want exit 3 naming the missing check", code, errOut)
	}
	if _, errOut, code := run(t, "serve", repo, "--perf=false"); code != 0 {
		t.Fatalf("serve: exit %d: %s", code, errOut)
	}
	args := []string{"pack", repo, "--to", "image:" + ref, "--to", "dir:" + filepath.Join(dir, "copy"), "--base", "scratch", "--insecure"}
	first, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("pack: exit %d: %s", code, errOut)
	}
	second, _, _ := run(t, args...)
	if first != second || !strings.Contains(first, "image:"+ref+"\tsha256:") {
		t.Fatalf("pack printed %q then %q, want the same digests twice", first, second)
	}
	// kiln.json records each destination once, with the digest printed;
	// recording it does not change what the next push publishes.
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Published) != 2 || man.Published[0].Destination != "image:"+ref ||
		!strings.Contains(first, string(man.Published[0].Digest)) || man.Published[1].Destination != "dir:"+filepath.Join(dir, "copy") {
		t.Errorf("kiln.json published = %+v, want the image then the dir, with the digests printed (%q)", man.Published, first)
	}
	back := filepath.Join(dir, "back")
	if _, errOut, code := run(t, "pack", "--from", "image:"+ref, "--to", "dir:"+back, "--insecure"); code != 0 {
		t.Fatalf("pack --from: exit %d: %s", code, errOut)
	}
	for _, rel := range []string{"tinynet_onnx_fp32/1/model.onnx", "tinynet_onnx_fp32/config.pbtxt"} {
		a, _ := os.ReadFile(filepath.Join(repo, rel))
		b, err := os.ReadFile(filepath.Join(back, rel))
		if err != nil || string(a) != string(b) {
			t.Errorf("%s differs after the round trip (%v)", rel, err)
		}
	}
}

func TestPackUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pack", "models", "--to", "gs://bucket/models"}, "gs:// destinations are not built yet"},
		{[]string{"pack", "models", "--to", "s3:bucket"}, `unknown kind "s3"`},
		{[]string{"pack", "models"}, "give at least one --to destination"},
		{[]string{"pack", "--from", "image:r/x:1", "--to", "image:r/y:1"}, "--from reads into one --to dir:PATH"},
		{[]string{"pack", "models", "--to", "dir:x", "--compression", "lz4"}, `"--compression" flag: want one of gzip, zstd`},
	} {
		_, errOut, code := run(t, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("kiln %v = exit %d, %q; want exit 2 with %q", c.args, code, errOut, c.want)
		}
	}
}
