package workflows

import (
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// selectorGKEAccelerator is the node label of a GKE GPU node pool's
// accelerator type.
const selectorGKEAccelerator = "cloud.google.com/gke-accelerator"

// queueMetric is the Triton metric the HPA scales on: time requests wait
// in the queue, 50 ms per pod on average (deploy-rules §6: "scale on queue
// time"; the metric reaches the HPA through a custom-metrics adapter such
// as Google Cloud Managed Service for Prometheus, which the tutorial
// leaves out).
const (
	queueMetric = "nv_inference_queue_duration_us"
	queueTarget = "50000"
)

// GKE returns the Deployment, Service and HorizontalPodAutoscaler serving
// the image on a GKE GPU node pool of d.GPU's type.
func (d Deploy) GKE() (*appsv1.Deployment, *corev1.Service, *autoscalingv2.HorizontalPodAutoscaler, error) {
	d = d.withDefaults()
	if err := d.Validate(); err != nil {
		return nil, nil, nil, err
	}
	labels := map[string]string{"app.kubernetes.io/name": d.Service, "app.kubernetes.io/managed-by": "kiln"}
	replicas := int32(max(1, d.MinInstances))
	res := d.resources()
	res.Requests = corev1.ResourceList{
		corev1.ResourceCPU:    res.Limits[corev1.ResourceCPU],
		corev1.ResourceMemory: res.Limits[corev1.ResourceMemory],
		resourceGPU:           resource.MustParse("1"),
	}
	c := corev1.Container{
		Name:  "triton",
		Image: d.pinned(),
		Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: PortHTTP}, {Name: "grpc", ContainerPort: PortGRPC}, {Name: "metrics", ContainerPort: PortMetrics},
		},
		Resources: res,
		// deploy-rules §6: liveness and readiness on 8000, 30 s delay, every
		// 10 s; the startup probe holds them off for up to 30 min of model load.
		StartupProbe:   httpProbe(pathReady, 0, 10, 180),
		LivenessProbe:  httpProbe(pathLive, 30, 10, 3),
		ReadinessProbe: httpProbe(pathReady, 30, 10, 3),
	}
	dep := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: d.Service, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					// deploy-rules §6: Prometheus scrapes Triton's metrics port.
					"prometheus.io/scrape": "true",
					"prometheus.io/port":   strconv.Itoa(PortMetrics),
					"prometheus.io/path":   "/metrics",
				}},
				Spec: corev1.PodSpec{
					// A GPU is not shared between pods (deploy-rules §5): one per pod.
					NodeSelector: map[string]string{selectorGKEAccelerator: d.GPU.GKEAccelerator},
					Containers:   []corev1.Container{c},
				},
			},
		},
	}
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: d.Service, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: labels,
			Ports: []corev1.ServicePort{
				{Name: "http", Port: PortHTTP, TargetPort: intstr.FromString("http")},
				{Name: "grpc", Port: PortGRPC, TargetPort: intstr.FromString("grpc")},
				{Name: "metrics", Port: PortMetrics, TargetPort: intstr.FromString("metrics")},
			},
		},
	}
	return dep, svc, d.hpa(labels, replicas), nil
}

func (d Deploy) hpa(labels map[string]string, minReplicas int32) *autoscalingv2.HorizontalPodAutoscaler {
	target := resource.MustParse(queueTarget)
	return &autoscalingv2.HorizontalPodAutoscaler{
		TypeMeta:   metav1.TypeMeta{APIVersion: "autoscaling/v2", Kind: "HorizontalPodAutoscaler"},
		ObjectMeta: metav1.ObjectMeta{Name: d.Service, Labels: labels},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Service},
			MinReplicas:    &minReplicas,
			MaxReplicas:    int32(max(int(minReplicas), d.MaxInstances)),
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.PodsMetricSourceType,
				Pods: &autoscalingv2.PodsMetricSource{
					Metric: autoscalingv2.MetricIdentifier{Name: queueMetric},
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: &target},
				},
			}},
		},
	}
}
