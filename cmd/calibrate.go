package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
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
}

func (o *calibrateOptions) addFlags(f *pflag.FlagSet) {
	o.addDataFlags(f, "")
	fixFlag(f, &o.fix)
	f.StringVar(&o.cfg.Data.ImageKey, "image-key", "", "tf.Example feature holding the encoded image in TFRecords (default image/encoded)")
	f.Float64Var(&o.cfg.MethodOptions.Percentile, "percentile", 0, "with --method percentile: p in (0,100] (default 99.999)")
	f.Int64Var(&o.cfg.Seed, "seed", 0, "seed for drawing samples")
	f.Float64Var(&o.cfg.CalibShare, "calib-fraction", 0.5, "share of the drawn samples used for calibration: a fraction below 1 or a count; the rest validate")
	f.IntVar(&o.cfg.Validation, "validation", 0, "at most this many validation samples (0: all the others, -1: no accuracy report)")
	f.IntVar(&o.cfg.Batch, "batch", 0, "batch size (0: the model's fixed batch dimension, or 16)")
	o.trt = manifest.TRTSpec{TRTVersion: calibrate.DefaultTRTVersion}
	trtVersionFlag(f, &o.trt, "TensorRT version named in the calibration.cache header: 10.3, 10.3.0 or trtexec's banner number (100300); TensorRT ignores a cache written for another version")
	f.StringSliceVar(&o.cfg.Exclude, "exclude", nil, "node names, node outputs or op types to keep in fp32 (repeat or separate with commas); the report shows accuracy before and after")
	f.StringVarP(&o.out, "output", "o", "", "output `DIR` (replaced as a whole when the run succeeds)")
	formatFlag(f, &o.format)
	progressFlag(f, &o.progress)
	o.session.addFlags(f, "")
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
per-tensor statistics (min/max and a histogram of |x|) for every graph input
and float node output, and chooses ranges with --method. It writes into -o DIR:

  ranges.json         the ranges (kiln's format; the source of the others)
  calibration.cache   TensorRT calibration cache (TRT-<version>-EntropyCalibration2)
  model.int8.onnx     explicitly quantized (Q/DQ) model: symmetric int8, per-channel
                      weights, per-tensor activations, placement as TensorRT recommends
  report.json/.md     int8 vs fp32 on the validation samples: per output cosine,
                      max/mean error, top-1/top-5 agreement; per tensor SQNR
  ort/                ONNX Runtime TensorRT execution provider calibration table

The samples drawn (--samples, --seed) are split into calibration and validation
sets (--calib-fraction, --validation). Everything is written to a temporary
directory next to DIR that replaces DIR only when the run succeeds.`,
		Example: `  kiln calibrate model.onnx --data images/ --preprocess imagenet -o calib/
  kiln calibrate model.onnx --data inputs.npy --samples 1000 --calib-fraction 500 -o calib/
  kiln calibrate model.onnx --data images/ --exclude Conv_0,Gemm --format json -o calib/`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := o.config(args[0])
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
	fmt.Fprintf(w, "calibrated %s with %s on %d samples: %d tensor ranges, cache TRT-%d\n",
		r.Model, r.Method, r.CalibrationSamples, r.TensorRanges, r.TRTVersion)
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
			if r.Baseline != nil {
				b := r.Baseline.Outputs[i]
				fmt.Fprintf(w, " (before --exclude: cosine %.6f", b.Cosine)
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
	}
	fmt.Fprintf(w, "wrote %s: %s\n", dir, strings.Join(r.Files, " "))
	return nil
}

func init() {
	advisors = append(advisors, func(err error) string {
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
