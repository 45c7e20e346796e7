package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

const deployDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// packedRepo writes a repository manifest as kiln pack leaves it: a
// TensorRT plan for sm89 and a publication to an image.
func packedRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	m := manifest.New("kiln test")
	m.Put(&manifest.Model{Name: "resnet_trt_fp16_sm89", Variant: manifest.Variant{Runtime: manifest.RuntimeTRT, Precision: manifest.FP16, Target: "8.9"},
		Build: &manifest.Build{ComputeCapability: "8.9"}, Status: manifest.StatusOK, Version: 1})
	m.Published = []manifest.Publication{
		{Destination: "dir:/srv/models", Digest: deployDigest, Time: time.Unix(0, 0).UTC()},
		{Destination: "image:europe-docker.pkg.dev/my-project/models/resnet:1", Digest: deployDigest, Time: time.Unix(0, 0).UTC()},
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDeployCommand(t *testing.T) {
	repo := packedRepo(t)
	out := filepath.Join(t.TempDir(), "deploy")
	stdout, stderr, code := run(t, "deploy", repo, "--project", "my-project", "--region", "europe-west4", "-o", out, "--format", "json")
	if code != 0 {
		t.Fatalf("kiln deploy = exit %d: %s", code, stderr)
	}
	var res struct {
		Image    string
		Files    []struct{ Path string }
		Commands []string
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if res.Image != "europe-docker.pkg.dev/my-project/models/resnet:1@"+deployDigest || len(res.Files) != 3 || len(res.Commands) != 3 {
		t.Errorf("deploy result = %+v", res)
	}
	if got := strings.Join(testutil.DirNames(t, out), " "); got != "cloudrun-service.yaml cloudrun-worker-pool.yaml gke.yaml" {
		t.Errorf("deploy wrote %s", got)
	}
	svc, err := os.ReadFile(filepath.Join(out, "cloudrun-service.yaml"))
	if err != nil || !strings.Contains(string(svc), "name: resnet\n") || !strings.Contains(string(svc), "resnet:1@"+deployDigest) {
		t.Errorf("cloudrun-service.yaml = %s, %v", svc, err)
	}
	if want := "gcloud run services replace " + filepath.Join(out, "cloudrun-service.yaml") + " --project my-project --region europe-west4"; res.Commands[0] != want {
		t.Errorf("first command = %q, want %q", res.Commands[0], want)
	}
}

// A deployment that breaks a rule is a usage error naming the rule, and
// writes nothing.
func TestDeployRefuses(t *testing.T) {
	repo := packedRepo(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--cpu", "2"}, "Cloud Run GPU sizing: nvidia-l4 needs at least 4 CPU"},
		{[]string{"--memory", "8GiB"}, "Cloud Run GPU sizing: nvidia-l4 needs at least 16Gi"},
		{[]string{"--region", "asia-south2"}, "Cloud Run GPU regions"},
		{[]string{"--max-instances", "5"}, "Cloud Run GPU quota"},
		{[]string{"--gpu-type", "nvidia-rtx-pro-6000"}, "TensorRT plans match the GPU"},
		{[]string{"--gpu-type", "nvidia-v100"}, `"--gpu-type" flag: want one of`},
		{[]string{"--image", "reg/other:2"}, "records no publication to image:reg/other:2"},
	}
	for _, c := range cases {
		out := filepath.Join(t.TempDir(), "deploy")
		args := append([]string{"deploy", repo, "--project", "p", "--region", "europe-west4", "-o", out}, c.args...)
		_, stderr, code := run(t, args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("kiln %v = exit %d, %q; want %q", c.args, code, stderr, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("kiln %v wrote %s", c.args, out)
		}
	}
}
