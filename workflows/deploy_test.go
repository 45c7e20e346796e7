package workflows

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

const testDigest = manifest.Digest("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")

func testDeploy(t *testing.T, gpu string) Deploy {
	t.Helper()
	g, err := LookupGPU(gpu)
	if err != nil {
		t.Fatal(err)
	}
	return Deploy{
		Service: "resnet", Project: "my-project", Region: "europe-west4",
		Image: "europe-docker.pkg.dev/my-project/models/resnet", Digest: testDigest, GPU: g,
		Models: []*manifest.Model{
			{Name: "resnet_onnx_fp16", Variant: manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: manifest.FP16}, Status: manifest.StatusOK},
			{Name: "resnet_trt_fp16", Variant: manifest.Variant{Runtime: manifest.RuntimeTRT, Precision: manifest.FP16},
				Build: &manifest.Build{ComputeCapability: g.ComputeCapability}, Status: manifest.StatusOK},
		},
	}
}

// strict decodes one YAML document into v, refusing fields v lacks.
func strict(t *testing.T, doc []byte, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		t.Fatalf("decoding %T strictly: %v\n%s", v, err, doc)
	}
}

func docs(b []byte) [][]byte { return bytes.Split(b, []byte("\n---\n")) }

func fileNamed(t *testing.T, files []File, name string) []byte {
	t.Helper()
	for _, f := range files {
		if f.Name == name {
			return f.Content
		}
	}
	t.Fatalf("no file %s among %v", name, files)
	return nil
}

func TestDeployGolden(t *testing.T) {
	for _, gpu := range []string{"nvidia-l4", "nvidia-rtx-pro-6000"} {
		t.Run(gpu, func(t *testing.T) {
			files, err := DeployFiles(testDeploy(t, gpu), []string{PlatformCloudRun, PlatformGKE})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				testutil.Golden(t, f.Name, f.Content)
			}
		})
	}
}

func TestCloudRunServiceFields(t *testing.T) {
	files, err := DeployFiles(testDeploy(t, "nvidia-l4"), []string{PlatformCloudRun})
	if err != nil {
		t.Fatal(err)
	}
	var svc CloudRunService
	strict(t, fileNamed(t, files, "cloudrun-service.yaml"), &svc)
	tmpl := svc.Spec.Template
	c := tmpl.Spec.Containers[0]
	checks := []struct {
		what      string
		got, want any
	}{
		{"apiVersion", svc.APIVersion, "serving.knative.dev/v1"},
		{"kind", svc.Kind, "Service"},
		{"namespace", svc.Metadata.Namespace, "my-project"},
		{"location", svc.Metadata.Labels["cloud.googleapis.com/location"], "europe-west4"},
		{"accelerator", tmpl.Spec.NodeSelector["run.googleapis.com/accelerator"], "nvidia-l4"},
		{"cpu-throttling", tmpl.Metadata.Annotations["run.googleapis.com/cpu-throttling"], "false"},
		{"maxScale", tmpl.Metadata.Annotations["autoscaling.knative.dev/maxScale"], "3"},
		{"redundancy", tmpl.Metadata.Annotations["run.googleapis.com/gpu-zonal-redundancy-disabled"], "true"},
		{"image", c.Image, "europe-docker.pkg.dev/my-project/models/resnet@" + string(testDigest)},
		{"port", c.Ports[0].ContainerPort, int32(8000)},
		{"port name", c.Ports[0].Name, "http1"},
		{"gpu", c.Resources.Limits.Name("nvidia.com/gpu", "").String(), "1"},
		{"cpu", c.Resources.Limits.Cpu().String(), "8"},
		{"memory", c.Resources.Limits.Memory().String(), "32Gi"},
		{"startup path", c.StartupProbe.HTTPGet.Path, "/v2/health/ready"},
		{"startup window", c.StartupProbe.FailureThreshold * c.StartupProbe.PeriodSeconds, int32(1800)},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("service %s = %v, want %v", ch.what, ch.got, ch.want)
		}
	}
	var wp CloudRunWorkerPool
	strict(t, fileNamed(t, files, "cloudrun-worker-pool.yaml"), &wp)
	if wp.APIVersion != "run.googleapis.com/v1" || wp.Kind != "WorkerPool" || len(wp.Spec.Template.Metadata.Annotations) != 1 ||
		wp.Spec.Template.Spec.NodeSelector["run.googleapis.com/accelerator"] != "nvidia-l4" || len(wp.Spec.Template.Spec.Containers[0].Ports) != 0 {
		t.Errorf("worker pool = %+v", wp)
	}
}

func TestGKEFields(t *testing.T) {
	d := testDeploy(t, "nvidia-tesla-t4")
	d.Models = d.Models[:1]
	d.MinInstances, d.MaxInstances = 2, 10
	files, err := DeployFiles(d, []string{PlatformGKE})
	if err != nil {
		t.Fatal(err)
	}
	parts := docs(fileNamed(t, files, "gke.yaml"))
	if len(parts) != 3 {
		t.Fatalf("gke.yaml has %d documents, want 3", len(parts))
	}
	var dep appsv1.Deployment
	var svc corev1.Service
	var hpa autoscalingv2.HorizontalPodAutoscaler
	strict(t, parts[0], &dep)
	strict(t, parts[1], &svc)
	strict(t, parts[2], &hpa)
	pod := dep.Spec.Template
	c := pod.Spec.Containers[0]
	checks := []struct {
		what      string
		got, want any
	}{
		{"kind", dep.Kind, "Deployment"},
		{"replicas", *dep.Spec.Replicas, int32(2)},
		{"node selector", pod.Spec.NodeSelector["cloud.google.com/gke-accelerator"], "nvidia-tesla-t4"},
		{"gpu limit", c.Resources.Limits.Name("nvidia.com/gpu", "").String(), "1"},
		{"liveness", c.LivenessProbe.HTTPGet.Path + ":" + c.LivenessProbe.HTTPGet.Port.String(), "/v2/health/live:8000"},
		{"readiness", c.ReadinessProbe.HTTPGet.Path + ":" + c.ReadinessProbe.HTTPGet.Port.String(), "/v2/health/ready:8000"},
		{"metrics port", c.Ports[2].ContainerPort, int32(8002)},
		{"scrape", pod.Annotations["prometheus.io/scrape"], "true"},
		{"scrape port", pod.Annotations["prometheus.io/port"], "8002"},
		{"service ports", len(svc.Spec.Ports), 3},
		{"service selects pods", svc.Spec.Selector["app.kubernetes.io/name"], pod.Labels["app.kubernetes.io/name"]},
		{"hpa target", hpa.Spec.ScaleTargetRef.Name, "resnet"},
		{"hpa range", [2]int32{*hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas}, [2]int32{2, 10}},
		{"hpa metric", hpa.Spec.Metrics[0].Pods.Metric.Name, "nv_inference_queue_duration_us"},
		{"hpa target value", hpa.Spec.Metrics[0].Pods.Target.AverageValue.String(), "50k"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("gke %s = %v, want %v", ch.what, ch.got, ch.want)
		}
	}
}

// Every Cloud Run rule has a case that breaks it, refused with the rule's name.
func TestCloudRunRulesRefuse(t *testing.T) {
	cases := []struct {
		name   string
		gpu    string
		change func(*Deploy)
		rule   string
		want   string
	}{
		{"l4 too few CPUs", "nvidia-l4", func(d *Deploy) { d.CPU = 2 }, "Cloud Run GPU sizing", "at least 4 CPU"},
		{"l4 too little memory", "nvidia-l4", func(d *Deploy) { d.Memory = 8 * gib }, "Cloud Run GPU sizing", "at least 16Gi"},
		{"rtx too few CPUs", "nvidia-rtx-pro-6000", func(d *Deploy) { d.CPU = 8 }, "Cloud Run GPU sizing", "at least 20 CPU"},
		{"rtx too little memory", "nvidia-rtx-pro-6000", func(d *Deploy) { d.Memory = 64 * gib }, "Cloud Run GPU sizing", "at least 80Gi"},
		{"unsupported type", "nvidia-tesla-t4", func(d *Deploy) { d.Models = nil }, "Cloud Run GPU types", "not nvidia-tesla-t4"},
		{"l4 region", "nvidia-l4", func(d *Deploy) { d.Region = "asia-south2" }, "Cloud Run GPU regions", `"asia-south2"`},
		{"rtx region", "nvidia-rtx-pro-6000", func(d *Deploy) { d.Region = "europe-west1" }, "Cloud Run GPU regions", `"europe-west1"`},
		{"max over quota", "nvidia-l4", func(d *Deploy) { d.MaxInstances = 4 }, "Cloud Run GPU quota", "quota of 3"},
		{"plan for another GPU", "nvidia-l4", func(d *Deploy) { d.Models[1].Build.ComputeCapability = "9.0" }, "TensorRT plans match the GPU", "9.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := testDeploy(t, c.gpu)
			c.change(&d)
			_, err := d.CloudRunService()
			var re *RuleError
			if !errors.As(err, &re) || re.Rule != c.rule || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("CloudRunService() = %v, want the rule %q with %q", err, c.rule, c.want)
			}
		})
	}
	// A worker pool of RTX PRO 6000: no region is documented (deploy-rules §2, GAP).
	if _, err := testDeploy(t, "nvidia-rtx-pro-6000").CloudRunWorkerPool(); err == nil || !strings.Contains(err.Error(), "Cloud Run GPU regions") {
		t.Errorf("RTX PRO 6000 worker pool = %v, want a region rule error", err)
	}
	if _, err := LookupGPU("nvidia-v100"); err == nil || !strings.Contains(err.Error(), "GPU types") {
		t.Errorf("LookupGPU(nvidia-v100) = %v, want a GPU types error", err)
	}
}

func TestRegionNotes(t *testing.T) {
	d := testDeploy(t, "nvidia-l4")
	d.Region = "us-central1"
	if n := d.Notes(); len(n) == 0 || !strings.Contains(n[0], "quota request") {
		t.Errorf("Notes() in us-central1 = %v, want the quota note", n)
	}
	if _, err := d.CloudRunService(); err != nil {
		t.Errorf("a LIMITED region is refused: %v", err)
	}
}
