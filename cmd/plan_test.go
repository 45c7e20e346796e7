package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

func TestPlanCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "plan")
	model := filepath.Join("..", "testdata", "tinynet.onnx")
	digest, _, err := manifest.DigestFile(model)
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := run(t, "plan", model, "--precision", "fp16,int8", "--runtime", "onnx,trt",
		"--gpu-types", "nvidia-l4,nvidia-rtx-pro-6000", "--cache", "gs://my-bucket/cache", "--image", "reg/kiln:1", "--trt-version", "10.3.0",
		"--project", "p", "--region", "europe-west4", "-o", out, "--format", "json")
	if code != 0 {
		t.Fatalf("kiln plan = exit %d: %s", code, stderr)
	}
	var res struct {
		Tasks []struct {
			GPU      string `json:"gpu_type"`
			Variant  string
			CacheKey string `json:"cache_key"`
		}
		Commands []string
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	// 4 variants × 2 GPU types, TensorRT ones named for the GPU.
	if len(res.Tasks) != 8 || res.Tasks[2].Variant != "trt-fp16-sm89" || res.Tasks[6].Variant != "trt-fp16-sm120" {
		t.Errorf("tasks = %+v", res.Tasks)
	}
	if want := digest.Hex() + "/trt-fp16-sm89/trt-10.3.0/sm89"; res.Tasks[2].CacheKey != want {
		t.Errorf("cache key = %s, want %s", res.Tasks[2].CacheKey, want)
	}
	want := "cloudrun-build-l4.yaml cloudrun-build-rtx-pro-6000.yaml cloudrun-final-l4.yaml cloudrun-final-rtx-pro-6000.yaml gke-build.yaml gke-final.yaml"
	if got := strings.Join(testutil.DirNames(t, out), " "); got != want {
		t.Errorf("plan wrote %s, want %s", got, want)
	}
	if !strings.Contains(strings.Join(res.Commands, "\n"), "kubectl wait --for=condition=complete --timeout=24h job/tinynet-build-l4") {
		t.Errorf("commands = %v", res.Commands)
	}
	b, _ := os.ReadFile(filepath.Join(out, "gke-build.yaml"))
	if !strings.Contains(string(b), "completionMode: Indexed") {
		t.Errorf("gke-build.yaml has no Indexed Job:\n%s", b)
	}
}

func TestPlanRefusesCommand(t *testing.T) {
	base := []string{"plan", "gs://my-bucket/m.onnx", "--cache", "gs://my-bucket/cache", "--image", "reg/kiln:1", "-o", filepath.Join(t.TempDir(), "p")}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "give --source-digest"},
		{[]string{"--source-digest", deployDigest, "--runtime", "trt"}, "needs the TensorRT version"},
		{[]string{"--source-digest", deployDigest, "--gpu-types", "nvidia-tesla-t4"}, "Cloud Run GPU types"},
		{[]string{"--gpu-types", "nvidia-k80"}, `"--gpu-types" flag`},
	}
	for _, c := range cases {
		_, stderr, code := run(t, append(base, c.args...)...)
		if code != ExitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("kiln plan %v = exit %d, %q; want exit 2 with %q", c.args, code, stderr, c.want)
		}
	}
}
