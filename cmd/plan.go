package cmd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/convert"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/workflows"
)

type planOptions struct {
	file      string
	p         workflows.Plan
	matrix    convert.Matrix
	variants  []manifest.Variant
	gpuTypes  []string
	digest    string
	calibData string
	calibPre  string
	calibRest []string // --calib-method and --calib-samples from the pipeline file (convert takes no seed)
	trt       manifest.TRTSpec
	platforms []string
	output    string
	format    string
}

func (o *planOptions) addFlags(f *pflag.FlagSet) {
	f.StringVarP(&o.file, "file", "f", "", "pipeline `FILE` (default $KILN_PIPELINE): its source:, variants:, calibration:, target: (gpu_types, tensorrt), plan: (cache, image, project, region), name: and gs:// and image: destinations: are used where no argument or flag gives them")
	listFlag(f, &o.matrix.Precisions, "precision", "fp32,fp16,int8", "precisions (default fp32)", manifest.ParsePrecision, func(p manifest.Precision) string { return string(p) })
	listFlag(f, &o.matrix.Runtimes, "runtime", "onnx,trt", "runtimes (default onnx)", manifest.ParseRuntime, func(r manifest.Runtime) string { return string(r) })
	listFlag(f, &o.matrix.MaxBatches, "max-batch", "ints", "max batch sizes (default: Triton's default for a batchable model)", intAtLeast(0), strconv.Itoa)
	listFlag(f, &o.matrix.Instances, "instances", "ints", "instance counts (default 1)", intAtLeast(1), strconv.Itoa)
	listFlag(f, &o.variants, "variant", "ids", "explicit variant IDs such as trt-int8-b16-x4 (repeatable; replaces the cross product)", manifest.ParseVariant, manifest.Variant.ID)
	o.gpuTypes = []string{"nvidia-l4"}
	listFlag(f, &o.gpuTypes, "gpu-types", "types", "GPU types to build on, one build job each (default nvidia-l4): "+strings.Join(workflows.GPUTypes(), ", "), func(s string) (string, error) {
		if _, err := workflows.LookupGPU(s); err != nil {
			return "", err
		}
		return s, nil
	}, func(s string) string { return s })
	f.StringVar(&o.p.Cache, "cache", "", "build cache `gs://BUCKET/PREFIX` every job reads and writes (required)")
	f.StringVar(&o.p.Image, "image", "", "kiln `IMAGE` the jobs run, with trtexec for TensorRT variants (required)")
	trtVersionFlag(f, &o.trt, "TensorRT release of the image's trtexec (required for trt variants; part of the cache key)")
	f.StringVar(&o.calibData, "calib-data", "", "calibration `DATA` the int8 builds calibrate on, as the jobs reach it (gs://...; required for int8 variants; part of their cache key)")
	f.StringVar(&o.calibPre, "calib-preprocess", "", "image preprocessing of --calib-data, as kiln convert --calib-preprocess takes it")
	f.StringVar(&o.digest, "source-digest", "", "sha256 `DIGEST` of MODEL (default: MODEL's, when it is a local file)")
	f.StringArrayVar(&o.p.To, "to", nil, "`DEST` the final jobs publish each GPU type's checked repository to: gs://BUCKET/PREFIX (PREFIX/<gpu>) or image:REPO:TAG (TAG-<gpu>); repeatable (default: check only)")
	f.StringVar(&o.p.Name, "name", "", "`NAME` starting every job's name (default: from MODEL)")
	f.StringVar(&o.p.Project, "project", "", "Google Cloud `PROJECT` of the Cloud Run jobs")
	f.StringVar(&o.p.Region, "region", "", "Cloud Run `REGION` of the Cloud Run jobs")
	f.IntVar(&o.p.CPU, "cpu", 0, "CPUs per job (0: the GPU's recommended size)")
	sizeFlag(f, &o.p.Memory, "memory", 0, "memory per job, e.g. 32GiB (0: the GPU's recommended size)")
	f.IntVar(&o.p.Parallelism, "parallelism", 0, "build jobs of one GPU type running at once (0: all)")
	platformFlag(f, &o.platforms)
	f.StringVarP(&o.output, "output", "o", "", "`DIR` to write the manifests to (required)")
	formatFlag(f, &o.format)
}

func newPlanCmd() *cobra.Command {
	o := &planOptions{}
	c := &cobra.Command{
		Use:   "plan MODEL -o DIR | plan -f pipeline.yaml -o DIR",
		Short: "Write GKE Indexed Jobs and Cloud Run jobs that build a variant matrix on GPUs",
		Long: `plan expands a variant matrix (--precision × --runtime × --max-batch ×
--instances, or --variant IDs) across --gpu-types into build jobs: per GPU
type a Kubernetes Indexed Job for a GKE node pool of that accelerator
(gke-build.yaml) and a Cloud Run job (cloudrun-build-<gpu>.yaml), index i
building variant i with kiln convert --variant ID (TensorRT variants for the
GPU's compute capability, ID suffix _sm<cc>) and publishing it to the shared
--cache, keyed by source digest, variant, TensorRT version and compute
capability; a build already cached is not built again. Then, per GPU type, a
final job (gke-final.yaml, cloudrun-final-<gpu>.yaml) assembles that GPU's
builds from the cache into one repository (kiln pack --from ... --from ...),
checks it with kiln serve on that GPU ($KILN_SERVE_FLAGS in the job's
environment gives it data) and publishes it to --to (one repository per GPU
type: an engine runs only on the GPU it was built for).

MODEL is read by the jobs: a gs:// path or a path inside the kiln image.
An int8 variant's build calibrates on --calib-data (as kiln convert does),
which keys its cache entry. With -f the pipeline file gives what no argument
or flag does: source: (as MODEL), variants:, calibration:, target.gpu_types
and target.tensorrt, plan.cache,
plan.image, plan.project and plan.region, name: and the gs:// and image:
destinations: (local ones are for kiln run; they are noted and left out).
A flag given replaces the file's value ($KILN_PIPELINE names the file, as
for kiln run).`,
		Example: `  kiln plan gs://my-bucket/models/resnet50.onnx --source-digest sha256:... \
    --variant onnx-fp16,trt-fp16,trt-int8 --calib-data gs://my-bucket/calib --calib-preprocess imagenet \
    --gpu-types nvidia-l4,nvidia-rtx-pro-6000 \
    --cache gs://my-bucket/kiln-cache --image europe-docker.pkg.dev/my-project/kiln/kiln:0.1 \
    --trt-version 10.3 --to image:europe-docker.pkg.dev/my-project/models/resnet:1 \
    --project my-project --region europe-west4 -o plan
  kiln plan -f pipeline.yaml --source-digest sha256:... -o plan`,
		Args: argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			notes, err := o.fromFile(c.Flags(), args)
			if err != nil {
				return err
			}
			files, err := o.generate(o.p.Source)
			if err != nil {
				return err
			}
			if err := writeFiles(o.output, files); err != nil {
				return err
			}
			return printManifests(c.OutOrStdout(), o.format, o.output, files, o.commands(files), notes, map[string]any{"tasks": o.tasks()})
		},
	}
	o.addFlags(c.Flags())
	return c
}

// fromFile sets what the pipeline file (-f, else $KILN_PIPELINE) gives and
// no argument or flag does; the notes say what of it plan leaves out.
func (o *planOptions) fromFile(f *pflag.FlagSet, args []string) ([]string, error) {
	if v := os.Getenv("KILN_PIPELINE"); v != "" && !f.Changed("file") {
		o.file = v
	}
	if len(args) == 1 {
		o.p.Source = args[0]
	}
	if o.file == "" {
		if len(args) == 0 {
			return nil, usageErr(errors.New("give MODEL, or -f pipeline.yaml"))
		}
		return nil, nil
	}
	p, err := readPipeline(o.file)
	if err != nil {
		return nil, usageErr(err)
	}
	set := func(flag string, dst *string, v string) {
		if !f.Changed(flag) && v != "" {
			*dst = v
		}
	}
	if len(args) == 0 {
		if p.Source == "" {
			return nil, usageErr(fmt.Errorf("%s:%d: source: is missing: the model the jobs build from (or give MODEL)", o.file, max(p.lines["source"], 1)))
		}
		o.p.Source = p.Source
	}
	matrix := false
	for _, name := range []string{"precision", "runtime", "max-batch", "instances", "variant"} {
		matrix = matrix || f.Changed(name)
	}
	if !matrix {
		o.variants = p.variants()
	}
	if t := p.Target; t != nil {
		if !f.Changed("gpu-types") && len(t.GPUTypes) > 0 {
			o.gpuTypes = t.GPUTypes
		}
		if !f.Changed("trt-version") && t.TensorRT != "" {
			o.trt, _ = manifest.ParseTRTSpec(t.TensorRT) // checked when the file was read
		}
	}
	if c := p.Calibration; c != nil {
		set("calib-data", &o.calibData, c.Data)
		set("calib-preprocess", &o.calibPre, c.Preprocess)
		for _, f := range []struct{ flag, value string }{{"--calib-method", c.Method}, {"--calib-samples", strconv.Itoa(c.Samples)}} {
			if f.value != "" && f.value != "0" {
				o.calibRest = append(o.calibRest, f.flag, f.value)
			}
		}
	}
	if pl := p.Plan; pl != nil {
		set("cache", &o.p.Cache, pl.Cache)
		set("image", &o.p.Image, pl.Image)
		set("project", &o.p.Project, pl.Project)
		set("region", &o.p.Region, pl.Region)
	}
	if p.Name != "" {
		set("name", &o.p.Name, dnsName(p.Name))
	}
	var notes []string
	if !f.Changed("to") {
		for _, d := range p.Destinations {
			if strings.HasPrefix(d, "gs://") || strings.HasPrefix(d, "image:") {
				o.p.To = append(o.p.To, d)
			} else {
				notes = append(notes, "destination "+d+" is local to this machine: the jobs leave it out (kiln run publishes there)")
			}
		}
	}
	return notes, nil
}

// generate completes the plan from the arguments and writes it in memory.
func (o *planOptions) generate(model string) ([]workflows.File, error) {
	if o.output == "" {
		return nil, usageErr(errors.New("give -o DIR to write the manifests to"))
	}
	o.p.Source = model
	o.p.Variants = o.variants
	if len(o.p.Variants) == 0 {
		o.p.Variants = o.matrix.Expand()
	}
	for _, t := range o.gpuTypes {
		g, _ := workflows.LookupGPU(t) // checked when the flag was read
		o.p.GPUs = append(o.p.GPUs, g)
	}
	if !o.trt.IsZero() {
		o.p.TRT = o.trt.String()
	}
	if o.calibData != "" {
		o.p.Calibration = []string{"--calib-data", o.calibData}
		if o.calibPre != "" {
			o.p.Calibration = append(o.p.Calibration, "--calib-preprocess", o.calibPre)
		}
		o.p.Calibration = append(o.p.Calibration, o.calibRest...)
	}
	o.p.SourceDigest = manifest.Digest(o.digest)
	if o.digest == "" {
		st, err := os.Stat(model)
		if err != nil || st.IsDir() {
			return nil, usageErr(fmt.Errorf("give --source-digest: MODEL %s is not a local file kiln can hash", model))
		}
		if o.p.SourceDigest, _, err = manifest.DigestFile(model); err != nil {
			return nil, err
		}
	}
	if o.p.Name == "" {
		base := filepath.Base(model)
		o.p.Name = dnsName(strings.TrimSuffix(base, filepath.Ext(base)))
	}
	files, err := workflows.PlanFiles(o.p, o.platforms)
	if err != nil {
		return nil, usageErr(err) // every error is a flag that breaks a rule
	}
	return files, nil
}

// tasks lists every build task, GPU type by GPU type.
func (o *planOptions) tasks() []workflows.Task {
	var out []workflows.Task
	for _, g := range o.p.GPUs {
		out = append(out, o.p.Tasks(g)...)
	}
	return out
}

// commands are what runs the plan: the build jobs, a wait for them, the final jobs.
func (o *planOptions) commands(files []workflows.File) []string {
	var cmds []string
	where := fmt.Sprintf(" --project %s --region %s", o.p.Project, o.p.Region)
	for _, f := range files {
		path := filepath.Join(o.output, f.Name)
		switch {
		case f.Name == "gke-build.yaml":
			cmds = append(cmds, "kubectl apply -f "+path)
			for _, g := range o.p.GPUs {
				cmds = append(cmds, fmt.Sprintf("kubectl wait --for=condition=complete --timeout=24h job/%s-build-%s", o.p.Name, g.Short))
			}
		case f.Name == "gke-final.yaml":
			cmds = append(cmds, "kubectl apply -f "+path)
		default:
			job := o.p.Name + "-" + strings.TrimSuffix(strings.TrimPrefix(f.Name, "cloudrun-"), ".yaml")
			cmds = append(cmds, "gcloud run jobs replace "+path+where, "gcloud run jobs execute "+job+" --wait"+where)
		}
	}
	return cmds
}
