package workflows

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
)

// Plan is a variant matrix to build across GPU types (DESIGN.md, "Growing
// past one machine"): every variant is built on every GPU type, one task
// per pair, each running `kiln convert --variant ID` on a GPU of that type
// and publishing the one-model repository it made to a shared gs:// build
// cache keyed by (source digest, variant, TensorRT version, compute
// capability); then, per GPU type, a final task merges every cached part
// of that GPU into one repository (kiln pack --from ... --from ...), checks
// it with kiln serve on that GPU and packs it. A final task is per GPU
// type because a TensorRT engine runs only on the compute capability it
// was built for: serve can check a repository on the GPU it is for.
type Plan struct {
	// Name starts every job's name.
	Name string
	// Source is the model as the jobs reach it (a gs:// path, or a path in
	// the kiln image) and SourceDigest its digest, which keys the cache.
	Source       string
	SourceDigest manifest.Digest
	// Variants are built on every GPU type; a TensorRT variant is built for
	// the GPU's compute capability (its ID gets _sm<cc>).
	Variants []manifest.Variant
	GPUs     []GPU
	// Cache is the build cache, gs://BUCKET/PREFIX.
	Cache string
	// Image is the kiln image the jobs run (it needs /bin/sh and trtexec).
	Image string
	// TRT is the TensorRT release of the image's trtexec ("10.3.0");
	// needed when a variant is a TensorRT one.
	TRT string
	// To are where the final tasks publish the checked repository of each
	// GPU type: gs://BUCKET/PREFIX (to PREFIX/<gpu>) or image:REPO:TAG (tags
	// TAG-<gpu>). None: the final tasks check and do not publish.
	To []string
	// Project and Region place the Cloud Run jobs.
	Project, Region string
	// CPU and Memory size each task (0: the GPU's recommended size).
	CPU    int
	Memory int64
	// Parallelism is how many build tasks of a GPU type run at once (0: all).
	Parallelism int
	// Calibration are the kiln convert flags an int8 variant's build
	// calibrates with (--calib-data gs://... and friends); an int8 variant
	// needs them, and they key its cache entry.
	Calibration []string
}

// Task is one index of a GPU type's build job: a variant built on that GPU.
type Task struct {
	Index   int    `json:"index"`
	GPU     string `json:"gpu_type"`
	Variant string `json:"variant"`
	// Key is the task's place in the build cache, below Plan.Cache.
	Key string `json:"cache_key"`
}

// The environment variable each platform tells a task its index in.
const (
	indexK8s      = "JOB_COMPLETION_INDEX" // Kubernetes Indexed Jobs
	indexCloudRun = "CLOUD_RUN_TASK_INDEX" // Cloud Run jobs
)

var (
	safeGCS   = regexp.MustCompile(`^gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/[A-Za-z0-9._/-]*)?$`)
	safeImage = regexp.MustCompile(`^[A-Za-z0-9._/:@-]+$`)
	safeArg   = regexp.MustCompile(`^[A-Za-z0-9._/:=,+-]+$`)
)

// Validate checks the plan; every string a script holds is checked to be
// free of shell syntax.
func (p Plan) Validate() error {
	if !dnsLabel.MatchString(p.Name) || len(p.Name) > 40 {
		return fmt.Errorf("plan name %q: want lower-case letters, digits and '-', starting with a letter, at most 40 characters", p.Name)
	}
	if len(p.Variants) == 0 || len(p.GPUs) == 0 {
		return errors.New("plan: give at least one variant and one GPU type")
	}
	if err := p.SourceDigest.Validate(); err != nil {
		return fmt.Errorf("source %s: %w", p.Source, err)
	}
	if p.Source == "" || !safeImage.MatchString(p.Source) {
		return fmt.Errorf("source %q: want a gs:// path or a path in the image, without spaces or quotes", p.Source)
	}
	if !safeGCS.MatchString(p.Cache) {
		return fmt.Errorf("cache %q: want gs://BUCKET/PREFIX", p.Cache)
	}
	if p.Image == "" || !safeImage.MatchString(p.Image) {
		return fmt.Errorf("kiln image %q: want an image reference", p.Image)
	}
	for _, to := range p.To {
		if _, err := destination(to, gpus[0]); err != nil {
			return err
		}
	}
	for _, v := range p.Variants {
		if err := v.Validate(); err != nil {
			return err
		}
		if v.Runtime == manifest.RuntimeTRT && p.TRT == "" {
			return fmt.Errorf("variant %s: a TensorRT variant needs the TensorRT version of the kiln image (it keys the cache)", v.ID())
		}
		if v.Precision == manifest.INT8 && len(p.Calibration) == 0 {
			return fmt.Errorf("variant %s: an int8 variant needs calibration data (--calib-data gs://..., or calibration: in the pipeline file)", v.ID())
		}
	}
	for _, a := range p.Calibration {
		if !safeArg.MatchString(a) {
			return fmt.Errorf("calibration flag %q: want letters, digits and ._/:=,+- only (no spaces or quotes)", a)
		}
	}
	if p.TRT != "" {
		if _, err := manifest.ParseTRTSpec(p.TRT); err != nil {
			return err
		}
	}
	return nil
}

// forGPU is v as built on g: a TensorRT engine is tied to g's compute capability.
func forGPU(v manifest.Variant, g GPU) manifest.Variant {
	if v.Runtime == manifest.RuntimeTRT {
		v.Target = g.ComputeCapability
	}
	return v
}

// Tasks lists the build tasks of one GPU type, by index.
func (p Plan) Tasks(g GPU) []Task {
	trt := "trt-" + p.TRT
	if p.TRT == "" {
		trt = "trt-none"
	}
	cc := "sm" + strings.ReplaceAll(g.ComputeCapability, ".", "")
	out := make([]Task, len(p.Variants))
	for i, v := range p.Variants {
		id := forGPU(v, g).ID()
		parts := []string{p.SourceDigest.Hex(), id, trt, cc}
		if v.Precision == manifest.INT8 {
			parts = slices.Insert(parts, 2, p.calibKey())
		}
		out[i] = Task{Index: i, GPU: g.Type, Variant: id, Key: strings.Join(parts, "/")}
	}
	return out
}

// calibKey is the cache key part of an int8 build's calibration flags.
func (p Plan) calibKey() string {
	return "calib-" + manifest.DigestBytes([]byte(strings.Join(p.Calibration, "\x00"))).Hex()[:12]
}

// destination is where the final task of g publishes its repository for to.
func destination(to string, g GPU) (string, error) {
	switch {
	case strings.HasPrefix(to, "gs://") && safeGCS.MatchString(to):
		return strings.TrimSuffix(to, "/") + "/" + g.Short, nil
	case strings.HasPrefix(to, "image:") && safeImage.MatchString(to):
		ref := strings.TrimPrefix(to, "image:")
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") && !strings.Contains(ref, "@") {
			return to + "-" + g.Short, nil
		}
	}
	return "", fmt.Errorf("destination %q: want gs://BUCKET/PREFIX or image:REPO:TAG (each GPU type gets its own prefix or tag)", to)
}

// buildScript is what a build task runs: it picks its variant by the index
// in indexVar, reuses a cached build, or converts and publishes one.
func (p Plan) buildScript(g GPU, indexVar string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "set -eu\ncase \"${%s}\" in\n", indexVar)
	for i, t := range p.Tasks(g) {
		calib := ""
		if p.Variants[i].Precision == manifest.INT8 {
			calib = strings.Join(p.Calibration, " ")
		}
		fmt.Fprintf(&b, "%d) variant=%s key=%s calib='%s' ;;\n", t.Index, t.Variant, t.Key, calib)
	}
	fmt.Fprintf(&b, "*) echo \"kiln plan: no variant for index ${%s}\" >&2; exit 2 ;;\nesac\n", indexVar)
	b.WriteString("if kiln pack --from \"$KILN_CACHE/$key\" --to dir:/work/cached >/dev/null 2>&1; then\n")
	b.WriteString("  echo \"using existing $variant from $KILN_CACHE/$key\"; exit 0\nfi\n")
	b.WriteString("kiln convert \"$KILN_SOURCE\" --repo /work/repo --variant \"$variant\" $calib")
	if p.TRT != "" {
		b.WriteString(" --trt-version " + p.TRT)
	}
	b.WriteString(" --progress plain\n")
	// The part is a build product, not yet checked on the GPU: the final
	// task serves it before publishing.
	b.WriteString("kiln pack /work/repo --to \"$KILN_CACHE/$key\" --allow-unchecked --progress plain\n")
	return b.String()
}

// finalScript is what the final task of g runs: merge every cached part
// of g into one repository, check it with kiln serve on this GPU
// ($KILN_SERVE_FLAGS: data and thresholds) and publish it.
func (p Plan) finalScript(g GPU) string {
	var b strings.Builder
	b.WriteString("set -eu\nkiln pack")
	for _, t := range p.Tasks(g) {
		fmt.Fprintf(&b, " \\\n  --from \"$KILN_CACHE/%s\"", t.Key)
	}
	b.WriteString(" \\\n  --to dir:/work/repo --progress plain\n")
	b.WriteString("kiln serve /work/repo ${KILN_SERVE_FLAGS:-}\n")
	if len(p.To) > 0 {
		b.WriteString("kiln pack /work/repo")
		for _, to := range p.To {
			dest, _ := destination(to, g) // checked by Validate
			b.WriteString(" --to " + dest)
		}
		b.WriteString(" --progress plain\n")
	}
	return b.String()
}
