package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/convert"
	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

type convertOptions struct {
	repo        string
	name        string
	precisions  []string
	runtimes    []string
	maxBatches  []string
	instances   []string
	variantIDs  []string
	file        string
	calibDir    string
	calib       calibrateOptions // --calib-data and friends: calibrate on the fly
	int8Mode    string
	randomInt8  bool
	fp16Block   []string
	fp16IO      bool
	trtexec     string
	trtTimeout  time.Duration
	workspace   int
	optLevel    int
	hwCompat    string
	versionComp bool
	target      string
	timingDir   string
	labels      string
	kind        string
	force       bool
	skipUnavail bool
	output      string
	progress    string
}

func newConvertCmd(g *globalOptions) *cobra.Command {
	o := &convertOptions{}
	c := &cobra.Command{
		Use:   "convert MODEL -o REPO",
		Short: "Build ONNX and TensorRT variants of a model into a Triton repository",
		Long: `convert turns one fp32 ONNX model into every variant asked for — ONNX fp32, fp16
and int8 (the Q/DQ model from kiln calibrate), TensorRT engines through trtexec —
writes each as a Triton model (<repo>/<model>_<runtime>_<precision>[_b<batch>][_x<n>]/)
with its config.pbtxt, and records how each was made in <repo>/kiln.json.

Variants are the cross product of --precision, --runtime, --max-batch and
--instances, or the explicit --variant IDs (trt-int8-b16-x4), or the variants:
list of a pipeline file (-f). A rerun with unchanged inputs reuses what is
there ("using existing <variant>"); --force rebuilds.

Without trtexec, TensorRT variants are listed as "needs TensorRT (trtexec not
found)" and kiln exits 4 (partial) unless --skip-unavailable is given.`,
		Example: `  kiln convert model.onnx -o repo --precision fp32,fp16
  kiln calibrate model.onnx --data images/ -o calib
  kiln convert model.onnx -o repo --precision fp32,fp16,int8 --runtime onnx,trt --max-batch 16 --calib-dir calib
  kiln convert model.onnx -o repo --variant trt-int8-b16-x4 --int8-random-ranges`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			return o.run(c, g, args[0])
		},
	}
	f := c.Flags()
	f.StringVarP(&o.repo, "out", "o", "", "model repository to write (required)")
	f.StringVar(&o.name, "name", "", "base model name (default: the model file name, sanitized)")
	f.StringSliceVar(&o.precisions, "precision", nil, "precisions: fp32, fp16, int8 (comma-separated; default fp32)")
	f.StringSliceVar(&o.runtimes, "runtime", nil, "runtimes: onnx, trt (default onnx)")
	f.StringSliceVar(&o.maxBatches, "max-batch", nil, "max batch sizes (default: Triton's default for a batchable model)")
	f.StringSliceVar(&o.instances, "instances", nil, "instance counts (default 1)")
	f.StringArrayVar(&o.variantIDs, "variant", nil, "an explicit variant ID such as trt-int8-b16-x4 (repeatable; replaces the cross product)")
	f.StringVarP(&o.file, "file", "f", "", "pipeline file whose variants: list (and convert: settings) to use")
	f.StringVar(&o.calibDir, "calib-dir", "", "output directory of kiln calibrate (model.int8.onnx, calibration.cache, ranges.json) for int8 variants")
	f.StringVar(&o.calib.data, "calib-data", "", "calibrate on the fly from this data (as kiln calibrate --data) when no --calib-dir is given; results are cached in the user cache dir")
	f.StringVar(&o.calib.preprocess, "calib-preprocess", "", "with --calib-data: image preprocessing (as kiln calibrate --preprocess)")
	f.StringVar(&o.calib.method, "calib-method", "entropy", "with --calib-data: range method: entropy, minmax, percentile or mse")
	f.IntVar(&o.calib.samples, "calib-samples", 0, "with --calib-data: samples to draw (0: all)")
	f.StringVar(&o.int8Mode, "int8-mode", "", "TensorRT int8 path: qdq (from model.int8.onnx) or cache (calibration.cache, TensorRT <= 10); default qdq when available")
	f.BoolVar(&o.randomInt8, "int8-random-ranges", false, "allow int8 TensorRT engines without calibration (placeholder ranges: perf-only, marked so everywhere)")
	f.StringSliceVar(&o.fp16Block, "fp16-block-ops", nil, "op types kept in fp32 by the fp16 rewrite (default: kiln's block list)")
	f.BoolVar(&o.fp16IO, "fp16-keep-io", true, "keep fp32 graph inputs and outputs in fp16 variants")
	f.StringVar(&o.trtexec, "trtexec", "", "trtexec executable (default: trtexec on PATH)")
	f.DurationVar(&o.trtTimeout, "trt-timeout", 2*time.Hour, "give up on one engine build after this long")
	f.IntVar(&o.workspace, "workspace", 0, "TensorRT builder workspace in MiB (0: trtexec's default)")
	f.IntVar(&o.optLevel, "opt-level", -1, "TensorRT --builderOptimizationLevel 0-5 (-1: trtexec's default)")
	f.StringVar(&o.hwCompat, "hardware-compat", "", "TensorRT --hardwareCompatibilityLevel: none, ampere+ or sameComputeCapability")
	f.BoolVar(&o.versionComp, "version-compatible", false, "build TensorRT engines that newer TensorRT releases can run (--versionCompatible)")
	f.StringVar(&o.target, "target", "", `GPU target to refuse mismatches against: "cc=8.6", "trt=10.3" or both comma-separated`)
	f.StringVar(&o.timingDir, "timing-cache-dir", "", "directory for TensorRT timing caches shared by a model's variants (default: the user cache dir)")
	f.StringVar(&o.labels, "labels", "", "label file for a classification output, placed next to each config")
	f.StringVar(&o.kind, "kind", "", "instance kind in the configs: auto, gpu, cpu or model (default: Triton decides)")
	f.BoolVar(&o.force, "force", false, "rebuild every variant even when the repository already has it")
	f.BoolVar(&o.skipUnavail, "skip-unavailable", false, "exit 0 when TensorRT variants cannot be built here (they are still listed)")
	f.StringVar(&o.output, "output", "text", "result format on stdout: text or json")
	f.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto (bars on a terminal, lines otherwise), plain, json or none")
	return c
}

func (o *convertOptions) run(c *cobra.Command, g *globalOptions, model string) error {
	if o.repo == "" {
		return usageErr(errors.New("-o REPO is required"))
	}
	if o.output != "text" && o.output != "json" {
		return usageErr(fmt.Errorf("--output must be text or json, not %q", o.output))
	}
	if err := validProgress(o.progress); err != nil {
		return usageErr(err)
	}
	var variants []manifest.Variant
	if o.file != "" {
		p, err := readPipeline(o.file)
		if err != nil {
			return err
		}
		for _, id := range p.Variants {
			v, err := manifest.ParseVariant(id)
			if err != nil {
				return usageErr(fmt.Errorf("%s: %w", o.file, err))
			}
			variants = append(variants, v)
		}
	}
	for _, id := range o.variantIDs {
		v, err := manifest.ParseVariant(id)
		if err != nil {
			return usageErr(err)
		}
		variants = append(variants, v)
	}
	if len(variants) == 0 {
		mx, err := convert.ParseMatrix(o.precisions, o.runtimes, o.maxBatches, o.instances)
		if err != nil {
			return usageErr(err)
		}
		if mx.Target, err = targetCC(o.target); err != nil {
			return usageErr(err)
		}
		variants = mx.Expand()
	}
	opts := convert.Options{
		Source: model, Repo: o.repo, Name: o.name, ToolVersion: Version,
		FP16:   convert.FP16Options{KeepIOTypes: o.fp16IO, OpBlockList: o.fp16Block},
		Logger: g.logger(c.ErrOrStderr()),
	}
	opts.Config.InstanceKind = o.kind
	if o.calib.data != "" && o.calibDir == "" {
		dir, err := o.calibrateOnTheFly(c, g, model)
		if err != nil {
			return err
		}
		o.calibDir = dir
	}
	if err := o.int8(&opts); err != nil {
		return err
	}
	if o.labels != "" {
		data, err := os.ReadFile(o.labels)
		if err != nil {
			return err
		}
		name := filepath.Base(o.labels)
		opts.Labels = map[string][]byte{name: data}
		opts.Config.LabelsFile = name
	}
	if err := o.trt(c.Context(), &opts); err != nil {
		return err
	}
	// The plan needs the signature only; the weights are read when a variant is built.
	m, err := onnx.LoadWith(model, onnx.LoadOptions{SkipExternalData: true})
	if err != nil {
		return err
	}
	plan, err := convert.CheckPlan(m, variants, convert.PlanOptions{
		HaveCalibration: opts.Int8.QDQModel != "" || opts.Int8.Cache != "", RandomRanges: o.randomInt8})
	if err != nil {
		return usageErr(err)
	}
	opts.Variants = plan.Variants
	report, done := newProgress(c.ErrOrStderr(), o.progress)
	opts.Progress = report
	res, err := convert.Run(c.Context(), opts)
	done()
	if res != nil {
		if perr := printConvert(c.OutOrStdout(), o.output, res); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return err
	}
	if failed := res.Failed(); len(failed) > 0 {
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("%d of %d variants failed; first: %w", len(failed), len(res.Rows), failed[0].Err)}
	}
	if res.Partial() && !o.skipUnavail {
		return &ExitError{Code: ExitPartial, Err: errors.New("some TensorRT variants need trtexec, which was not found (pass --skip-unavailable to accept a partial repository)")}
	}
	return nil
}

// int8 fills the int8 inputs from --calib-dir.
func (o *convertOptions) int8(opts *convert.Options) error {
	switch o.int8Mode {
	case "", "qdq", "cache":
	default:
		return usageErr(fmt.Errorf("--int8-mode must be qdq or cache, not %q", o.int8Mode))
	}
	opts.Int8.Mode = convert.Int8Mode(o.int8Mode)
	opts.Int8.RandomRanges = o.randomInt8
	if o.calibDir == "" {
		return nil
	}
	if st, err := os.Stat(o.calibDir); err != nil || !st.IsDir() {
		return fmt.Errorf("--calib-dir %s: not a directory written by kiln calibrate", o.calibDir)
	}
	for name, dst := range map[string]*string{"model.int8.onnx": &opts.Int8.QDQModel, "calibration.cache": &opts.Int8.Cache} {
		p := filepath.Join(o.calibDir, name)
		if _, err := os.Stat(p); err == nil {
			*dst = p
		}
	}
	if opts.Int8.QDQModel == "" && opts.Int8.Cache == "" {
		return fmt.Errorf("--calib-dir %s has neither model.int8.onnx nor calibration.cache; run kiln calibrate -o %s first", o.calibDir, o.calibDir)
	}
	if data, err := os.ReadFile(filepath.Join(o.calibDir, "ranges.json")); err == nil {
		var r struct {
			Method  string          `json:"method"`
			Samples int             `json:"samples"`
			Dataset manifest.Digest `json:"dataset_digest"`
		}
		if json.Unmarshal(data, &r) == nil {
			opts.Int8.Method, opts.Int8.Samples, opts.Int8.Dataset = r.Method, r.Samples, r.Dataset
		}
	}
	if data, err := os.ReadFile(filepath.Join(o.calibDir, "report.json")); err == nil {
		var r struct {
			Accuracy struct {
				Outputs []struct {
					Cosine float64 `json:"cosine"`
					Top1   float64 `json:"top1_agreement"`
				} `json:"outputs"`
			} `json:"accuracy"`
		}
		if json.Unmarshal(data, &r) == nil && len(r.Accuracy.Outputs) > 0 {
			opts.Int8.Cosine, opts.Int8.Top1 = r.Accuracy.Outputs[0].Cosine, r.Accuracy.Outputs[0].Top1
		}
	}
	return nil
}

// trt finds trtexec and the GPU, and fills the engine options.
func (o *convertOptions) trt(ctx context.Context, opts *convert.Options) error {
	t := convert.TRTOptions{WorkspaceMiB: o.workspace, HardwareCompat: o.hwCompat, VersionCompatible: o.versionComp, Timeout: o.trtTimeout}
	if o.optLevel >= 0 {
		lvl := o.optLevel
		t.OptimizationLevel = &lvl
	}
	if o.target != "" {
		tg, err := parseTarget(o.target)
		if err != nil {
			return usageErr(err)
		}
		t.Target = tg
	}
	path, err := execx.LookPath("trtexec", o.trtexec)
	if err != nil {
		if o.trtexec != "" {
			return err // an explicit --trtexec that is not there is an error
		}
		opts.BuilderMissing = "trtexec not found"
		opts.TRT = t
		return nil
	}
	dir := o.timingDir
	if dir == "" {
		if ucd, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(ucd, "kiln", "timing")
		}
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err == nil {
			if d, _, err := manifest.DigestFile(opts.Source); err == nil {
				t.TimingCache = filepath.Join(dir, d.Hex()[:16]+".timing")
			}
		}
	}
	opts.Builder = &convert.Trtexec{Path: path, Runner: execx.Exec{}, Timeout: o.trtTimeout, Logger: opts.Logger}
	opts.TRT = t
	// The GPU the engines are built on, for provenance and --target. Without
	// nvidia-smi the builds still run; the record then has what trtexec logs.
	if gpus, err := convert.QueryGPU(ctx, execx.Exec{}, ""); err == nil && len(gpus) > 0 {
		opts.GPU = &gpus[0]
	} else if err != nil {
		opts.Logger.Warn("cannot query the GPU with nvidia-smi; provenance will only have what trtexec logs", "err", err)
	}
	return nil
}

// parseTarget reads "cc=8.6,trt=10.3" (either part optional; "sm86" and a
// bare "8.6" mean the compute capability).
func parseTarget(s string) (*convert.Target, error) {
	t := &convert.Target{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			k, v = "cc", part
		}
		switch k {
		case "cc", "sm":
			t.ComputeCapability = strings.TrimPrefix(strings.TrimPrefix(v, "sm_"), "sm")
		case "trt", "tensorrt":
			spec, err := manifest.ParseTRTSpec(v)
			if err != nil {
				return nil, fmt.Errorf("--target %q: %w", s, err)
			}
			t.TRT = &spec
		default:
			return nil, fmt.Errorf("--target %q: unknown part %q (want cc=<compute capability> or trt=<TensorRT version>)", s, k)
		}
	}
	return t, nil
}

func targetCC(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	t, err := parseTarget(s)
	if err != nil {
		return "", err
	}
	cc := t.ComputeCapability
	if cc != "" && !strings.Contains(cc, ".") && len(cc) >= 2 {
		cc = cc[:len(cc)-1] + "." + cc[len(cc)-1:]
	}
	return cc, nil
}

func printConvert(w io.Writer, format string, res *convert.Result) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIANT\tMODEL\tFILE\tSIZE\tTIME\tSTATUS")
	for _, r := range res.Rows {
		status := string(r.Status)
		switch {
		case !r.Reused && (r.Status == manifest.StatusOK || r.Status == manifest.StatusPerfOnly):
			status = "built"
			if r.Detail != "" {
				status += " (" + r.Detail + ")"
			}
		case r.Detail != "":
			status = r.Detail
		}
		size := ""
		if r.Size > 0 {
			size = humanBytes(r.Size)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Variant.ID(), r.Model, r.File, size, r.Duration.Round(time.Millisecond), status)
	}
	return tw.Flush()
}

// calibrateOnTheFly runs kiln calibrate for --calib-data into a directory of
// the user cache keyed by everything that decides its result, and reuses it
// when it is already there, so a rerun does no work.
func (o *convertOptions) calibrateOnTheFly(c *cobra.Command, g *globalOptions, model string) (string, error) {
	o.calib.out = "-"
	o.calib.output, o.calib.progress = "text", o.progress
	o.calib.calibShare, o.calib.trtVersion = 0.5, "10.3.0"
	cfg, err := o.calib.config(model)
	if err != nil {
		return "", err
	}
	md, _, err := manifest.DigestFile(model)
	if err != nil {
		return "", err
	}
	abs := o.calib.data
	if !strings.HasPrefix(abs, "gs://") {
		abs, _ = filepath.Abs(abs)
	}
	key := manifest.DigestBytes([]byte(fmt.Sprintf("%s|%s|%s|%s|%d", md, abs, o.calib.preprocess, o.calib.method, o.calib.samples)))
	ucd, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(ucd, "kiln", "calib", key.Hex()[:16])
	if _, err := os.Stat(filepath.Join(dir, "ranges.json")); err == nil {
		fmt.Fprintf(c.ErrOrStderr(), "using existing calibration %s\n", dir)
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	if err := g.initORT(); err != nil {
		return "", err
	}
	fsys, closeFS, err := dataFS(c.Context(), o.calib.data)
	if err != nil {
		return "", err
	}
	defer closeFS()
	report, done := newProgress(c.ErrOrStderr(), o.progress)
	rep, err := calibrate.Run(c.Context(), cfg, dir, calibrate.WithFS(fsys), calibrate.WithProgress(report), calibrate.WithLogger(g.logger(c.ErrOrStderr())))
	done()
	if err != nil {
		return "", fmt.Errorf("calibrating for the int8 variants: %w", err)
	}
	return dir, printCalibration(c.ErrOrStderr(), "text", dir, rep)
}
