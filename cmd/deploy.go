package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/workflows"
)

type deployOptions struct {
	d         workflows.Deploy
	gpuType   string
	image     string
	platforms []string
	output    string
	format    string
}

// platformFlag is --platform: where the manifests are for.
func platformFlag(f *pflag.FlagSet, p *[]string) {
	*p = []string{workflows.PlatformCloudRun, workflows.PlatformGKE}
	listFlag(f, p, "platform", "cloud-run,gke", "platforms to write for (default cloud-run,gke)", func(s string) (string, error) {
		if s != workflows.PlatformCloudRun && s != workflows.PlatformGKE {
			return "", fmt.Errorf("want one of %s, %s", workflows.PlatformCloudRun, workflows.PlatformGKE)
		}
		return s, nil
	}, func(s string) string { return s })
}

// gpuTypeChoices are the --gpu-type values, for help and parse-time checks.
func gpuTypeChoices() []string { return workflows.GPUTypes() }

func (o *deployOptions) addFlags(f *pflag.FlagSet) {
	choice(f, &o.gpuType, "gpu-type", "nvidia-l4", "GPU type: Cloud Run offers nvidia-l4 and nvidia-rtx-pro-6000; GKE also the others", gpuTypeChoices()...)
	f.StringVar(&o.d.Region, "region", "", "Cloud Run `REGION` (required for cloud-run)")
	f.StringVar(&o.d.Project, "project", "", "Google Cloud `PROJECT` (required for cloud-run)")
	f.StringVar(&o.d.Service, "service", "", "`NAME` of the service, worker pool and GKE objects (default: from the image name)")
	f.StringVar(&o.image, "image", "", "serving image `REF` that kiln pack published (default: the latest image: record in kiln.json)")
	f.IntVar(&o.d.CPU, "cpu", 0, "CPUs per instance (0: the GPU's recommended size: 8 for nvidia-l4, 20 for nvidia-rtx-pro-6000)")
	sizeFlag(f, &o.d.Memory, "memory", 0, "memory per instance, e.g. 32GiB (0: the GPU's recommended size: 32GiB for nvidia-l4, 80GiB for nvidia-rtx-pro-6000)")
	f.IntVar(&o.d.MinInstances, "min-instances", 0, "instances kept running (billed in full when idle); GKE runs at least 1")
	f.IntVar(&o.d.MaxInstances, "max-instances", 0, "most instances, one GPU each (0: --gpu-quota)")
	f.IntVar(&o.d.GPUQuota, "gpu-quota", workflows.DefaultGPUQuota, "the region's Cloud Run GPU quota, shared by every service there; --max-instances may not exceed it")
	f.BoolVar(&o.d.ZonalRedundancy, "gpu-zonal-redundancy", false, "reserve GPU capacity across zones (dearer; needs its own quota)")
	platformFlag(f, &o.platforms)
	f.StringVarP(&o.output, "output", "o", "", "`DIR` to write the manifests to (required)")
	formatFlag(f, &o.format)
}

func newDeployCmd() *cobra.Command {
	o := &deployOptions{}
	c := &cobra.Command{
		Use:   "deploy REPO -o DIR",
		Short: "Write Cloud Run GPU and GKE manifests serving a packed image",
		Long: `deploy writes, for the serving image kiln pack published from REPO (its digest
is read from REPO/kiln.json), a Cloud Run service with one GPU per instance
(cloudrun-service.yaml, for gcloud run services replace), the same as a Cloud
Run worker pool (cloudrun-worker-pool.yaml) and GKE manifests (gke.yaml: a
Deployment on the GPU's node pool, a Service and an HPA on Triton's queue
time). The image is pinned by digest.

Cloud Run's GPU rules are checked first and a deployment that breaks one is
refused naming the rule (exit 2): the GPU type and region, at least 4 CPU and
16GiB for nvidia-l4 and 20 CPU and 80GiB for nvidia-rtx-pro-6000, max
instances within the region's GPU quota. TensorRT plans in REPO must be built
for the GPU's compute capability (sm89 for nvidia-l4, sm120 for
nvidia-rtx-pro-6000).`,
		Example: `  kiln pack models --to image:europe-docker.pkg.dev/my-project/models/resnet:1
  kiln deploy models --gpu-type nvidia-l4 --project my-project --region europe-west4 -o deploy
  gcloud run services replace deploy/cloudrun-service.yaml --project my-project --region europe-west4
  kiln deploy models --platform gke --gpu-type nvidia-tesla-t4 --max-instances 10 -o deploy`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			files, err := o.generate(args[0])
			if err != nil {
				return err
			}
			if err := writeFiles(o.output, files); err != nil {
				return err
			}
			return o.print(c.OutOrStdout(), files)
		},
	}
	o.addFlags(c.Flags())
	return c
}

// generate reads the repository's manifest and writes the files in memory.
func (o *deployOptions) generate(repo string) ([]workflows.File, error) {
	if o.output == "" {
		return nil, usageErr(errors.New("give -o DIR to write the manifests to"))
	}
	g, err := workflows.LookupGPU(o.gpuType)
	if err != nil {
		return nil, usageErr(err)
	}
	o.d.GPU = g
	m, err := manifest.Read(repo)
	if err != nil {
		return nil, err
	}
	o.d.Models = m.Models
	if o.d.Image, o.d.Digest, err = publishedImage(m, o.image); err != nil {
		return nil, err
	}
	if o.d.Service == "" {
		o.d.Service = dnsName(o.d.Image[strings.LastIndex(o.d.Image, "/")+1:])
	}
	files, err := workflows.DeployFiles(o.d, o.platforms)
	var re *workflows.RuleError
	if errors.As(err, &re) {
		return nil, usageErr(err)
	}
	return files, err
}

// publishedImage finds the image kiln pack published: the record of
// image:REF, or the latest image: record when ref is empty. It returns the
// reference without its tag's digest and the digest.
func publishedImage(m *manifest.Manifest, ref string) (string, manifest.Digest, error) {
	for i := len(m.Published) - 1; i >= 0; i-- {
		p := m.Published[i]
		got, ok := strings.CutPrefix(p.Destination, "image:")
		if ok && (ref == "" || got == ref || got == strings.TrimPrefix(ref, "image:")) {
			return got, p.Digest, nil
		}
	}
	if ref != "" {
		return "", "", fmt.Errorf("kiln.json records no publication to image:%s; run kiln pack REPO --to image:%s first", strings.TrimPrefix(ref, "image:"), strings.TrimPrefix(ref, "image:"))
	}
	return "", "", errors.New("kiln.json records no image publication; run kiln pack REPO --to image:REF first")
}

// dnsName turns a name into a lower-case DNS label ("resnet:1" -> "resnet").
func dnsName(s string) string {
	s, _, _ = strings.Cut(s, ":")
	s = strings.Trim(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(s)), "-")
	if len(s) > 40 {
		s = strings.TrimRight(s[:40], "-")
	}
	if s == "" || s[0] < 'a' {
		s = "kiln-" + s
	}
	return s
}

// writeFiles writes every file into dir at once: none is in place before
// all are written.
func writeFiles(dir string, files []workflows.File) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m := make(map[string][]byte, len(files))
	for _, f := range files {
		m[filepath.Join(dir, f.Name)] = f.Content
	}
	return atomicfile.WriteFiles(m, 0o644)
}

// print writes the summary: the files, the commands that apply them and
// the notes; with --format json {image, gpu_type, files, commands, notes}.
func (o *deployOptions) print(w io.Writer, files []workflows.File) error {
	var cmds []string
	for _, f := range files {
		path := filepath.Join(o.output, f.Name)
		switch f.Name {
		case "cloudrun-service.yaml":
			cmds = append(cmds, fmt.Sprintf("gcloud run services replace %s --project %s --region %s", path, o.d.Project, o.d.Region))
		case "cloudrun-worker-pool.yaml":
			cmds = append(cmds, fmt.Sprintf("gcloud run worker-pools replace %s --project %s --region %s", path, o.d.Project, o.d.Region))
		default:
			cmds = append(cmds, "kubectl apply -f "+path)
		}
	}
	return printManifests(w, o.format, o.output, files, cmds, o.d.Notes(), map[string]any{
		"image": o.d.Image + "@" + string(o.d.Digest), "gpu_type": o.d.GPU.Type,
	})
}

// printManifests is deploy's and plan's result on stdout.
func printManifests(w io.Writer, format, dir string, files []workflows.File, cmds, notes []string, extra map[string]any) error {
	if format == formatJSON {
		type file struct {
			Path string `json:"path"`
			What string `json:"what"`
		}
		fs := make([]file, len(files))
		for i, f := range files {
			fs[i] = file{filepath.Join(dir, f.Name), f.What}
		}
		extra["files"], extra["commands"], extra["notes"] = fs, cmds, notes
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(extra)
	}
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "wrote %s\t%s\n", filepath.Join(dir, f.Name), f.What)
	}
	for _, c := range cmds {
		fmt.Fprintf(&b, "run: %s\n", c)
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
