package workflows

import (
	"bytes"
	"fmt"
	"sort"

	"sigs.k8s.io/yaml"
)

// File is one generated file: its name (relative to the output
// directory), its content, and what it is.
type File struct {
	Name    string `json:"name"`
	What    string `json:"what"`
	Content []byte `json:"-"`
}

// marshalDocs writes objects as one YAML stream, "---" between documents.
// sigs.k8s.io/yaml goes through the objects' JSON tags, as kubectl does,
// so what is written is what the API types decode.
func marshalDocs(objs ...any) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		b, err := marshalSpec(o)
		if err != nil {
			return nil, fmt.Errorf("writing YAML: %w", err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// marshalSpec writes one object without its status: the API types carry
// an empty status (and an HPA's zero desiredReplicas) that a manifest has
// no business setting.
func marshalSpec(o any) ([]byte, error) {
	b, err := yaml.Marshal(o)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if _, ok := m["status"]; !ok {
		return b, nil
	}
	delete(m, "status")
	return yaml.Marshal(m)
}

// Platforms a deployment is written for.
const (
	PlatformCloudRun = "cloud-run"
	PlatformGKE      = "gke"
)

// DeployFiles writes the deployment's files for the platforms asked for:
// cloudrun-service.yaml and cloudrun-worker-pool.yaml for Cloud Run,
// gke.yaml (Deployment, Service, HorizontalPodAutoscaler) for GKE.
func DeployFiles(d Deploy, platforms []string) ([]File, error) {
	var files []File
	add := func(name, what string, objs ...any) error {
		b, err := marshalDocs(objs...)
		if err == nil {
			files = append(files, File{Name: name, What: what, Content: b})
		}
		return err
	}
	for _, p := range platforms {
		switch p {
		case PlatformCloudRun:
			svc, err := d.CloudRunService()
			if err != nil {
				return nil, err
			}
			if err := add("cloudrun-service.yaml", "Cloud Run service", svc); err != nil {
				return nil, err
			}
			if !d.GPU.workerPools() {
				continue // no region is documented (Deploy.Notes says so)
			}
			wp, err := d.CloudRunWorkerPool()
			if err != nil {
				return nil, err
			}
			if err := add("cloudrun-worker-pool.yaml", "Cloud Run worker pool", wp); err != nil {
				return nil, err
			}
		case PlatformGKE:
			dep, svc, hpa, err := d.GKE()
			if err != nil {
				return nil, err
			}
			if err := add("gke.yaml", "GKE Deployment, Service and HorizontalPodAutoscaler", dep, svc, hpa); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("platform %q: want %s or %s", p, PlatformCloudRun, PlatformGKE)
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return files, nil
}
