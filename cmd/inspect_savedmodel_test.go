package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// kiln inspect DIR prints a SavedModel's signatures as saved_model_cli
// show --all does, from the version TensorFlow Serving would load.
func TestInspectSavedModelGolden(t *testing.T) {
	cases := map[string][]string{
		"two_versions": {"savedmodel", "tf-serving", "saved_model_half_plus_two_2_versions"},
		"tf2":          {"savedmodel", "tf-serving", "saved_model_half_plus_two_tf2_cpu", "00000123"},
		"keras":        {"savedmodel", "real", "mlperf-tiny-kws-dscnn"},
	}
	for name, elem := range cases {
		t.Run(name, func(t *testing.T) {
			path := relCorpus(t, elem...)
			for _, format := range []string{"text", "json"} {
				out, errOut, code := run(t, "inspect", "--format", format, path)
				if code != 0 {
					t.Fatalf("kiln inspect --format %s %s = exit %d: %s", format, path, code, errOut)
				}
				testutil.Golden(t, format, []byte(out))
			}
		})
	}
}

func TestInspectSavedModelVersion(t *testing.T) {
	out, errOut, code := run(t, "inspect", "--format", "json", relCorpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_2_versions"))
	var got struct {
		Version   int64
		Variables int
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Version != 124 || got.Variables != 3 {
		t.Errorf("inspect of the two-version model = exit %d (%s), %+v; want version 124 with 3 variables", code, errOut, got)
	}
}

func TestInspectSavedModelErrors(t *testing.T) {
	bad := relCorpus(t, "savedmodel", "tf-serving", "bad_half_plus_two")
	good := relCorpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_cpu")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", bad}, 1, "no saved_model.pb"},
		{[]string{"inspect", good, filepath.Join("..", "testdata", "tinynet.onnx")}, 2, "not both"},
	}
	for _, c := range cases {
		_, errOut, code := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("kiln %v = exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// inspect --run imports a SavedModel as convert does and runs the import.
func TestInspectSavedModelRun(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	good := relCorpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_cpu")
	out, errOut, code := run(t, "inspect", "--run", good)
	if code != 0 || !strings.Contains(out, "run:") || !strings.Contains(out, "input") {
		t.Errorf("inspect --run SavedModel = exit %d\n%s\n%s; want the import described and run", code, out, errOut)
	}
}

// kiln inspect gs://... reads the SavedModel from Google Cloud Storage, here
// the emulator on loopback reached through STORAGE_EMULATOR_HOST.
func TestInspectSavedModelGCS(t *testing.T) {
	root := testutil.Corpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_2_versions")
	var objs []fakestorage.Object
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		objs = append(objs, fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: "m", Name: "hp2/" + filepath.ToSlash(rel)}, Content: data})
		return err
	})
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1", InitialObjects: objs})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(srv.URL(), "http://"))
	out, errOut, code := run(t, "inspect", "gs://m/hp2")
	if code != 0 || !strings.Contains(out, "SavedModel: gs://m/hp2/00000124 (version 124)") || !strings.Contains(out, "signature_def['serving_default']") {
		t.Errorf("inspect gs://m/hp2 = exit %d (%s)\n%s", code, errOut, out)
	}
}
