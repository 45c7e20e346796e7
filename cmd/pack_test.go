package cmd

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/kiln-ml/kiln/manifest"
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
	// The repository read back, verdicts included, pushes to the same
	// digest (README, Deploying: deploying what a plan's job published).
	again, errOut, code := run(t, "pack", back, "--to", "image:"+ref, "--base", "scratch", "--insecure")
	if code != 0 || !strings.Contains(first, strings.TrimSpace(again)) {
		t.Errorf("pack of the read-back repository = exit %d, %q (%s); want the first push's line, in %q", code, again, errOut, first)
	}
}

func TestPackUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pack", "models", "--to", "gs://Bucket/models"}, `bucket "Bucket"`},
		{[]string{"pack", "models", "--to", "gs://bucket/a/../b"}, "the prefix has an empty, . or .. element"},
		{[]string{"pack", "models", "--to", "dir:x", "--dry-run"}, "--dry-run: dir:x is not a gs:// destination"},
		{[]string{"pack", "models", "--to", "gs://bucket/m", "--jobs", "0"}, "--jobs 0: want at least 1"},
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

// Through STORAGE_EMULATOR_HOST, as a user points kiln at an emulator:
// a dry run lists the objects and writes none, a publish prints the
// destination and kiln.json's digest, --from reads it back, and serve
// checks the published repository straight from gs:// and removes its
// temporary copy.
func TestPackGCS(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "models")
	if _, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "--precision", "fp32"); code != 0 {
		t.Fatalf("convert: exit %d: %s", code, errOut)
	}
	srv := emulatorGCS(t, "models")
	const to = "gs://models/tinynet"
	out, errOut, code := run(t, "pack", repo, "--to", to, "--dry-run", "--allow-unchecked")
	if code != 0 || !strings.Contains(out, "upload\t"+to+"/tinynet_onnx_fp32/1/model.onnx\t") || !strings.HasSuffix(strings.TrimSpace(out), to+"/kiln.json\t"+lastField(out)) {
		t.Fatalf("pack --dry-run = exit %d, %q, %s; want the uploads, kiln.json last", code, out, errOut)
	}
	if objs, _, _ := srv.ListObjectsWithOptions("models", fakestorage.ListOptions{}); len(objs) != 0 {
		t.Fatalf("a dry run wrote %d objects", len(objs))
	}
	out, errOut, code = run(t, "pack", repo, "--to", to, "--jobs", "2", "--chunk-size", "256KiB", "--progress", "plain", "--allow-unchecked")
	if code != 0 || !strings.HasPrefix(out, to+"\tsha256:") || !strings.Contains(errOut, "upload "+to+": finished") {
		t.Fatalf("pack --to gs:// = exit %d, %q, %q", code, out, errOut)
	}
	if again, _, _ := run(t, "pack", repo, "--to", to, "--dry-run", "--allow-unchecked"); again != "" {
		t.Errorf("dry run after the publish = %q, want no changes", again)
	}
	back := filepath.Join(dir, "back")
	if _, errOut, code := run(t, "pack", "--from", to, "--to", "dir:"+back); code != 0 {
		t.Fatalf("pack --from gs://: exit %d: %s", code, errOut)
	}
	a, _ := os.ReadFile(filepath.Join(repo, "tinynet_onnx_fp32/1/model.onnx"))
	b, err := os.ReadFile(filepath.Join(back, "tinynet_onnx_fp32/1/model.onnx"))
	if err != nil || string(a) != string(b) {
		t.Errorf("model.onnx differs after the gs:// round trip (%v)", err)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	if out, errOut, code := run(t, "serve", to, "--perf=false"); code != 0 || !strings.Contains(out, "tinynet_onnx_fp32") {
		t.Fatalf("serve gs:// = exit %d, %q, %s", code, out, errOut)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("serve left %v in the temporary directory", left)
	}
}

// lastField is the text after the last tab of s, without the newline.
func lastField(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\t')+1:]
}

// The parts of a plan's build cache, one variant a repository on the GCS
// emulator and one local, merge into one repository that serve passes;
// the same model with other bytes is refused (exit 3) naming it.
func TestPackMergeServe(t *testing.T) {
	dir := t.TempDir()
	fp32, fp16 := filepath.Join(dir, "fp32"), filepath.Join(dir, "fp16")
	for repo, p := range map[string]string{fp32: "fp32", fp16: "fp16"} {
		if _, errOut, code := run(t, "convert", tinynetPath, "--repo", repo, "--precision", p); code != 0 {
			t.Fatalf("convert %s: exit %d: %s", p, code, errOut)
		}
	}
	emulatorGCS(t, "cache")
	if _, errOut, code := run(t, "pack", fp32, "--to", "gs://cache/fp32", "--allow-unchecked"); code != 0 {
		t.Fatalf("pack to gs://: exit %d: %s", code, errOut)
	}
	merged := filepath.Join(dir, "merged")
	out, errOut, code := run(t, "pack", "--from", "gs://cache/fp32", "--from", "dir:"+fp16, "--to", "dir:"+merged)
	if code != 0 || strings.Count(out, "\tdir:"+merged+"\tsha256:") != 2 {
		t.Fatalf("pack --from --from = exit %d, %q, %s", code, out, errOut)
	}
	if out, errOut, code := run(t, "serve", merged, "--perf=false"); code != 0 || !strings.Contains(out, "tinynet_onnx_fp32") || !strings.Contains(out, "tinynet_onnx_fp16") {
		t.Fatalf("serve on the merged repository = exit %d, %q, %s", code, out, errOut)
	}
	cfg := filepath.Join(fp16, "tinynet_onnx_fp16", "config.pbtxt")
	b, _ := os.ReadFile(cfg)
	// Another build of the same model: rebuilt with labels.
	if _, errOut, code := run(t, "convert", tinynetPath, "--repo", fp16, "--precision", "fp16", "--labels", filepath.Join("..", "testdata", "tinynet_labels.txt")); code != 0 {
		t.Fatalf("convert: exit %d: %s", code, errOut)
	}
	if c, _ := os.ReadFile(cfg); string(c) == string(b) {
		t.Fatal("the rebuild wrote the same config; the collision below would test nothing")
	}
	_, errOut, code = run(t, "pack", "--from", "dir:"+merged, "--from", "dir:"+fp16, "--to", "dir:"+merged)
	if code != ExitCheck || !strings.Contains(errOut, "model tinynet_onnx_fp16: file config.pbtxt differs") {
		t.Errorf("merging a changed model = exit %d, %q; want exit 3 naming the model and file", code, errOut)
	}
}

// emulatorGCS starts the GCS emulator with an empty bucket and points kiln
// at it through STORAGE_EMULATOR_HOST, as a user would.
func emulatorGCS(t *testing.T, bucket string) *fakestorage.Server {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1", Writer: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(srv.URL(), "http://"))
	return srv
}
