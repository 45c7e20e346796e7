package workflows

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

func testPlan(t *testing.T) Plan {
	t.Helper()
	var vs []manifest.Variant
	for _, id := range []string{"onnx-fp16", "trt-fp16", "trt-int8-b16-x2"} {
		v, err := manifest.ParseVariant(id)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	var gs []GPU
	for _, typ := range []string{"nvidia-l4", "nvidia-rtx-pro-6000"} {
		g, err := LookupGPU(typ)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	return Plan{
		Name: "resnet", Source: "gs://my-bucket/models/resnet50.onnx", SourceDigest: testDigest,
		Variants: vs, GPUs: gs, Cache: "gs://my-bucket/kiln-cache", Image: "europe-docker.pkg.dev/my-project/kiln/kiln:0.1",
		TRT: "10.3.0", To: []string{"image:europe-docker.pkg.dev/my-project/models/resnet:1"}, Project: "my-project", Region: "europe-west4",
		Calibration: []string{"--calib-data", "gs://my-bucket/calib", "--calib-preprocess", "imagenet"},
	}
}

func TestPlanGolden(t *testing.T) {
	files, err := PlanFiles(testPlan(t), []string{PlatformGKE, PlatformCloudRun})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
		testutil.Golden(t, f.Name, f.Content)
	}
	want := "gke-build.yaml gke-final.yaml cloudrun-build-l4.yaml cloudrun-final-l4.yaml cloudrun-build-rtx-pro-6000.yaml cloudrun-final-rtx-pro-6000.yaml"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("PlanFiles names = %s, want %s", got, want)
	}
}

func TestIndexedJobsFields(t *testing.T) {
	p := testPlan(t)
	files, err := PlanFiles(p, []string{PlatformGKE})
	if err != nil {
		t.Fatal(err)
	}
	build := docs(fileNamed(t, files, "gke-build.yaml"))
	if len(build) != len(p.GPUs) {
		t.Fatalf("gke-build.yaml has %d jobs, want one per GPU type (%d)", len(build), len(p.GPUs))
	}
	for i, doc := range build {
		var j batchv1.Job
		strict(t, doc, &j)
		g := p.GPUs[i]
		pod := j.Spec.Template.Spec
		c := pod.Containers[0]
		checks := []struct {
			what      string
			got, want any
		}{
			{"name", j.Name, "resnet-build-" + g.Short},
			{"mode", *j.Spec.CompletionMode, batchv1.IndexedCompletion},
			{"completions", *j.Spec.Completions, int32(len(p.Variants))},
			{"node selector", pod.NodeSelector["cloud.google.com/gke-accelerator"], g.GKEAccelerator},
			{"gpu", c.Resources.Limits.Name("nvidia.com/gpu", "").String(), "1"},
			{"restart", string(pod.RestartPolicy), "Never"},
			{"cache", c.Env[1].Value, "gs://my-bucket/kiln-cache"},
		}
		for _, ch := range checks {
			if ch.got != ch.want {
				t.Errorf("job %d %s = %v, want %v", i, ch.what, ch.got, ch.want)
			}
		}
	}
	var final batchv1.Job
	strict(t, docs(fileNamed(t, files, "gke-final.yaml"))[0], &final)
	if final.Spec.CompletionMode != nil || *final.Spec.Completions != 1 || final.Name != "resnet-final-l4" {
		t.Errorf("final job = %s, mode %v, completions %d", final.Name, final.Spec.CompletionMode, *final.Spec.Completions)
	}
}

// fakeKiln puts a kiln on PATH that logs its arguments and has nothing
// cached (kiln pack --from fails), and returns the log's path.
func fakeKiln(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\ncase \"$*\" in *--from*) exit 1 ;; esac\n"
	if err := os.WriteFile(filepath.Join(dir, "kiln"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return log, []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH")}
}

// Every index of every build job, on both platforms, runs the variant it
// is meant to: the script is run with /bin/sh as the container runs it.
func TestIndexToVariant(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	p := testPlan(t)
	k8s, _, err := p.GKEJobs()
	if err != nil {
		t.Fatal(err)
	}
	cr, _, err := p.CloudRunJobs()
	if err != nil {
		t.Fatal(err)
	}
	for gi, g := range p.GPUs {
		for _, job := range []struct {
			indexVar string
			command  []string
			env      []string
			count    int
		}{
			{indexK8s, k8s[gi].Spec.Template.Spec.Containers[0].Command, envOf(k8s[gi].Spec.Template.Spec.Containers[0].Env), int(*k8s[gi].Spec.Completions)},
			{indexCloudRun, cr[gi].Spec.Template.Spec.Template.Spec.Containers[0].Command, envOf(cr[gi].Spec.Template.Spec.Template.Spec.Containers[0].Env), cr[gi].Spec.Template.Spec.TaskCount},
		} {
			tasks := p.Tasks(g)
			if job.count != len(tasks) {
				t.Fatalf("%s job of %s has %d tasks, want %d", job.indexVar, g.Type, job.count, len(tasks))
			}
			for i := 0; i <= job.count; i++ { // one past the end: refused
				log, path := fakeKiln(t)
				cmd := exec.Command(job.command[0], job.command[1:]...)
				cmd.Env = append(append(path, job.env...), job.indexVar+"="+strconv.Itoa(i))
				out, err := cmd.CombinedOutput()
				logged, _ := os.ReadFile(log)
				if i == job.count {
					if err == nil || !strings.Contains(string(out), "no variant for index") {
						t.Errorf("%s index %d past the end = %v %s, want a refusal", g.Type, i, err, out)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s %s=%d: %v\n%s", g.Type, job.indexVar, i, err, out)
				}
				calib := ""
				if p.Variants[i].Precision == manifest.INT8 {
					calib = " --calib-data gs://my-bucket/calib --calib-preprocess imagenet"
				}
				want := "convert gs://my-bucket/models/resnet50.onnx --repo /work/repo --variant " + tasks[i].Variant + calib + " --trt-version 10.3.0 --progress plain\n" +
					"pack /work/repo --to gs://my-bucket/kiln-cache/" + tasks[i].Key + " --allow-unchecked --progress plain\n"
				if got := string(logged); !strings.HasSuffix(got, want) {
					t.Errorf("%s %s=%d ran\n%s\nwant it to end with\n%s", g.Type, job.indexVar, i, got, want)
				}
			}
		}
	}
}

// The final job of every GPU type, on both platforms, merges every cached
// build of that GPU into one repository, serves it and publishes it to
// that GPU's tag: the script is run with /bin/sh as the container runs it.
func TestFinalAssembles(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	p := testPlan(t)
	_, k8s, err := p.GKEJobs()
	if err != nil {
		t.Fatal(err)
	}
	_, cr, err := p.CloudRunJobs()
	if err != nil {
		t.Fatal(err)
	}
	for gi, g := range p.GPUs {
		var from string
		for _, task := range p.Tasks(g) {
			from += " --from gs://my-bucket/kiln-cache/" + task.Key
		}
		want := "pack" + from + " --to dir:/work/repo --progress plain\n" +
			"serve /work/repo --data gs://my-bucket/val\n" +
			"pack /work/repo --to image:europe-docker.pkg.dev/my-project/models/resnet:1-" + g.Short + " --progress plain\n"
		for _, c := range []corev1.Container{k8s[gi].Spec.Template.Spec.Containers[0], cr[gi].Spec.Template.Spec.Template.Spec.Containers[0]} {
			dir := t.TempDir()
			log := filepath.Join(dir, "log")
			if err := os.WriteFile(filepath.Join(dir, "kiln"), []byte("#!/bin/sh\necho \"$*\" >> "+log+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(c.Command[0], c.Command[1:]...)
			cmd.Env = append(envOf(c.Env), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KILN_SERVE_FLAGS=--data gs://my-bucket/val")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s final: %v\n%s", g.Type, err, out)
			}
			if got, _ := os.ReadFile(log); string(got) != want {
				t.Errorf("%s final ran\n%s\nwant\n%s", g.Type, got, want)
			}
		}
	}
}

func envOf(env []corev1.EnvVar) []string {
	var out []string
	for _, e := range env {
		out = append(out, e.Name+"="+e.Value)
	}
	return out
}

func TestTasksKeys(t *testing.T) {
	p := testPlan(t)
	l4, rtx := p.Tasks(p.GPUs[0]), p.Tasks(p.GPUs[1])
	want := testDigest.Hex() + "/trt-fp16-sm89/trt-10.3.0/sm89"
	if l4[1].Variant != "trt-fp16-sm89" || l4[1].Key != want {
		t.Errorf("Tasks(l4)[1] = %+v, want variant trt-fp16-sm89 key %s", l4[1], want)
	}
	if rtx[0].Variant != "onnx-fp16" || !strings.HasSuffix(rtx[0].Key, "/onnx-fp16/trt-10.3.0/sm120") {
		t.Errorf("Tasks(rtx)[0] = %+v", rtx[0])
	}
	if !strings.HasPrefix(l4[2].Key, testDigest.Hex()+"/trt-int8-b16-x2-sm89/calib-") || strings.Contains(l4[1].Key, "calib-") {
		t.Errorf("int8 key %s, fp16 key %s: want the calibration in the int8 key only", l4[2].Key, l4[1].Key)
	}
	other := p
	other.Calibration = []string{"--calib-data", "gs://my-bucket/other"}
	if k := other.Tasks(p.GPUs[0]); k[2].Key == l4[2].Key || k[1].Key != l4[1].Key {
		t.Errorf("other calibration data: int8 key %s (was %s), fp16 key %s (was %s)", k[2].Key, l4[2].Key, k[1].Key, l4[1].Key)
	}
	seen := map[string]bool{}
	for _, task := range append(l4, rtx...) {
		if seen[task.Key] {
			t.Errorf("cache key %s appears twice", task.Key)
		}
		seen[task.Key] = true
	}
}

func TestPlanRefuses(t *testing.T) {
	cases := []struct {
		name   string
		change func(*Plan)
		want   string
	}{
		{"cache not gs", func(p *Plan) { p.Cache = "/tmp/cache" }, "want gs://BUCKET/PREFIX"},
		{"shell in source", func(p *Plan) { p.Source = "x; rm -rf /" }, "without spaces or quotes"},
		{"trt without version", func(p *Plan) { p.TRT = "" }, "needs the TensorRT version"},
		{"image without tag", func(p *Plan) { p.To = []string{"image:reg/repo"} }, "image:REPO:TAG"},
		{"no variants", func(p *Plan) { p.Variants = nil }, "at least one variant"},
		{"int8 without calibration", func(p *Plan) { p.Calibration = nil }, "variant trt-int8-b16-x2: an int8 variant needs calibration data"},
		{"shell in calibration", func(p *Plan) { p.Calibration = []string{"--calib-data", "gs://b/c d"} }, "no spaces or quotes"},
		{"bad digest", func(p *Plan) { p.SourceDigest = "sha256:12" }, "sha256:<64 hex digits>"},
	}
	for _, c := range cases {
		p := testPlan(t)
		c.change(&p)
		if _, err := PlanFiles(p, []string{PlatformGKE}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: PlanFiles = %v, want %q", c.name, err, c.want)
		}
	}
	p := testPlan(t)
	p.CPU = 8 // RTX PRO 6000 needs 20 (deploy-rules §1)
	if _, err := PlanFiles(p, []string{PlatformCloudRun}); err == nil || !strings.Contains(err.Error(), "Cloud Run GPU sizing") {
		t.Errorf("Cloud Run jobs with 8 CPU on RTX PRO 6000 = %v, want the sizing rule", err)
	}
	t4, _ := LookupGPU("nvidia-tesla-t4")
	p = testPlan(t)
	p.GPUs = []GPU{t4}
	if _, err := PlanFiles(p, []string{PlatformCloudRun}); err == nil || !strings.Contains(err.Error(), "Cloud Run GPU types") {
		t.Errorf("Cloud Run jobs on T4 = %v, want the GPU types rule", err)
	}
}
