package workflows

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kiln-ml/kiln/manifest"
)

// Triton's ports (deploy-rules §6): HTTP/REST, gRPC, Prometheus metrics.
const (
	PortHTTP    = 8000
	PortGRPC    = 8001
	PortMetrics = 8002
)

// Triton's health endpoints (KServe v2), probed on PortHTTP (deploy-rules §6).
const (
	pathLive  = "/v2/health/live"
	pathReady = "/v2/health/ready"
)

// DefaultGPUQuota is the GPU quota a project gets in a region on its first
// Cloud Run GPU deployment: 3 GPUs, zonal redundancy off (deploy-rules §3).
const DefaultGPUQuota = 3

// Deploy describes one deployment of a packed serving image.
type Deploy struct {
	// Service names the Cloud Run service and worker pool and the GKE
	// Deployment, Service and HPA.
	Service string
	// Project is the Google Cloud project (the Cloud Run namespace); Region
	// the Cloud Run region.
	Project, Region string
	// Image is the serving image reference and Digest the digest `kiln
	// pack` recorded for it; the manifests pin Image@Digest.
	Image  string
	Digest manifest.Digest
	// GPU is the GPU type (LookupGPU).
	GPU GPU
	// CPU and Memory size each instance (0: the GPU's recommended size).
	CPU    int
	Memory int64
	// MinInstances and MaxInstances bound scaling; MaxInstances must not
	// exceed GPUQuota, the region's GPU quota all services share
	// (deploy-rules §3). 0 MaxInstances: GPUQuota.
	MinInstances, MaxInstances, GPUQuota int
	// ZonalRedundancy reserves GPU capacity across zones at a higher price;
	// the default quota is for redundancy off (deploy-rules §3).
	ZonalRedundancy bool
	// Models are the repository's models (kiln.json); TensorRT plans among
	// them must be built for the GPU's compute capability.
	Models []*manifest.Model
}

var dnsLabel = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,47}[a-z0-9])?$`)

// withDefaults fills the sizes left zero.
func (d Deploy) withDefaults() Deploy {
	cpu, mem := 8, int64(32*gib) // GKE: the L4 recommendation (deploy-rules §1)
	if d.GPU.CloudRun != nil {
		cpu, mem = d.GPU.CloudRun.RecommendedCPU, d.GPU.CloudRun.RecommendedMemory
	}
	if d.CPU == 0 {
		d.CPU = cpu
	}
	if d.Memory == 0 {
		d.Memory = mem
	}
	if d.GPUQuota == 0 {
		d.GPUQuota = DefaultGPUQuota
	}
	if d.MaxInstances == 0 {
		d.MaxInstances = d.GPUQuota
	}
	return d
}

// Validate checks what every target needs: names, the image digest, the
// instance bounds, and that every TensorRT plan matches the GPU.
func (d Deploy) Validate() error {
	if !dnsLabel.MatchString(d.Service) {
		return fmt.Errorf("service name %q: want lower-case letters, digits and '-', starting with a letter, at most 49 characters", d.Service)
	}
	if d.Image == "" || strings.ContainsAny(d.Image, "@ \t\n") {
		return fmt.Errorf("image %q: want a reference without a digest (the digest is given apart)", d.Image)
	}
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("image %s: %w", d.Image, err)
	}
	if d.MinInstances < 0 || d.MaxInstances < 1 || d.MinInstances > d.MaxInstances {
		return fmt.Errorf("instances: want 0 <= min (%d) <= max (%d), max >= 1", d.MinInstances, d.MaxInstances)
	}
	if d.CPU < 1 || d.Memory < 1 {
		return errors.New("cpu and memory must be positive")
	}
	return checkPlans(d.Models, d.GPU)
}

// checkPlans refuses TensorRT plans built for another GPU architecture
// than g's: they would not load (DESIGN.md, "The precision ladder").
func checkPlans(models []*manifest.Model, g GPU) error {
	for _, m := range models {
		if m.Variant.Runtime != manifest.RuntimeTRT || m.Status == manifest.StatusNeedsGPU {
			continue
		}
		cc := m.Variant.Target
		if m.Build != nil && m.Build.ComputeCapability != "" {
			cc = m.Build.ComputeCapability
		}
		if cc == "" {
			return &RuleError{Rule: "TensorRT plans match the GPU", Msg: fmt.Sprintf("model %s: kiln.json records no compute capability; %s needs plans for sm%s", m.Name, g.Type, strings.ReplaceAll(g.ComputeCapability, ".", ""))}
		}
		if norm, err := manifest.ParseComputeCapability(cc); err == nil && norm != g.ComputeCapability {
			return &RuleError{Rule: "TensorRT plans match the GPU", Msg: fmt.Sprintf("model %s was built for compute capability %s, %s is %s", m.Name, norm, g.Type, g.ComputeCapability)}
		}
	}
	return nil
}

// pinned is the image reference pinned by digest.
func (d Deploy) pinned() string { return d.Image + "@" + string(d.Digest) }

// resources are the instance's limits: CPU, memory and one GPU.
func (d Deploy) resources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(d.CPU), resource.DecimalSI),
		corev1.ResourceMemory: resource.MustParse(quantity(d.Memory)),
		resourceGPU:           resource.MustParse("1"), // deploy-rules §1: exactly one GPU per instance
	}}
}

// httpProbe probes path on Triton's HTTP port.
func httpProbe(path string, delay, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(PortHTTP)}},
		InitialDelaySeconds: delay, PeriodSeconds: period, FailureThreshold: failures,
	}
}

// CloudRunService returns the Cloud Run service, after checking Cloud Run's
// rules for services (deploy-rules §1–§4).
func (d Deploy) CloudRunService() (*CloudRunService, error) {
	d = d.withDefaults()
	if err := d.cloudRunChecks("service"); err != nil {
		return nil, err
	}
	annotations := map[string]string{
		annotationMaxScale: strconv.Itoa(d.MaxInstances),
		// deploy-rules §3: GPUs need instance-based billing.
		annotationCPUThrottling:     "false",
		annotationRedundancyDisable: strconv.FormatBool(!d.ZonalRedundancy),
	}
	if d.MinInstances > 0 {
		annotations[annotationMinScale] = strconv.Itoa(d.MinInstances)
	}
	c := corev1.Container{
		Name:  "triton",
		Image: d.pinned(),
		// Cloud Run routes requests to one port; http1 is Triton's HTTP/REST (deploy-rules §4, §6).
		Ports:     []corev1.ContainerPort{{Name: "http1", ContainerPort: PortHTTP}},
		Resources: d.resources(),
		// Model load (TensorRT engines deserialized on the GPU) can take
		// minutes; the sample's 1800 × 1 s allows 30 (deploy-rules §4).
		StartupProbe: httpProbe(pathReady, 0, 1, 1800),
	}
	c.StartupProbe.TimeoutSeconds = 1
	return &CloudRunService{
		APIVersion: knativeServingV1, Kind: "Service",
		Metadata: d.cloudRunMeta(),
		Spec: ServiceSpec{Template: RevisionTemplate{
			Metadata: Meta{Annotations: annotations},
			Spec: RevisionSpec{
				NodeSelector: map[string]string{selectorCloudRunAccelerator: d.GPU.Type},
				Containers:   []corev1.Container{c},
			},
		}},
	}, nil
}

// CloudRunWorkerPool returns the worker pool running the same image, after
// checking Cloud Run's rules for worker pools: its only template
// annotation is zonal redundancy, and it has no port or probe
// (deploy-rules §4, "Services vs worker pools").
func (d Deploy) CloudRunWorkerPool() (*CloudRunWorkerPool, error) {
	d = d.withDefaults()
	if err := d.cloudRunChecks("worker pool"); err != nil {
		return nil, err
	}
	return &CloudRunWorkerPool{
		APIVersion: cloudRunV1, Kind: "WorkerPool",
		Metadata: d.cloudRunMeta(),
		Spec: WorkerPoolSpec{Template: RevisionTemplate{
			Metadata: Meta{Annotations: map[string]string{annotationRedundancyDisable: strconv.FormatBool(!d.ZonalRedundancy)}},
			Spec: RevisionSpec{
				NodeSelector: map[string]string{selectorCloudRunAccelerator: d.GPU.Type},
				Containers:   []corev1.Container{{Name: "triton", Image: d.pinned(), Resources: d.resources()}},
			},
		}},
	}, nil
}

func (d Deploy) cloudRunChecks(kind string) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if d.Project == "" {
		return errors.New("cloud run: give the project")
	}
	if d.MaxInstances > d.GPUQuota {
		// deploy-rules §3: max instances must not exceed the region's GPU
		// quota, which every service in the region shares.
		return &RuleError{Rule: "Cloud Run GPU quota", Msg: fmt.Sprintf("max instances %d exceed the region's GPU quota of %d (one GPU per instance); request more quota and give --gpu-quota", d.MaxInstances, d.GPUQuota)}
	}
	return cloudRunRules(d.GPU, kind, d.Region, d.CPU, d.Memory)
}

func (d Deploy) cloudRunMeta() Meta {
	return Meta{Name: d.Service, Namespace: d.Project, Labels: map[string]string{labelLocation: d.Region}}
}

// Notes are what the summary tells about the deployment without refusing
// it: LIMITED regions and what the documents leave out (deploy-rules §2, §6).
func (d Deploy) Notes() []string {
	notes := regionNotes(d.GPU, d.Region)
	if d.GPU.CloudRun != nil && !d.GPU.workerPools() {
		notes = append(notes, "no Cloud Run worker pool written: no region is documented for "+d.GPU.Type+" worker pools (deploy-rules §2)")
	}
	return append(notes, "the GKE HorizontalPodAutoscaler reads "+queueMetric+" through a custom-metrics adapter (e.g. Managed Service for Prometheus), which the cluster needs")
}
