package workflows_test

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	corev1 "k8s.io/api/core/v1"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/workflows"
)

// The plan's scripts run as its Jobs run them, with a real kiln built from
// this tree and a GCS emulator as the build cache: each index converts its
// variant and caches it, a rerun of an index uses the cached build, and
// the final script merges both builds into one repository, serves it and
// publishes it; the publication reads back with both models and their
// verdicts. /work, the Jobs' volume, becomes a temporary directory.
func TestPlanScriptsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kiln")
	}
	if _, err := os.Stat(os.Getenv("KILN_ORT_LIB")); err != nil {
		t.Skip("KILN_ORT_LIB is not set to ONNX Runtime's library (make ort)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "kiln"), "../cmd/kiln").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1", Writer: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "cache"})
	src, _ := filepath.Abs(filepath.Join("..", "testdata", "tinynet.onnx"))
	digest, _, err := manifest.DigestFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var vs []manifest.Variant
	for _, id := range []string{"onnx-fp32", "onnx-fp16"} {
		v, _ := manifest.ParseVariant(id)
		vs = append(vs, v)
	}
	l4, _ := workflows.LookupGPU("nvidia-l4")
	p := workflows.Plan{Name: "tinynet", Source: src, SourceDigest: digest, Variants: vs, GPUs: []workflows.GPU{l4},
		Cache: "gs://cache/kiln", Image: "reg/kiln:1", To: []string{"gs://cache/published"}}
	build, final, err := p.GKEJobs()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), "KILN_ORT_LIB=" + os.Getenv("KILN_ORT_LIB"),
		"STORAGE_EMULATOR_HOST=" + strings.TrimPrefix(srv.URL(), "http://"), "XDG_CACHE_HOME=" + filepath.Join(dir, "cache"), "HOME=" + dir}
	script := func(c corev1.Container, extra ...string) string {
		t.Helper()
		work := filepath.Join(dir, "work")
		os.RemoveAll(work) // each Job's pod starts with an empty volume
		cmd := exec.Command(c.Command[0], c.Command[1], strings.ReplaceAll(c.Command[2], "/work/", work+"/"))
		cmd.Env = append(append([]string{}, env...), extra...)
		for _, e := range c.Env {
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", c.Command[2][:40], extra, err, out)
		}
		return string(out)
	}
	b := build[0].Spec.Template.Spec.Containers[0]
	for i := range vs {
		if out := script(b, "JOB_COMPLETION_INDEX="+strconv.Itoa(i)); strings.Contains(out, "using existing") {
			t.Errorf("index %d used a cached build on the first run:\n%s", i, out)
		}
	}
	if out := script(b, "JOB_COMPLETION_INDEX=0"); !strings.Contains(out, "using existing onnx-fp32") {
		t.Errorf("index 0 again built instead of using the cache:\n%s", out)
	}
	if out := script(final[0].Spec.Template.Spec.Containers[0], "KILN_SERVE_FLAGS=--perf=false"); !strings.Contains(out, "PASS") || !strings.Contains(out, "gs://cache/published/l4\tsha256:") {
		t.Errorf("the final script did not serve and publish the merged repository:\n%s", out)
	}
	back := filepath.Join(dir, "back")
	cmd := exec.Command(filepath.Join(bin, "kiln"), "pack", "--from", "gs://cache/published/l4", "--to", "dir:"+back)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("reading the publication back: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(back, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var man manifest.Manifest
	if err := json.Unmarshal(data, &man); err != nil {
		t.Fatal(err)
	}
	if len(man.Models) != 2 || man.Models[0].Name != "tinynet_onnx_fp16" || len(man.Models[0].Checks) == 0 || len(man.Models[1].Checks) == 0 {
		t.Errorf("published repository models = %+v, want fp16 and fp32 with serve's verdicts", man.Models)
	}
}
