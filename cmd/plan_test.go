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
	stdout, stderr, code := run(t, "plan", model, "--precision", "fp16,int8", "--runtime", "onnx,trt", "--calib-data", "gs://my-bucket/calib",
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
		{[]string{"--source-digest", deployDigest, "--precision", "int8"}, "an int8 variant needs calibration data (--calib-data gs://..."},
		{[]string{"--source-digest", deployDigest, "--gpu-types", "nvidia-tesla-t4"}, "Cloud Run GPU types"},
		{[]string{"--gpu-types", "nvidia-k80"}, `"--gpu-types" flag`},
	}
	if _, stderr, code := run(t, "plan", "-o", filepath.Join(t.TempDir(), "p")); code != ExitUsage || !strings.Contains(stderr, "give MODEL, or -f pipeline.yaml") {
		t.Errorf("kiln plan without MODEL = exit %d, %q", code, stderr)
	}
	for _, c := range cases {
		_, stderr, code := run(t, append(base, c.args...)...)
		if code != ExitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("kiln plan %v = exit %d, %q; want exit 2 with %q", c.args, code, stderr, c.want)
		}
	}
}

// kiln plan -f takes the variants, GPU types, TensorRT version, cache,
// image, name and remote destinations from the pipeline file, leaves the
// local destination out with a note, and a flag replaces the file's value.
func TestPlanFromFile(t *testing.T) {
	file := filepath.Join("..", "testdata", "pipeline-plan.yaml")
	type result struct {
		Tasks []struct {
			GPU      string `json:"gpu_type"`
			Variant  string
			CacheKey string `json:"cache_key"`
		}
		Notes []string
	}
	plan := func(args ...string) (result, string, string) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "plan")
		stdout, stderr, code := run(t, append([]string{"plan", "-f", file, "--source-digest", deployDigest, "-o", out, "--format", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("kiln plan -f %v = exit %d: %s", args, code, stderr)
		}
		var res result
		if err := json.Unmarshal([]byte(stdout), &res); err != nil {
			t.Fatalf("%v: %s", err, stdout)
		}
		b, _ := os.ReadFile(filepath.Join(out, "cloudrun-final-l4.yaml"))
		return res, string(b), out
	}
	res, final, out := plan()
	if len(res.Tasks) != 6 || res.Tasks[1].Variant != "trt-fp16-sm89" || res.Tasks[5].Variant != "trt-int8-b16-sm120" || res.Tasks[3].GPU != "nvidia-rtx-pro-6000" {
		t.Errorf("tasks = %+v, want the file's 3 variants on its 2 GPU types", res.Tasks)
	}
	if !strings.HasSuffix(res.Tasks[1].CacheKey, "/trt-fp16-sm89/trt-10.3/sm89") {
		t.Errorf("cache key %s does not hold the file's TensorRT version", res.Tasks[1].CacheKey)
	}
	for _, want := range []string{"name: resnet50-final-l4", "namespace: my-project", "image: europe-docker.pkg.dev/my-project/kiln/kiln:1", "value: gs://my-bucket/kiln-cache",
		"value: gs://my-bucket/models/resnet50.onnx", "--to image:europe-docker.pkg.dev/my-project/models/resnet50:1-l4 --to gs://my-bucket/models/resnet50/l4 --progress plain"} {
		if !strings.Contains(final, want) {
			t.Errorf("cloudrun-final-l4.yaml has no %q:\n%s", want, final)
		}
	}
	build, _ := os.ReadFile(filepath.Join(out, "cloudrun-build-l4.yaml"))
	if !strings.Contains(string(build), "calib='--calib-data gs://my-bucket/calib --calib-preprocess imagenet --calib-samples 512'") {
		t.Errorf("cloudrun-build-l4.yaml does not calibrate the int8 build from the file's calibration:\n%s", build)
	}
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "published is local to this machine") {
		t.Errorf("notes = %q, want one about the dir: destination", res.Notes)
	}
	res, final, _ = plan("--gpu-types", "nvidia-l4", "--variant", "onnx-fp32", "--to", "gs://other/m")
	if len(res.Tasks) != 1 || res.Tasks[0].Variant != "onnx-fp32" || !strings.Contains(final, "--to gs://other/m/l4 --progress") || strings.Contains(final, "resnet50:1-l4") {
		t.Errorf("flags did not replace the file's values: %+v\n%s", res.Tasks, final)
	}
}
