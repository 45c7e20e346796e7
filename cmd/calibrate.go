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
	"github.com/kiln-ml/kiln/ort"
)

type calibrateOptions struct {
	data       string
	format     string
	imageKey   string
	preprocess string
	method     string
	percentile float64
	samples    int
	seed       int64
	calibShare float64
	validation int
	batch      int
	trtVersion string
	exclude    []string
	out        string
	output     string
	progress   string
	device     string
	threads    int
}

func (o *calibrateOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.data, "data", "", "calibration data: a directory or file of images (.jpg, .png), .npy/.npz, .pb, .tfrecord or KServe .json")
	f.StringVar(&o.format, "format", "", "data format when it cannot be told from file names: images, numpy, pb, tfrecord or json")
	f.StringVar(&o.imageKey, "image-key", "", "tf.Example feature holding the encoded image in TFRecords (default image/encoded)")
	f.StringVar(&o.preprocess, "preprocess", "", "image preprocessing: a preset (imagenet, inception, caffe) and/or key=value items, e.g. imagenet or resize=256,crop=224,scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225")
	f.StringVar(&o.method, "method", "entropy", "range method: entropy (TensorRT EntropyCalibrator2), minmax, percentile or mse")
	f.Float64Var(&o.percentile, "percentile", 0, "with --method percentile: p in (0,100] (default 99.999)")
	f.IntVar(&o.samples, "samples", 0, "samples drawn from the data with --seed, for calibration and validation together (0: all)")
	f.Int64Var(&o.seed, "seed", 0, "seed for drawing samples")
	f.Float64Var(&o.calibShare, "calib-fraction", 0.5, "share of the drawn samples used for calibration: a fraction below 1 or a count; the rest validate")
	f.IntVar(&o.validation, "validation", 0, "at most this many validation samples (0: all the others, -1: no accuracy report)")
	f.IntVar(&o.batch, "batch", 0, "batch size (0: the model's fixed batch dimension, or 16)")
	f.StringVar(&o.trtVersion, "trt-version", "10.3.0", "TensorRT version named in the calibration.cache header (major.minor.patch, or the number from trtexec's banner such as 100300); TensorRT ignores a cache written for another version")
	f.StringSliceVar(&o.exclude, "exclude", nil, "node names, node outputs or op types to keep in fp32 (repeat or separate with commas); the report shows accuracy before and after")
	f.StringVarP(&o.out, "out", "o", "", "output directory (replaced as a whole when the run succeeds)")
	f.StringVar(&o.output, "output", "text", "summary format on stdout: text or json")
	f.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto (bars on a terminal, lines otherwise), bar, plain, json or none")
	f.StringVar(&o.device, "device", "cpu", "ONNX Runtime execution provider: cpu, cuda or tensorrt")
	f.IntVar(&o.threads, "threads", 0, "ONNX Runtime intra-op threads (0: its default)")
}

// config validates the flags and turns them into the library's config.
func (o *calibrateOptions) config(model string) (calibrate.Config, error) {
	if o.data == "" {
		return calibrate.Config{}, usageErr(errors.New("--data is required"))
	}
	if o.out == "" {
		return calibrate.Config{}, usageErr(errors.New("-o/--out is required"))
	}
	if o.output != "text" && o.output != "json" {
		return calibrate.Config{}, usageErr(fmt.Errorf("--output must be text or json, not %q", o.output))
	}
	if err := validProgress(o.progress); err != nil {
		return calibrate.Config{}, err
	}
	method, err := calibrate.ParseMethod(o.method)
	if err != nil {
		return calibrate.Config{}, usageErr(err)
	}
	var pre dataset.Preprocess
	if o.preprocess != "" {
		if pre, err = dataset.ParsePreprocess(o.preprocess); err != nil {
			return calibrate.Config{}, usageErr(err)
		}
	}
	trt, err := manifest.ParseTRTVersion(o.trtVersion)
	if err != nil {
		return calibrate.Config{}, usageErr(fmt.Errorf("--trt-version: %w", err))
	}
	cfg := calibrate.Config{
		Model:         model,
		Data:          dataset.Spec{Path: o.data, Format: dataset.Format(o.format), Preprocess: pre, ImageKey: o.imageKey},
		Method:        method,
		MethodOptions: calibrate.MethodOptions{Percentile: o.percentile},
		Samples:       o.samples,
		Seed:          o.seed,
		CalibShare:    o.calibShare,
		Validation:    o.validation,
		Batch:         o.batch,
		TRTVersion:    trt,
		Exclude:       o.exclude,
		Session:       ort.SessionOptions{Provider: ort.Provider(o.device), IntraOpThreads: o.threads},
	}
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
		Use:   "calibrate MODEL",
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
  kiln calibrate model.onnx --data images/ --exclude Conv_0,Gemm --output json -o calib/`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := o.config(args[0])
			if err != nil {
				return err
			}
			if err := g.initORT(); err != nil {
				return err
			}
			fsys, closeFS, err := dataFS(c.Context(), o.data)
			if err != nil {
				return err
			}
			defer closeFS()
			report, done := newProgress(c.ErrOrStderr(), o.progress)
			rep, err := calibrate.Run(c.Context(), cfg, o.out, calibrate.WithFS(fsys),
				calibrate.WithProgress(report), calibrate.WithLogger(g.logger(c.ErrOrStderr())))
			done()
			if err != nil {
				return err
			}
			return printCalibration(c.OutOrStdout(), o.output, o.out, rep)
		},
	}
	o.AddFlags(c.Flags())
	return c
}

func printCalibration(w io.Writer, format, dir string, r *calibrate.Report) error {
	if format == "json" {
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
