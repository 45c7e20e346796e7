package workflows

import (
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sized is p's task size on g: given, else the GPU's recommended size.
func (p Plan) sized(g GPU) (int, int64) {
	d := Deploy{GPU: g, CPU: p.CPU, Memory: p.Memory}.withDefaults()
	return d.CPU, d.Memory
}

// container is the kiln container of a task of g running script.
func (p Plan) container(g GPU, script string) corev1.Container {
	cpu, mem := p.sized(g)
	return corev1.Container{
		Name:    "kiln",
		Image:   p.Image,
		Command: []string{"/bin/sh", "-c", script},
		Env: []corev1.EnvVar{
			{Name: "KILN_SOURCE", Value: p.Source},
			{Name: "KILN_CACHE", Value: p.Cache},
		},
		Resources:    Deploy{CPU: cpu, Memory: mem}.resources(),
		VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/work"}},
	}
}

// jobNames are the names of g's build and final jobs.
func (p Plan) jobNames(g GPU) (build, final string) {
	return p.Name + "-build-" + g.Short, p.Name + "-final-" + g.Short
}

// k8sJob is a Kubernetes Job on a GKE node pool of g's accelerator.
func (p Plan) k8sJob(g GPU, name, script string, completions int, indexed bool) *batchv1.Job {
	n := int32(completions)
	par := n
	if p.Parallelism > 0 && int32(p.Parallelism) < n {
		par = int32(p.Parallelism)
	}
	labels := map[string]string{"app.kubernetes.io/name": p.Name, "app.kubernetes.io/managed-by": "kiln", "kiln.dev/gpu-type": g.Short}
	spec := batchv1.JobSpec{
		Completions: &n,
		Parallelism: &par,
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				NodeSelector:  map[string]string{selectorGKEAccelerator: g.GKEAccelerator},
				Containers:    []corev1.Container{p.container(g, script)},
				Volumes:       []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		},
	}
	if indexed {
		mode := batchv1.IndexedCompletion
		perIndex := int32(1) // a failed build is retried once, alone
		spec.CompletionMode = &mode
		spec.BackoffLimitPerIndex = &perIndex
	} else {
		backoff := int32(1)
		spec.BackoffLimit = &backoff
	}
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       spec,
	}
}

// GKEJobs returns, per GPU type, the Indexed Job that builds every variant
// (index i builds Tasks(g)[i]) and the Job that assembles them into one
// repository, checks and publishes it, to apply once the first has completed.
func (p Plan) GKEJobs() (build, final []*batchv1.Job, err error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	for _, g := range p.GPUs {
		b, f := p.jobNames(g)
		build = append(build, p.k8sJob(g, b, p.buildScript(g, indexK8s), len(p.Variants), true))
		final = append(final, p.k8sJob(g, f, p.finalScript(g), 1, false))
	}
	return build, final, nil
}

// cloudRunJob is a Cloud Run job on g running taskCount tasks of script.
func (p Plan) cloudRunJob(g GPU, name, script string, taskCount int) *CloudRunJob {
	c := p.container(g, script)
	c.VolumeMounts = nil // Cloud Run tasks write /work to their in-memory file system
	par := taskCount
	if p.Parallelism > 0 && p.Parallelism < par {
		par = p.Parallelism
	}
	return &CloudRunJob{
		APIVersion: cloudRunV1, Kind: "Job",
		Metadata: Meta{Name: name, Namespace: p.Project, Labels: map[string]string{labelLocation: p.Region}},
		Spec: JobSpec{Template: ExecutionTemplate{
			// Zonal redundancy off: the quota a region starts with (deploy-rules §3).
			Metadata: Meta{Annotations: map[string]string{annotationRedundancyDisable: "true"}},
			Spec: ExecutionSpec{Parallelism: par, TaskCount: taskCount, Template: TaskTemplate{Spec: TaskSpec{
				Containers:     []corev1.Container{c},
				MaxRetries:     1,
				TimeoutSeconds: strconv.Itoa(6 * 3600), // engine builds take long; convert's own limit is --trt-timeout
				NodeSelector:   map[string]string{selectorCloudRunAccelerator: g.Type},
			}}},
		}},
	}
}

// CloudRunJobs returns, per GPU type Cloud Run offers, the build job (task
// i builds Tasks(g)[i]) and the final job, after checking Cloud Run's GPU
// rules. The seed documents cover GPUs on services and worker pools only
// (deploy-rules §4, GAP): jobs are held to the service rules.
func (p Plan) CloudRunJobs() (build, final []*CloudRunJob, err error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	for _, g := range p.GPUs {
		cpu, mem := p.sized(g)
		if err := cloudRunRules(g, "service", p.Region, cpu, mem); err != nil {
			return nil, nil, err
		}
		if p.Project == "" {
			return nil, nil, fmt.Errorf("cloud run jobs: give the project")
		}
		b, f := p.jobNames(g)
		build = append(build, p.cloudRunJob(g, b, p.buildScript(g, indexCloudRun), len(p.Variants)))
		final = append(final, p.cloudRunJob(g, f, p.finalScript(g), 1))
	}
	return build, final, nil
}

// PlanFiles writes the plan for the platforms asked for: gke-build.yaml
// and gke-final.yaml (one document per GPU type), and per GPU type
// cloudrun-build-<gpu>.yaml and cloudrun-final-<gpu>.yaml
// (`gcloud run jobs replace` takes one job a file).
func PlanFiles(p Plan, platforms []string) ([]File, error) {
	var files []File
	for _, pl := range platforms {
		switch pl {
		case PlatformGKE:
			build, final, err := p.GKEJobs()
			if err != nil {
				return nil, err
			}
			for _, f := range []struct {
				name, what string
				jobs       []*batchv1.Job
			}{{"gke-build.yaml", "GKE Indexed Jobs building every variant", build}, {"gke-final.yaml", "GKE Jobs assembling, checking and publishing the builds", final}} {
				objs := make([]any, len(f.jobs))
				for i, j := range f.jobs {
					objs[i] = j
				}
				b, err := marshalDocs(objs...)
				if err != nil {
					return nil, err
				}
				files = append(files, File{Name: f.name, What: f.what, Content: b})
			}
		case PlatformCloudRun:
			build, final, err := p.CloudRunJobs()
			if err != nil {
				return nil, err
			}
			for i, g := range p.GPUs {
				for _, j := range []*CloudRunJob{build[i], final[i]} {
					b, err := marshalDocs(j)
					if err != nil {
						return nil, err
					}
					files = append(files, File{Name: "cloudrun-" + j.Metadata.Name[len(p.Name)+1:] + ".yaml", What: "Cloud Run job " + j.Metadata.Name + " (" + g.Type + ")", Content: b})
				}
			}
		default:
			return nil, fmt.Errorf("platform %q: want %s or %s", pl, PlatformCloudRun, PlatformGKE)
		}
	}
	return files, nil
}
