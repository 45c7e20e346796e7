// Package workflows writes what runs kiln's output on Google Cloud: Cloud
// Run GPU services and worker pools (Knative serving.knative.dev/v1 and
// run.googleapis.com/v1 YAML, as `gcloud run services replace` takes it),
// GKE Deployments, Services and HorizontalPodAutoscalers for Triton, and the
// build plan of a variant matrix as Kubernetes Indexed Jobs and Cloud Run
// jobs. The rules it checks come from the Cloud Run GPU documentation as
// ../shared/reference/deploy-rules.md records it (cited by section as
// "deploy-rules §N"). The directory also holds Cloud Build, GitHub Actions
// and batch-job templates.
package workflows

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// GPU is one GPU type kiln deploys to: its names on Cloud Run and GKE and
// the compute capability its TensorRT plans must be built for.
type GPU struct {
	// Type is the value of --gpu-type: Cloud Run's type value where Cloud
	// Run offers the GPU, else GKE's accelerator label.
	Type string
	// Short is the type in resource names ("l4").
	Short string
	// ComputeCapability is what `nvidia-smi` reports ("8.9"); TensorRT
	// engines run only on the architecture they were built for (DESIGN.md,
	// "The precision ladder and TensorRT versions").
	ComputeCapability string
	// GKEAccelerator is the node label value of
	// cloud.google.com/gke-accelerator on a GKE GPU node pool (deploy-rules
	// §4: a GAP in the seed documents; the label is GKE's own).
	GKEAccelerator string
	// CloudRun is set for the types Cloud Run offers (deploy-rules §1), with
	// their minimum and recommended instance sizes.
	CloudRun *CloudRunSizing
}

// CloudRunSizing is what a Cloud Run instance with the GPU needs
// (deploy-rules §1): at least MinCPU CPUs and MinMemory bytes; Recommended
// sizes are the defaults kiln writes.
type CloudRunSizing struct {
	MinCPU, RecommendedCPU       int
	MinMemory, RecommendedMemory int64
	// ServiceRegions and WorkerPoolRegions are where the type is offered
	// (deploy-rules §2).
	ServiceRegions, WorkerPoolRegions []string
}

const gib = 1 << 30

// Regions where Cloud Run offers L4 GPUs to services and worker pools
// (deploy-rules §2). asia-south1 is by invitation only; us-central1 and
// us-east4 may need a quota request to scale (notes, not errors).
var l4Regions = []string{"asia-south1", "asia-southeast1", "europe-west1", "europe-west4", "us-central1", "us-east4"}

// gpus is every GPU type kiln knows, by --gpu-type value.
var gpus = []GPU{
	// deploy-rules §1: nvidia-l4 needs 4 CPU and 16Gi, 8 CPU / 32Gi recommended.
	{Type: "nvidia-l4", Short: "l4", ComputeCapability: "8.9", GKEAccelerator: "nvidia-l4",
		CloudRun: &CloudRunSizing{MinCPU: 4, RecommendedCPU: 8, MinMemory: 16 * gib, RecommendedMemory: 32 * gib,
			ServiceRegions: l4Regions, WorkerPoolRegions: l4Regions}},
	// deploy-rules §1: nvidia-rtx-pro-6000 needs 20 CPU and 80Gi, no
	// recommendation; §2: services in four regions, the worker-pool page
	// lists none (GAP), so worker pools are refused for it.
	{Type: "nvidia-rtx-pro-6000", Short: "rtx-pro-6000", ComputeCapability: "12.0", GKEAccelerator: "nvidia-rtx-pro-6000",
		CloudRun: &CloudRunSizing{MinCPU: 20, RecommendedCPU: 20, MinMemory: 80 * gib, RecommendedMemory: 80 * gib,
			ServiceRegions: []string{"asia-south2", "asia-southeast1", "europe-west4", "us-central1"}}},
	// GKE only: the GKE tutorial's T4 (deploy-rules §5), A100 and H100.
	{Type: "nvidia-tesla-t4", Short: "t4", ComputeCapability: "7.5", GKEAccelerator: "nvidia-tesla-t4"},
	{Type: "nvidia-tesla-a100", Short: "a100", ComputeCapability: "8.0", GKEAccelerator: "nvidia-tesla-a100"},
	{Type: "nvidia-h100-80gb", Short: "h100", ComputeCapability: "9.0", GKEAccelerator: "nvidia-h100-80gb"},
}

// GPUTypes lists the --gpu-type values kiln knows, sorted.
func GPUTypes() []string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = g.Type
	}
	sort.Strings(out)
	return out
}

// LookupGPU returns the GPU of a --gpu-type value, or an error naming the
// types kiln knows.
func LookupGPU(typ string) (GPU, error) {
	for _, g := range gpus {
		if g.Type == typ {
			return g, nil
		}
	}
	return GPU{}, &RuleError{Rule: "GPU types", Msg: fmt.Sprintf("GPU type %q is not one of %s", typ, strings.Join(GPUTypes(), ", "))}
}

// RuleError is a deployment that breaks a platform rule: Rule names it
// ("Cloud Run GPU sizing"), Msg says how.
type RuleError struct {
	Rule string
	Msg  string
}

func (e *RuleError) Error() string { return e.Rule + ": " + e.Msg }

// cloudRunRules checks a Cloud Run placement of g: the type must be one
// Cloud Run offers, in a region that offers it for the kind ("service" or
// "worker pool"), with at least the minimum CPUs and memory (deploy-rules
// §1, §2).
func cloudRunRules(g GPU, kind, region string, cpu int, memory int64) error {
	if g.CloudRun == nil {
		return &RuleError{Rule: "Cloud Run GPU types", Msg: fmt.Sprintf("Cloud Run offers nvidia-l4 and nvidia-rtx-pro-6000, not %s (deploy to GKE instead)", g.Type)}
	}
	regions := g.CloudRun.ServiceRegions
	if kind == "worker pool" {
		regions = g.CloudRun.WorkerPoolRegions
	}
	if len(regions) == 0 {
		return &RuleError{Rule: "Cloud Run GPU regions", Msg: fmt.Sprintf("no region offers %s to Cloud Run %ss", g.Type, kind)}
	}
	if !slices.Contains(regions, region) {
		return &RuleError{Rule: "Cloud Run GPU regions", Msg: fmt.Sprintf("%s is not offered to Cloud Run %ss in %q; regions: %s", g.Type, kind, region, strings.Join(regions, ", "))}
	}
	if cpu < g.CloudRun.MinCPU {
		return &RuleError{Rule: "Cloud Run GPU sizing", Msg: fmt.Sprintf("%s needs at least %d CPU, not %d", g.Type, g.CloudRun.MinCPU, cpu)}
	}
	if memory < g.CloudRun.MinMemory {
		return &RuleError{Rule: "Cloud Run GPU sizing", Msg: fmt.Sprintf("%s needs at least %s of memory, not %s", g.Type, quantity(g.CloudRun.MinMemory), quantity(memory))}
	}
	return nil
}

// workerPools reports whether Cloud Run documents regions for worker pools
// with g (deploy-rules §2).
func (g GPU) workerPools() bool { return g.CloudRun != nil && len(g.CloudRun.WorkerPoolRegions) > 0 }

// regionNotes are what deploy-rules §2 marks LIMITED for a region: true
// for the region, said in the summary, not refused.
func regionNotes(g GPU, region string) []string {
	if g.Type != "nvidia-l4" {
		return nil
	}
	switch region {
	case "asia-south1":
		return []string{"asia-south1 offers L4 GPUs by invitation only (deploy-rules §2)"}
	case "us-central1", "us-east4":
		return []string{region + ": scaling L4 GPUs may need a quota request (deploy-rules §2)"}
	}
	return nil
}

// quantity writes bytes as a Kubernetes quantity in the largest binary unit
// that keeps it whole ("32Gi").
func quantity(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.suffix)
		}
	}
	return fmt.Sprint(n)
}
