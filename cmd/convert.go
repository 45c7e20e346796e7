package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/convert"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt"
)

type convertOptions struct {
	cfg         convert.Config
	matrix      convert.Matrix
	variants    []manifest.Variant
	file        string
	calibDir    string
	calib       calibrateOptions // --calib-data and friends: calibrate on the fly
	check       feedFlags        // --check-data and friends: what the variants are checked with
	checkData   dataset.Spec
	fix         []string
	foldBN      bool
	int8Mode    string
	hwCompat    string
	optLevel    int
	trt         manifest.TRTSpec
	trtexec     string
	skipUnavail bool
	format      string
	progress    string
}

func (o *convertOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.cfg.Repo, "repo", "", "model repository `DIR` to write (required, or repository: in -f)")
	f.StringVar(&o.cfg.Name, "name", "", "base model name (default: the model file name, sanitized)")
	listFlag(f, &o.matrix.Precisions, "precision", "fp32,fp16,int8", "precisions (default fp32)", manifest.ParsePrecision, func(p manifest.Precision) string { return string(p) })
	listFlag(f, &o.matrix.Runtimes, "runtime", "onnx,trt", "runtimes (default onnx)", manifest.ParseRuntime, func(r manifest.Runtime) string { return string(r) })
	listFlag(f, &o.matrix.MaxBatches, "max-batch", "ints", "max batch sizes (default: Triton's default for a batchable model)", intAtLeast(0), strconv.Itoa)
	listFlag(f, &o.matrix.Instances, "instances", "ints", "instance counts (default 1)", intAtLeast(1), strconv.Itoa)
	computeCapabilityFlag(f, &o.matrix.Target, "GPU the TensorRT engines are for (8.6, sm86): names the variants (_sm86) and refuses to build on another GPU")
	listFlag(f, &o.variants, "variant", "ids", "explicit variant IDs such as trt-int8-b16-x4 (repeatable; replaces the cross product)", manifest.ParseVariant, manifest.Variant.ID)
	f.StringVarP(&o.file, "file", "f", "", "pipeline `FILE`: its model:, repository: and variants: are used where no argument or flag gives them")
	f.StringVar(&o.calibDir, "calib-dir", "", "the -o `DIR` of kiln calibrate (model.int8.onnx, ranges.json; calibration.cache with --trt-cache) for int8 variants")
	o.calib.addDataFlags(f, "calib-")
	f.StringVar(&o.checkData.Path, "check-data", "", "data every ONNX variant is checked with before it is recorded (default: the calibration's validation split, else seeded random data, which cannot judge int8)")
	f.Var(&parsedValue[dataset.Preprocess]{p: &o.checkData.Preprocess, typ: "spec", parse: dataset.ParsePreprocess, text: dataset.Preprocess.String},
		"check-preprocess", "image preprocessing of --check-data (as --preprocess)")
	o.check.addFlags(f, "check-", "8")
	thresholdFlag(f, &o.cfg.Check.Thresholds)
	fixFlag(f, &o.fix)
	f.BoolVar(&o.foldBN, "fold-batchnorm", true, "fold BatchNormalization into the Conv/Gemm before it in the source (--fold-batchnorm=false keeps them, e.g. to reproduce another tool's graph)")
	choice(f, &o.int8Mode, "int8-mode", "", "TensorRT int8 path: qdq (from model.int8.onnx) or cache (calibration.cache, TensorRT <= 10); default qdq when available", "qdq", "cache")
	f.BoolVar(&o.cfg.Int8.RandomRanges, "int8-random-ranges", false, "allow int8 TensorRT engines without calibration (placeholder ranges: perf-only, marked so everywhere)")
	f.StringSliceVar(&o.cfg.FP16.OpBlockList, "fp16-block-ops", nil, "op types kept in fp32 by the fp16 rewrite (default: kiln's block list)")
	f.BoolVar(&o.cfg.FP16.KeepIOTypes, "fp16-keep-io", true, "keep fp32 graph inputs and outputs in fp16 variants")
	f.StringVar(&o.trtexec, "trtexec", "", "trtexec executable `PATH` (default: trtexec on PATH)")
	f.DurationVar(&o.cfg.TRT.Timeout, "trt-timeout", 2*time.Hour, "give up on one engine build after this long")
	sizeFlag(f, &o.cfg.TRT.WorkspaceBytes, "trt-workspace", 0, "TensorRT builder workspace, e.g. 4GiB (0: trtexec's default)")
	f.IntVar(&o.optLevel, "opt-level", -1, "TensorRT --builderOptimizationLevel 0-5 (-1: trtexec's default)")
	choice(f, &o.hwCompat, "hardware-compat", "", "TensorRT --hardwareCompatibilityLevel `level`: none, ampere+ or sameComputeCapability",
		string(trtexec.HardwareCompatNone), string(trtexec.HardwareCompatAmperePlus), string(trtexec.HardwareCompatSameCompute))
	f.BoolVar(&o.cfg.TRT.VersionCompatible, "version-compatible", false, "build TensorRT engines that newer TensorRT releases can run (--versionCompatible)")
	trtVersionFlag(f, &o.trt, "TensorRT the engines are for (10.3 accepts any 10.3.x): refuse to build with another")
	f.StringVar(&o.cfg.TRT.TimingCacheDir, "timing-cache-dir", "", "`DIR` for TensorRT timing caches shared by a model's variants (default: the user cache dir)")
	f.StringVar(&o.cfg.Labels, "labels", "", "label `FILE` for a classification output, placed next to each config")
	kindFlag(f, &o.cfg.Template.InstanceKind)
	f.BoolVar(&o.cfg.Force, "force", false, "rebuild every variant even when the repository already has it")
	f.BoolVar(&o.skipUnavail, "skip-unavailable", false, "exit 0 when TensorRT variants cannot be built here (they are still listed)")
	formatFlag(f, &o.format)
	progressFlag(f, &o.progress)
}

func newConvertCmd(g *globalOptions) *cobra.Command {
	o := &convertOptions{}
	c := &cobra.Command{
		Use:   "convert MODEL --repo DIR",
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
		Example: `  kiln convert model.onnx --repo models --precision fp32,fp16
  kiln calibrate model.onnx --data images/ -o calib
  kiln convert model.onnx --repo models --precision fp32,fp16,int8 --runtime onnx,trt --max-batch 16 --calib-dir calib
  kiln convert model.onnx --repo models --variant trt-int8-b16-x4 --int8-random-ranges
  kiln convert -f pipeline.yaml`,
		Args: argsUsage(cobra.RangeArgs(0, 1)),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.config(c.Context(), args); err != nil {
				return err
			}
			if err := g.initORT(); err != nil { // every ONNX variant is checked in ONNX Runtime
				return err
			}
			if err := o.calibration(c, g); err != nil {
				return err
			}
			opts, err := o.collaborators(c, g)
			if err != nil {
				return err
			}
			report, done := newProgress(c.ErrOrStderr(), o.progress)
			res, err := convert.Run(c.Context(), o.cfg, append(opts, convert.WithProgress(report))...)
			done()
			return o.finish(c.OutOrStdout(), res, err)
		},
	}
	o.addFlags(c.Flags())
	return c
}

// config completes o.cfg from the arguments, the pipeline file and the
// flags that need more than a field, and checks it.
func (o *convertOptions) config(ctx context.Context, args []string) error {
	if len(args) == 1 {
		o.cfg.Source = args[0]
	}
	if o.file != "" {
		p, err := readPipeline(o.file)
		if err != nil {
			return usageErr(err)
		}
		if o.cfg.Source == "" {
			o.cfg.Source = p.Source
		}
		if o.cfg.Repo == "" {
			o.cfg.Repo = p.Repository
		}
		o.cfg.Variants = append(o.cfg.Variants, p.variants()...)
	}
	switch {
	case o.cfg.Source == "":
		return usageErr(errors.New("MODEL is required (or model: in the pipeline file)"))
	case o.cfg.Repo == "":
		return usageErr(errors.New("--repo is required (or repository: in the pipeline file)"))
	}
	feed, err := o.check.spec()
	if err != nil {
		return err
	}
	if o.cfg.Source, o.cfg.Imported, err = importedSource(ctx, o.cfg.Source, feed.Shapes); err != nil { // a SavedModel: its ONNX import
		return err
	}
	o.cfg.Variants = append(o.cfg.Variants, o.variants...)
	if len(o.cfg.Variants) == 0 {
		o.cfg.Variants = o.matrix.Expand()
	}
	o.cfg.ToolVersion = Version
	o.cfg.Int8.Mode = trtexec.Int8Mode(o.int8Mode)
	o.cfg.TRT.HardwareCompat = trtexec.HardwareCompat(o.hwCompat)
	if o.optLevel >= 0 {
		o.cfg.TRT.OptimizationLevel = &o.optLevel
	}
	if o.matrix.Target != "" || !o.trt.IsZero() {
		t := &trtexec.Target{ComputeCapability: o.matrix.Target}
		if !o.trt.IsZero() {
			t.TRT = &o.trt
		}
		o.cfg.TRT.Target = t
	}
	if o.cfg.TRT.TimingCacheDir == "" {
		if ucd, err := os.UserCacheDir(); err == nil {
			o.cfg.TRT.TimingCacheDir = filepath.Join(ucd, "kiln", "timing")
		}
	}
	if o.checkData.Path != "" {
		d := o.checkData
		feed.Dataset = &d
	}
	o.cfg.Check.Feed = feed
	o.cfg.Normalize.NoFoldBatchNorm = !o.foldBN
	if o.cfg.Normalize.Fix, err = fixedInputs(o.cfg.Source, o.fix); err != nil {
		return err
	}
	if err := o.cfg.Validate(); err != nil {
		return usageErr(err)
	}
	return nil
}

// calibration reads --calib-dir, or calibrates on the fly for --calib-data
// into the user cache directory, reusing an earlier run with the same
// inputs. On the fly, --int8-mode cache (implicit int8, TensorRT <= 10)
// asks for the TensorRT calibration cache, which observes every tensor.
func (o *convertOptions) calibration(c *cobra.Command, g *globalOptions) error {
	dir := o.calibDir
	if len(o.calib.cfg.Target) > 0 && (dir != "" || o.calib.cfg.Data.Path == "") {
		return usageErr(errors.New("--calib-accuracy-target calibrates on the fly with --calib-data; for a --calib-dir, give kiln calibrate --accuracy-target"))
	}
	if dir == "" && o.calib.cfg.Data.Path != "" {
		o.calib.fix = o.fix
		cfg, err := o.calib.config(o.cfg.Source)
		if err != nil {
			return err
		}
		cfg.TRTCache = o.int8Mode == string(trtexec.Int8Cache)
		ucd, err := os.UserCacheDir()
		if err != nil {
			return fmt.Errorf("calibrating for the int8 variants: %w", err)
		}
		cache := filepath.Join(ucd, "kiln", "calib")
		opts, done, err := calibrateCollaborators(c, g, cfg.Data.Path, o.progress)
		if err != nil {
			return err
		}
		var rep *calibrate.Report
		dir, rep, err = calibrate.RunCached(c.Context(), cfg, cache, opts...)
		done()
		if te := (*calibrate.TargetError)(nil); errors.As(err, &te) {
			if perr := printCalibration(c.ErrOrStderr(), formatText, "", te.Report); perr != nil {
				return perr
			}
			return &ExitError{Code: ExitCheck, Err: fmt.Errorf("calibrating for the int8 variants: %w", err)}
		}
		if err != nil {
			return fmt.Errorf("calibrating for the int8 variants: %w", err)
		}
		if rep == nil {
			fmt.Fprintf(c.ErrOrStderr(), "using existing calibration %s\n", dir)
		} else if err := printCalibration(c.ErrOrStderr(), formatText, dir, rep); err != nil {
			return err
		}
	}
	if dir == "" {
		return nil
	}
	out, err := calibrate.ReadOutput(dir)
	if err != nil {
		return err
	}
	o.cfg.Int8.Calibration = &out
	return nil
}

// collaborators finds trtexec and the GPU for the engine builds. Without
// trtexec on PATH the plan variants are recorded as needing a GPU; an
// explicit --trtexec that is not there is an error.
func (o *convertOptions) collaborators(c *cobra.Command, g *globalOptions) ([]convert.Option, error) {
	log := g.logger(c.ErrOrStderr())
	opts := []convert.Option{convert.WithLogger(log)}
	path, err := execx.LookPath("trtexec", o.trtexec)
	if err != nil {
		if o.trtexec != "" {
			return nil, err
		}
		return append(opts, convert.WithoutBuilder("trtexec not found")), nil
	}
	opts = append(opts, convert.WithBuilder(&trtexec.Tool{Path: path, Logger: log}))
	// The GPU the engines are built on, for provenance and the target check.
	// Without nvidia-smi the builds still run; the record then has what
	// trtexec logs.
	if gpus, err := trtexec.QueryGPUs(c.Context(), execx.Exec{}, ""); err == nil && len(gpus) > 0 {
		opts = append(opts, convert.WithGPU(&gpus[0]))
	} else if err != nil {
		log.Warn("cannot query the GPU with nvidia-smi; provenance will only have what trtexec logs", "err", err)
	}
	return opts, nil
}

// finish prints the result and turns it into the exit status: 1 when a
// variant failed, 4 when plan variants need a GPU (unless --skip-unavailable).
func (o *convertOptions) finish(w io.Writer, res *convert.Result, err error) error {
	if res != nil {
		if perr := printConvert(w, o.format, res); perr != nil && err == nil {
			err = perr
		}
	}
	var pe *convert.PlanError
	switch {
	case errors.As(err, &pe):
		return usageErr(err)
	case err != nil:
		return err
	}
	if failed := res.Failed(); len(failed) > 0 {
		var ce *convert.CheckError
		if errors.As(failed[0].Err, &ce) {
			return &ExitError{Code: ExitCheck, Err: fmt.Errorf("%d of %d variants failed; first: %w", len(failed), len(res.Rows), failed[0].Err)}
		}
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("%d of %d variants failed; first: %w", len(failed), len(res.Rows), failed[0].Err)}
	}
	if res.Partial() && !o.skipUnavail {
		return &ExitError{Code: ExitPartial, Err: errors.New("some TensorRT variants need trtexec, which was not found (pass --skip-unavailable to accept a partial repository)")}
	}
	return nil
}

func printConvert(w io.Writer, format string, res *convert.Result) error {
	if format == formatJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if res.Precision != "" && res.Precision != "fp32" {
		fmt.Fprintf(w, "source: computes in %s\n", res.Precision)
	}
	for _, n := range res.Normalized {
		fmt.Fprintf(w, "normalized: %s\n", n)
	}
	if res.FP16Kept > 0 {
		fmt.Fprintf(w, "fp16: %d nodes kept in fp32, their values leave fp16's safe range (-v lists them)\n", res.FP16Kept)
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

func init() {
	advisors = append(advisors, func(err error) string {
		var oe *calibrate.OutputError
		switch {
		case errors.Is(err, convert.ErrNoCalibration):
			return "run `kiln calibrate MODEL --data DIR -o CALIB` and pass --calib-dir CALIB, or give --calib-data DIR (--int8-random-ranges builds perf-only TensorRT engines)"
		case errors.As(err, &oe):
			return "--calib-dir takes the -o directory of `kiln calibrate`: run kiln calibrate MODEL --data DIR -o " + oe.Dir + " first"
		case errors.Is(err, convert.ErrNoCalibrationCache):
			return "rerun `kiln calibrate MODEL --data DIR --trt-cache -o CALIB` (the cache needs every tensor observed), or use --int8-mode qdq"
		}
		return ""
	})
}

func init() {
	advisors = append(advisors, func(err error) string {
		var se *pbtxt.ScalarError
		if errors.As(err, &se) {
			return fmt.Sprintf("fold the scalar into the model with --fix %s=VALUE (e.g. --fix sr=16000 for Silero VAD's sample rate), so Triton never sees it", se.Tensor)
		}
		var re *convert.RepoError
		if errors.As(err, &re) {
			return "give --repo a new or empty directory, or one kiln convert wrote (it has kiln.json)"
		}
		return ""
	})
}
