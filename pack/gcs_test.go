package pack

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cloud.google.com/go/storage"

	"github.com/kiln-ml/kiln/manifest"
)

func TestParseGCS(t *testing.T) {
	for _, c := range []struct {
		in, path string
		ok       bool
	}{
		{"gs://bkt", "bkt", true},
		{"gs://bkt/", "bkt", true},
		{"gs://my-bkt.x/a/b/", "my-bkt.x/a/b", true},
		{"gs:bkt/a", "", false},
		{"gs://Bkt/a", "", false},
		{"gs://b/a", "", false},
		{"gs://bkt//a", "", false},
		{"gs://bkt/a/../b", "", false},
		{"gs://bkt/./b", "", false},
		{"gs://-bk/a", "", false},
	} {
		d, err := ParseDestination(c.in)
		if (err == nil) != c.ok || (c.ok && (d.Kind != KindGCS || d.Path != c.path)) {
			t.Errorf("ParseDestination(%q) = %+v, %v; want path %q ok %v", c.in, d, err, c.path, c.ok)
		}
		if c.ok && d.String() != "gs://"+c.path {
			t.Errorf("ParseDestination(%q).String() = %q, want gs://%s", c.in, d.String(), c.path)
		}
	}
}

// publishGCS runs pack for one gs:// destination.
func publishGCS(t *testing.T, repo, to string, g GCS) (Publication, error) {
	t.Helper()
	pubs, err := Run(context.Background(), Config{Repo: repo, To: []Destination{dest(t, to)}}, WithGCS(g))
	if err != nil {
		return Publication{}, err
	}
	return pubs[0], nil
}

// A repository with a 300 MB file goes to the real emulator (its own
// process) and to fakestorage: every object's CRC32C is the file's, a
// second run sends nothing, a changed file is the only one sent again,
// kiln.json is written last, --delete removes stale objects, and the
// prefix reads back intact.
func TestGCSPublish(t *testing.T) {
	if testing.Short() {
		t.Skip("a 300 MB upload")
	}
	for _, name := range []string{"fake-gcs-server", "fakestorage"} {
		t.Run(name, func(t *testing.T) {
			repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
			addFile(t, repo, "1/weights.bin", 300<<20, 1)
			var c *storage.Client
			if name == "fakestorage" {
				c = inProcessGCS(t).client
			} else {
				c = emulatorClient(t, startEmulator(t, "").host)
			}
			checkPublish(t, repo, c)
		})
	}
}

func checkPublish(t *testing.T, repo string, c *storage.Client) {
	const to, prefix = "gs://" + testBucket + "/models/resnet", "models/resnet/"
	var up uploads
	g := GCS{Client: c, Jobs: 4, ChunkSize: 32 << 20, Progress: up.report}
	pub, err := publishGCS(t, repo, to, g)
	if err != nil {
		t.Fatal(err)
	}
	if pub.Destination != to || pub.Digest.Validate() != nil {
		t.Errorf("publication = %+v, want %s and a digest", pub, to)
	}
	if sent := up.sent(); sent < 300<<20 {
		t.Errorf("first run sent %d bytes, want the whole repository", sent)
	}
	first := checkObjects(t, repo, c, prefix)
	if _, err := publishGCS(t, repo, to, g); err != nil {
		t.Fatal(err)
	}
	if sent := up.sent(); sent != 0 {
		t.Errorf("second run sent %d bytes, want none", sent)
	}
	if again := checkObjects(t, repo, c, prefix); again[manifest.FileName].Generation != first[manifest.FileName].Generation {
		t.Errorf("second run rewrote kiln.json (generation %d, was %d)", again[manifest.FileName].Generation, first[manifest.FileName].Generation)
	}
	changed := "tinynet_onnx_fp32/config.pbtxt"
	if err := os.WriteFile(filepath.Join(repo, filepath.FromSlash(changed)), []byte("name: \"tinynet_onnx_fp32\"\nbackend: \"onnxruntime\"\nmax_batch_size: 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addFile(t, repo, "1/extra.bin", 1000, 2) // and records config.pbtxt's new digest below
	recordFile(t, repo, "config.pbtxt")
	stale := []string{"tinynet_onnx_fp32/2/old.plan", "old_model/config.pbtxt"}
	for _, rel := range stale {
		w := c.Bucket(testBucket).Object(prefix + rel).NewWriter(context.Background())
		w.Write([]byte("stale"))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	g.Delete = true
	if _, err := publishGCS(t, repo, to, g); err != nil {
		t.Fatal(err)
	}
	if sent, want := up.sent(), int64(1000+len("name: \"tinynet_onnx_fp32\"\nbackend: \"onnxruntime\"\nmax_batch_size: 8\n")); sent != want {
		t.Errorf("run after a change sent %d bytes, want %d (the changed and the new file)", sent, want)
	}
	objs := checkObjects(t, repo, c, prefix)
	for rel, a := range objs {
		was := first[rel]
		rewritten := rel == changed || rel == "tinynet_onnx_fp32/1/extra.bin" || rel == manifest.FileName
		if !rewritten && (was == nil || a.Generation != was.Generation) {
			t.Errorf("%s was written again (generation %d), only the changed files should be", rel, a.Generation)
		}
		if rel != manifest.FileName && a.Generation >= objs[manifest.FileName].Generation {
			t.Errorf("%s (generation %d) was written after kiln.json (%d)", rel, a.Generation, objs[manifest.FileName].Generation)
		}
	}
	for _, rel := range stale {
		if objs[rel] != nil {
			t.Errorf("--delete kept the stale object %s", rel)
		}
	}
	back := filepath.Join(t.TempDir(), "back")
	if d, err := Pull(context.Background(), dest(t, to), back, WithGCS(g)); err != nil || d != manifest.DigestBytes(mustRead(t, filepath.Join(back, manifest.FileName))) {
		t.Fatalf("Pull = %s, %v", d, err)
	}
	sameFiles(t, repo, back)
}

// recordFile records the current digest of a model file in kiln.json.
func recordFile(t *testing.T, repo, rel string) {
	t.Helper()
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	m := man.Model("tinynet_onnx_fp32")
	for i, f := range m.Files {
		if f.Path == rel {
			d, n, err := manifest.DigestFile(filepath.Join(repo, m.Name, filepath.FromSlash(rel)))
			if err != nil {
				t.Fatal(err)
			}
			m.Files[i].Digest, m.Files[i].Size = d, n
		}
	}
	if err := writeManifest(repo, man); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkObjects checks that the prefix holds every file of repo with its
// size and CRC32C, and kiln.json as published (no publications).
func checkObjects(t *testing.T, repo string, c *storage.Client, prefix string) map[string]*storage.ObjectAttrs {
	t.Helper()
	objs := listing(t, c, prefix)
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range man.Models {
		for _, f := range m.Files {
			rel := m.Name + "/" + f.Path
			a := objs[rel]
			if a == nil {
				t.Errorf("no object %s%s", prefix, rel)
				continue
			}
			if want := fileCRC(t, filepath.Join(repo, m.Name, filepath.FromSlash(f.Path))); a.CRC32C != want || a.Size != f.Size {
				t.Errorf("object %s: %d bytes CRC32C %08x, want %d bytes %08x", rel, a.Size, a.CRC32C, f.Size, want)
			}
		}
	}
	rd, err := c.Bucket(testBucket).Object(prefix + manifest.FileName).NewReader(context.Background())
	if err != nil {
		t.Fatalf("reading %s%s: %v", prefix, manifest.FileName, err)
	}
	data, err := io.ReadAll(rd)
	rd.Close()
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), manifest.FileName)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := manifest.Read(tmp)
	if err != nil {
		t.Fatalf("the published kiln.json: %v", err)
	}
	if len(got.Published) != 0 || len(got.Models) != len(man.Models) {
		t.Errorf("published kiln.json has %d models and publications %+v, want %d models and none", len(got.Models), got.Published, len(man.Models))
	}
	return objs
}

// A dry run lists the changes and writes nothing.
func TestGCSDryRun(t *testing.T) {
	s := inProcessGCS(t)
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	to := "gs://" + testBucket + "/dry"
	cfg := Config{Repo: repo, To: []Destination{dest(t, to)}}
	cs, err := DryRun(context.Background(), cfg, WithGCS(GCS{Client: s.client}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Op+" "+strings.TrimPrefix(c.Object, to+"/"))
	}
	want := "upload tinynet_onnx_fp32/1/model.onnx,upload tinynet_onnx_fp32/config.pbtxt,upload kiln.json"
	if strings.Join(names, ",") != want {
		t.Errorf("DryRun = %v, want %s", names, want)
	}
	if objs := listing(t, s.client, "dry/"); len(objs) != 0 {
		t.Errorf("a dry run wrote %d objects", len(objs))
	}
	if _, err := Run(context.Background(), cfg, WithGCS(GCS{Client: s.client})); err != nil {
		t.Fatal(err)
	}
	if cs, err := DryRun(context.Background(), cfg, WithGCS(GCS{Client: s.client})); err != nil || len(cs) != 0 {
		t.Errorf("DryRun after a publish = %v, %v; want no changes", cs, err)
	}
}

// Pulling from a prefix refuses object names that escape the target,
// objects that are not what kiln.json records, and a prefix without
// kiln.json; a failed pull leaves the target as it was.
func TestGCSPullRefuses(t *testing.T) {
	ctx := context.Background()
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	for _, c := range []struct {
		name   string
		extra  map[string]string // objects added after the publish, below the prefix
		remove string
		want   func(error) bool
	}{
		{"dotdot", map[string]string{"../escape": "x"}, "", isObjectError},
		{"empty element", map[string]string{"a//b": "x"}, "", isObjectError},
		{"changed file", map[string]string{"tinynet_onnx_fp32/config.pbtxt": "other"}, "", isMismatch},
		{"no kiln.json", nil, manifest.FileName, func(err error) bool { return err != nil && strings.Contains(err.Error(), "no kiln.json") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := inProcessGCS(t)
			g := GCS{Client: s.client}
			to := "gs://" + testBucket + "/p"
			if _, err := publishGCS(t, repo, to, g); err != nil {
				t.Fatal(err)
			}
			for name, content := range c.extra {
				w := s.client.Bucket(testBucket).Object("p/" + name).NewWriter(ctx)
				w.Write([]byte(content))
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if c.remove != "" {
				if err := s.client.Bucket(testBucket).Object("p/" + c.remove).Delete(ctx); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(t.TempDir(), "target")
			_, err := Pull(ctx, dest(t, to), target, WithGCS(g))
			if !c.want(err) {
				t.Fatalf("Pull = %v, want a refusal", err)
			}
			if _, serr := os.Stat(target); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("a failed pull left %s behind (%v)", target, serr)
			}
			if _, serr := os.Stat(filepath.Join(filepath.Dir(target), "escape")); serr == nil {
				t.Errorf("the pull wrote outside the target")
			}
		})
	}
}

func isObjectError(err error) bool { var e *ObjectError; return errors.As(err, &e) }
func isMismatch(err error) bool    { var e *MismatchError; return errors.As(err, &e) }
