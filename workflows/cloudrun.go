package workflows

import (
	corev1 "k8s.io/api/core/v1"
)

// The Cloud Run Admin API v1 objects kiln writes: a Knative
// serving.knative.dev/v1 Service, a run.googleapis.com/v1 WorkerPool and a
// run.googleapis.com/v1 Job, in the shape `gcloud run services replace`,
// `gcloud run worker-pools replace` and `gcloud run jobs replace` read
// (deploy-rules §4; the Cloud Run YAML reference). k8s.io/api has no
// types for them; their containers are Kubernetes containers.

// Cloud Run API versions and kinds (deploy-rules §4).
const (
	knativeServingV1 = "serving.knative.dev/v1"
	cloudRunV1       = "run.googleapis.com/v1"
)

// Annotation and label names Cloud Run reads (deploy-rules §3, §4).
const (
	annotationMaxScale          = "autoscaling.knative.dev/maxScale"
	annotationMinScale          = "autoscaling.knative.dev/minScale"
	annotationCPUThrottling     = "run.googleapis.com/cpu-throttling"
	annotationRedundancyDisable = "run.googleapis.com/gpu-zonal-redundancy-disabled"
	labelLocation               = "cloud.googleapis.com/location"
	selectorCloudRunAccelerator = "run.googleapis.com/accelerator"
	resourceGPU                 = corev1.ResourceName("nvidia.com/gpu")
)

// Meta is the metadata of a Cloud Run object: its name, the project as
// namespace, the region label and annotations.
type Meta struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// CloudRunService is a Cloud Run service (Knative Service).
type CloudRunService struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Metadata   Meta        `json:"metadata"`
	Spec       ServiceSpec `json:"spec"`
}

// ServiceSpec is a service's spec: the template of its revisions.
type ServiceSpec struct {
	Template RevisionTemplate `json:"template"`
}

// RevisionTemplate is the template of a revision (of a service or a
// worker pool): annotations that configure scaling and the GPU, and the
// containers.
type RevisionTemplate struct {
	Metadata Meta         `json:"metadata"`
	Spec     RevisionSpec `json:"spec"`
}

// RevisionSpec is a revision's containers and where they run.
type RevisionSpec struct {
	// ContainerConcurrency is the most requests one instance takes at once
	// (0: Cloud Run's default).
	ContainerConcurrency int64 `json:"containerConcurrency,omitempty"`
	// TimeoutSeconds is the request timeout.
	TimeoutSeconds int64 `json:"timeoutSeconds,omitempty"`
	// NodeSelector holds run.googleapis.com/accelerator: the GPU type.
	NodeSelector map[string]string  `json:"nodeSelector,omitempty"`
	Containers   []corev1.Container `json:"containers"`
}

// CloudRunWorkerPool is a Cloud Run worker pool: instances without
// requests, which Cloud Run does not autoscale (deploy-rules §4).
type CloudRunWorkerPool struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   Meta           `json:"metadata"`
	Spec       WorkerPoolSpec `json:"spec"`
}

// WorkerPoolSpec is a worker pool's spec.
type WorkerPoolSpec struct {
	Template RevisionTemplate `json:"template"`
}

// CloudRunJob is a Cloud Run job: TaskCount tasks, each told its index in
// CLOUD_RUN_TASK_INDEX.
type CloudRunJob struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   Meta    `json:"metadata"`
	Spec       JobSpec `json:"spec"`
}

// JobSpec is a job's spec: the template of its executions.
type JobSpec struct {
	Template ExecutionTemplate `json:"template"`
}

// ExecutionTemplate is the template of one execution of a job.
type ExecutionTemplate struct {
	Metadata Meta          `json:"metadata"`
	Spec     ExecutionSpec `json:"spec"`
}

// ExecutionSpec says how many tasks run, how many at once, and each one's template.
type ExecutionSpec struct {
	Parallelism int          `json:"parallelism,omitempty"`
	TaskCount   int          `json:"taskCount"`
	Template    TaskTemplate `json:"template"`
}

// TaskTemplate is the template of one task.
type TaskTemplate struct {
	Spec TaskSpec `json:"spec"`
}

// TaskSpec is a task's containers, retries, timeout and GPU.
type TaskSpec struct {
	Containers     []corev1.Container `json:"containers"`
	MaxRetries     int                `json:"maxRetries"`
	TimeoutSeconds string             `json:"timeoutSeconds,omitempty"`
	NodeSelector   map[string]string  `json:"nodeSelector,omitempty"`
}
