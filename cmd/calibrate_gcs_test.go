package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/kiln-ml/kiln/internal/testmodels"
)

// kiln calibrate --data gs://... reads the samples from Google Cloud Storage,
// here the fake-gcs-server emulator on loopback reached through
// STORAGE_EMULATOR_HOST, as a user would point kiln at it.
func TestCalibrateFromGCS(t *testing.T) {
	imgs := t.TempDir()
	if err := testmodels.WriteImages(imgs, 16, 32, 32, 9); err != nil {
		t.Fatal(err)
	}
	var objs []fakestorage.Object
	entries, _ := os.ReadDir(imgs)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(imgs, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: "calib", Name: "tiny/" + e.Name()}, Content: data})
	}
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1", InitialObjects: objs})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(srv.URL(), "http://"))

	out := filepath.Join(t.TempDir(), "calib")
	stdout, errOut, code := run(t, "calibrate", tinynetPath, "--data", "gs://calib/tiny", "--preprocess", "scale=0.00392157", "-o", out, "--progress", "none")
	if code != 0 {
		t.Fatalf("calibrate --data gs:// = exit %d: %s", code, errOut)
	}
	if !strings.Contains(stdout, "8 samples") {
		t.Errorf("calibrate summary = %q, want 8 calibration samples (half of 16)", stdout)
	}
	for _, f := range []string{"ranges.json", "model.int8.onnx", "report.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("calibrate from gs:// did not write %s: %v", f, err)
		}
	}
	_, errOut, code = run(t, "calibrate", tinynetPath, "--data", "gs://calib/missing", "-o", filepath.Join(t.TempDir(), "x"), "--progress", "none")
	if code == 0 || !strings.Contains(errOut, "gs://calib/missing") {
		t.Errorf("calibrate from a missing prefix = exit %d, %q; want an error naming it", code, errOut)
	}
}
