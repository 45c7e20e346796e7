package cmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
)

// calibrateOptions are kiln calibrate's flags; convert's --calib-* flags
// fill the same config (see addDataFlags).
type calibrateOptions struct {
	cfg      calibrate.Config
	trt      manifest.TRTSpec
	session  sessionFlags
	out      string
	format   string
	progress string
	fix      []string
	shapes   []string
}

func (o *calibrateOptions) addFlags(f *pflag.FlagSet) {
	o.addDataFlags(f, "")
	fixFlag(f, &o.fix)
	f.StringArrayVar(&o.shapes, "shape", nil, "for a SavedModel MODEL: the shape of an input TensorFlow left unranked, as kiln convert --shape gives it to the import: NAME=DIMS, -1 a dynamic dimension (repeatable)")
	f.StringVar(&o.cfg.Data.ImageKey, "image-key", "", "tf.Example feature holding the encoded image in TFRecords (default image/encoded)")
	f.Float64Var(&o.cfg.MethodOptions.Percentile, "percentile", 0, "with --method percentile: p in (0,100] (default 99.999)")
	f.Float64Var(&o.cfg.MethodOptions.EntropyMaxClip, "entropy-max-clip", 0, "with --method entropy: most of a tensor's values, in percent, a cut may clip (0: 1; -1: no limit, TensorRT's EntropyCalibrator2 as is)")
	f.Int64Var(&o.cfg.Seed, "seed", 0, "seed for drawing samples")
	f.Float64Var(&o.cfg.CalibShare, "calib-fraction", 0.5, "share of the drawn samples used for calibration: a fraction below 1 or a count; the rest validate")
	f.IntVar(&o.cfg.Validation, "validation", 0, "at most this many validation samples (0: all the others; -1: no validation, every drawn sample calibrates, no accuracy report)")
	f.BoolVar(&o.cfg.TRTCache, "trt-cache", false, "also write calibration.cache, the TensorRT calibration cache for implicit int8 (TensorRT <= 10); observes every tensor")
	f.BoolVar(&o.cfg.ORTTable, "ort-table", false, "also write ort/, ONNX Runtime's TensorRT execution provider calibration table; observes every tensor")
	f.IntVar(&o.cfg.Batch, "batch", 0, "batch size (0: the model's fixed batch dimension, or 16)")
	o.trt = manifest.TRTSpec{TRTVersion: calibrate.DefaultTRTVersion}
	trtVersionFlag(f, &o.trt, "TensorRT version named in the calibration.cache header: 10.3, 10.3.0 or trtexec's banner number (100300); TensorRT ignores a cache written for another version")
	f.StringSliceVar(&o.cfg.Exclude, "exclude", nil, "node names, node outputs or op types to keep in fp32 (repeat or separate with commas); the report shows accuracy before and after")
	f.StringVarP(&o.out, "output", "o", "", "output `DIR` (replaced as a whole when the run succeeds)")
	formatFlag(f, &o.format)
	progressFlag(f, &o.progress)
	o.session.addFlags(f, "")
	f.Lookup("threads").Usage = "ONNX Runtime intra-op threads (0: one per CPU); the histogram workers, one per two CPUs, share the same CPUs at idle priority, adding a run's activations on the CPU time ONNX Runtime leaves while it computes the next run"
	sizeFlag(f, &o.cfg.MemoryBudget, "memory-budget", 0, "most activation memory one ONNX Runtime run may fetch, e.g. 4GiB (0: a quarter of the machine's memory, from /proc/meminfo); a sample whose observed tensors take more runs once per group of tensors that fits, with the same results")
}

// addDataFlags defines the flags that say what to calibrate on and how;
// prefix names them for convert ("calib-" gives --calib-data, ...).
func (o *calibrateOptions) addDataFlags(f *pflag.FlagSet, prefix string) {
	what := ""
	if prefix != "" {
		what = "with --" + prefix + "data: "
	}
	o.cfg.Method = calibrate.Entropy
	dataUsage := "calibration data: a directory or file of images (.jpg, .png), .npy/.npz, .pb, .tfrecord or KServe .json; local or gs://bucket/prefix"
	if prefix != "" {
		dataUsage = "calibrate on the fly from this data (as kiln calibrate --data) when no --calib-dir is given; results are cached in the user cache dir"
	}
	f.StringVar(&o.cfg.Data.Path, prefix+"data", "", dataUsage)
	f.Var(&parsedValue[calibrate.Method]{p: &o.cfg.Method, typ: "method", parse: calibrate.ParseMethod,
		text: func(m calibrate.Method) string { return string(m) }},
		prefix+"method", what+"range method: entropy (TensorRT EntropyCalibrator2), minmax, percentile or mse")
	f.Var(&parsedValue[dataset.Preprocess]{p: &o.cfg.Data.Preprocess, typ: "spec", parse: dataset.ParsePreprocess,
		text: dataset.Preprocess.String},
		prefix+"preprocess", what+"image preprocessing: a preset (imagenet, inception, caffe) and/or key=value items, e.g. imagenet or resize=256,crop=224,scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225")
	f.IntVar(&o.cfg.Samples, prefix+"samples", 0, what+"samples drawn from the data with --seed, for calibration and validation together (0: all)")
	f.Var(&targetValue{p: &o.cfg.Target}, prefix+"accuracy-target",
		what+"accuracy the int8 model must reach on the validation samples: METRIC=VALUE items (cosine, min_cosine, top1, top5, agreement) for every output, OUTPUT:METRIC=VALUE for one, e.g. cosine=0.99,top1=0.98 (repeatable); layers are kept in fp32, worst SQNR first, until it does; exit 3 with the best reached when it cannot")
	if prefix == "" {
		f.Var(&choiceValue{p: (*string)(&o.cfg.Data.Format), choices: []string{"images", "numpy", "pb", "tfrecord", "json"}},
			"data-format", "data format when it cannot be told from file names: images, numpy, pb, tfrecord or json")
	}
}

// config completes and checks the calibration config for model.
func (o *calibrateOptions) config(model string) (calibrate.Config, error) {
	cfg := o.cfg
	cfg.Model = model
	cfg.TRTVersion = o.trt.TRTVersion
	cfg.Session = o.session.options()
	cfg.Session.IntraOpThreads = resolveThreads(cfg.Session.IntraOpThreads)
	if cfg.MemoryBudget == 0 {
		cfg.MemoryBudget = defaultMemoryBudget()
	}
	if cfg.Data.Path == "" {
		return calibrate.Config{}, usageErr(errors.New("--data is required"))
	}
	fix, err := fixedInputs(model, o.fix)
	if err != nil {
		return calibrate.Config{}, err
	}
	cfg.Fix = fix
	if err := cfg.Validate(); err != nil {
		return calibrate.Config{}, usageErr(err)
	}
	if err := cfg.Data.Validate(); err != nil {
		return calibrate.Config{}, usageErr(err)
	}
	return cfg, nil
}

func newCalibrateCmd(g *globalOptions) *cobra.Command {
	o := &calibrateOptions{}
	c := &cobra.Command{
		Use:   "calibrate MODEL -o DIR",
		Short: "Calibrate INT8 ranges on real data and write a Q/DQ model, TensorRT cache and accuracy report",
		Long: `calibrate runs samples through the fp32 ONNX model in ONNX Runtime, collects
per-tensor statistics (min/max and a histogram of |x|) and chooses ranges with
--method. By default it observes only the tensors the Q/DQ model quantizes
(scope qdq); --trt-cache and --ort-table need every graph input and float node
output, and observe them all (scope all). It writes into -o DIR:

  ranges.json         the ranges (kiln's format; the source of the others)
  model.int8.onnx     explicitly quantized (Q/DQ) model: symmetric int8, per-channel
                      weights, per-tensor activations, placement as TensorRT recommends
  report.json/.md     int8 vs fp32 on the validation samples: per output cosine,
                      max/mean error, top-1/top-5 agreement; per tensor SQNR; scope
  calibration.cache   with --trt-cache: TensorRT calibration cache
                      (TRT-<version>-EntropyCalibration2, implicit int8, TensorRT <= 10)
  ort/                with --ort-table: ONNX Runtime TensorRT execution provider
                      calibration table

The samples drawn (--samples, --seed) are split into calibration and validation
sets (--calib-fraction, --validation; --validation -1 calibrates on all of
them). Everything is written to a temporary directory next to DIR that
replaces DIR only when the run succeeds.`,
		Example: `  kiln calibrate model.onnx --data images/ --preprocess imagenet -o calib/
  kiln calibrate model.onnx --data inputs.npy --samples 1000 --calib-fraction 500 -o calib/
  kiln calibrate model.onnx --data images/ --exclude Conv_0,Gemm --format json -o calib/`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			shapes, err := check.ParseShapes(o.shapes)
			if err != nil {
				return usageErr(err)
			}
			model, _, err := importedSource(c.Context(), args[0], shapes) // a SavedModel: its ONNX import
			if err != nil {
				return err
			}
			cfg, err := o.config(model)
			if err != nil {
				return err
			}
			if o.out == "" {
				return usageErr(errors.New("-o/--output is required"))
			}
			opts, done, err := calibrateCollaborators(c, g, cfg.Data.Path, o.progress)
			if err != nil {
				return err
			}
			rep, err := calibrate.Run(c.Context(), cfg, o.out, opts...)
			done()
			if te := (*calibrate.TargetError)(nil); errors.As(err, &te) {
				if perr := printCalibration(c.OutOrStdout(), o.format, "", te.Report); perr != nil {
					return perr
				}
				return &ExitError{Code: ExitCheck, Err: err}
			}
			if err != nil {
				return err
			}
			return printCalibration(c.OutOrStdout(), o.format, o.out, rep)
		},
	}
	o.addFlags(c.Flags())
	return c
}

// calibrateCollaborators loads ONNX Runtime and returns calibrate's
// collaborators: the data's storage, progress and logging, for kiln
// calibrate and for convert's calibration on the fly. done closes the
// storage and ends the progress display.
func calibrateCollaborators(c *cobra.Command, g *globalOptions, data, progressMode string) (opts []calibrate.Option, done func(), err error) {
	if err := g.initORT(); err != nil {
		return nil, nil, err
	}
	fsys, closeFS, err := dataFS(c.Context(), data)
	if err != nil {
		return nil, nil, err
	}
	report, endProgress := newProgress(c.ErrOrStderr(), progressMode)
	opts = []calibrate.Option{calibrate.WithFS(fsys), calibrate.WithProgress(report), calibrate.WithLogger(g.logger(c.ErrOrStderr()))}
	return opts, func() { endProgress(); closeFS() }, nil
}

func printCalibration(w io.Writer, format, dir string, r *calibrate.Report) error {
	if format == formatJSON {
		b, err := r.JSON()
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	fmt.Fprintf(w, "calibrated %s with %s on %d samples: %d tensor ranges (scope %s)", r.Model, r.Method, r.CalibrationSamples, r.TensorRanges, r.Scope)
	if slices.Contains(r.Files, calibrate.CacheFile) {
		fmt.Fprintf(w, ", cache TRT-%d", r.TRTVersion)
	}
	fmt.Fprintln(w)
	if r.UnusedSamples > 0 {
		fmt.Fprintf(w, "%d samples unused: the model fixes its batch at %d and they make no full batch\n", r.UnusedSamples, r.Batch)
	}
	if q := r.Quantization; q != nil {
		fmt.Fprintf(w, "Q/DQ model: opset %d, %d activations, %d int8 weights, %d layers quantized", q.Opset, len(q.Activations), len(q.Weights), len(q.Layers))
		if len(q.Excluded) > 0 {
			fmt.Fprintf(w, ", %d kept in fp32", len(q.Excluded))
		}
		fmt.Fprintln(w)
	}
	if a := r.Accuracy; a != nil {
		fmt.Fprintf(w, "int8 vs fp32 on %d validation samples:\n", a.Samples)
		for i, out := range a.Outputs {
			fmt.Fprintf(w, "  %s: cosine %.6f, max abs %.4g, mean abs %.4g", out.Output, out.Cosine, out.MaxAbs, out.MeanAbs)
			if out.Classifier {
				fmt.Fprintf(w, ", top-1 %.4f, top-5 %.4f", out.Top1, out.Top5)
			}
			if out.Agreement != nil {
				fmt.Fprintf(w, ", %s agreement %.4f", out.AgreementKind, *out.Agreement)
			}
			if r.Baseline != nil {
				b := r.Baseline.Outputs[i]
				before := "before --exclude"
				if r.Target != nil && len(r.Exclude) == 0 {
					before = "as calibrated"
				}
				fmt.Fprintf(w, " (%s: cosine %.6f", before, b.Cosine)
				if b.Classifier {
					fmt.Fprintf(w, ", top-1 %.4f", b.Top1)
				}
				fmt.Fprint(w, ")")
			}
			fmt.Fprintln(w)
		}
		var worst []string
		for _, t := range r.Worst[:min(3, len(r.Worst))] {
			worst = append(worst, fmt.Sprintf("%s %.1f dB", t.Tensor, t.SQNR))
		}
		fmt.Fprintf(w, "worst tensors (SQNR): %s\n", strings.Join(worst, ", "))
		if miss, target := serveInt8Misses(a); len(miss) > 0 {
			fmt.Fprintf(w, "note: kiln serve's default int8 checks would refuse this model: %s; --accuracy-target %s asks calibrate for them (or give serve a --threshold)\n", strings.Join(miss, ", "), target)
		}
	}
	if t := r.Target; t != nil {
		printTarget(w, t)
	}
	if dir == "" {
		fmt.Fprintln(w, "nothing written: the accuracy target is not met")
		return nil
	}
	fmt.Fprintf(w, "wrote %s: %s\n", dir, strings.Join(r.Files, " "))
	return nil
}

// serveInt8Misses lists what of a an int8 variant would fail in kiln
// serve's default checks (check.Judge with check.Defaults), and the
// --accuracy-target that asks for it: a target of cosine=0.99 alone can be
// met by a model whose worst sample serve refuses.
func serveInt8Misses(a *calibrate.Accuracy) (miss []string, target string) {
	targetMetric := map[string]string{"cosine": calibrate.MetricCosine, "worst_cosine": calibrate.MetricMinCosine,
		"top1_agreement": calibrate.MetricTop1, "top5_agreement": calibrate.MetricTop5, "agreement": calibrate.MetricAgreement}
	var want []string
	for _, o := range a.Outputs {
		m := check.Metrics{Output: o.Output, Cosine: o.Cosine, WorstCosine: o.MinCosine, Agreement: o.Agreement}
		if o.Classifier {
			m.Top1 = &o.Top1
			if o.Top5 > 0 { // 0: fewer than 6 classes
				m.Top5 = &o.Top5
			}
		}
		for _, f := range check.Judge(m, check.Defaults(manifest.INT8)) {
			miss = append(miss, fmt.Sprintf("%s %s %.4g < %g", f.Output, f.Metric, f.Value, f.Threshold))
			if t := fmt.Sprintf("%s=%g", targetMetric[f.Metric], f.Threshold); !slices.Contains(want, t) {
				want = append(want, t)
			}
		}
	}
	return miss, strings.Join(want, ",")
}

// printTarget prints what the search for the accuracy target did: each
// step with the layers it kept, then the outcome.
func printTarget(w io.Writer, t *calibrate.TargetReport) {
	fmt.Fprintf(w, "accuracy target %s:\n", t.Target)
	for i, st := range t.Steps {
		var change, got []string
		added, dropped := t.Change(i)
		for _, l := range added {
			change = append(change, "+"+cmp.Or(l.Node, l.Output))
		}
		for _, l := range dropped {
			change = append(change, "-"+cmp.Or(l.Node, l.Output))
		}
		for _, o := range st.Outputs {
			m := fmt.Sprintf("%s cosine %.6f, min cosine %.6f", o.Output, o.Cosine, o.MinCosine)
			if o.Classifier {
				m += fmt.Sprintf(", top-1 %.4f, top-5 %.4f", o.Top1, o.Top5)
			}
			got = append(got, m)
		}
		what := "as calibrated"
		if i > 0 {
			what = fmt.Sprintf("%d in fp32: %s", len(st.Kept), strings.Join(change, " "))
		}
		fmt.Fprintf(w, "  step %d (%s): %s; int8 compute %.1f%%\n", i, what, strings.Join(got, "; "), 100*st.Int8Share)
	}
	var kept []string
	for _, l := range t.Kept {
		kept = append(kept, cmp.Or(l.Node, l.Output))
	}
	verdict := "met"
	if !t.Met {
		verdict = "not met; the best reached"
	}
	fmt.Fprintf(w, "%s at step %d: %d layers kept in fp32 (%s), %.1f%% of compute int8\n", verdict, t.Best, len(t.Kept), cmp.Or(strings.Join(kept, ", "), "none"), 100*t.Int8Share)
}

// targetValue is --accuracy-target: each use adds its bounds
// (calibrate.ParseTarget) to the target.
type targetValue struct{ p *calibrate.Target }

func (v *targetValue) String() string {
	if v.p == nil {
		return ""
	}
	return v.p.String()
}
func (v *targetValue) Type() string { return "spec" }
func (v *targetValue) Set(s string) error {
	t, err := calibrate.ParseTarget(s)
	if err != nil {
		return err
	}
	*v.p = append(*v.p, t...)
	return v.p.Validate()
}

func init() {
	advisors = append(advisors, func(err error) string {
		var te *calibrate.TargetError
		if errors.As(err, &te) {
			return "loosen the target, try another --method, or calibrate on more samples; report.md of a run without the target names the worst layers"
		}
		var ae *calibrate.ActivationError
		if errors.As(err, &ae) {
			return "the model computes NaN or Inf for that sample: check the sample and --preprocess (scale, mean, std), or leave the sample out"
		}
		if errors.Is(err, dataset.ErrNoSamples) {
			return "point --data at a directory or file of .jpg/.png images, .npy/.npz, .pb, .tfrecord or KServe .json samples"
		}
		var se *dataset.SampleError
		if errors.As(err, &se) {
			return "fix or remove that sample; the model's inputs are listed by `kiln inspect MODEL`"
		}
		return ""
	})
}

// dataFS returns the storage for a --data value: Google Cloud Storage for a
// gs:// prefix (Application Default Credentials; STORAGE_EMULATOR_HOST is
// honoured by the storage library), the local file system otherwise.
func dataFS(ctx context.Context, data string) (dataset.FS, func(), error) {
	if !strings.HasPrefix(data, "gs://") {
		return dataset.Local{}, func() {}, nil
	}
	g, err := dataset.NewGCS(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("opening Google Cloud Storage for %s: %w", data, err)
	}
	return g, func() { g.Close() }, nil
}
