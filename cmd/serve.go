package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/pack"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/serve"
	"github.com/kiln-ml/kiln/serve/report"
)

type serveOptions struct {
	cfg        serve.Config
	data       dataset.Spec
	inputs     feedFlags
	thresholds []check.Override
	session    sessionFlags
	output     string
	format     string
	trtexec    string
	calibDir   string
	perf       bool
	endpoint   endpointFlags
	skip       bool
}

func (o *serveOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.cfg.Reference, "reference", "", "fp32 ONNX `MODEL` to compare a model file with (serve MODEL.onnx --reference REF.onnx)")
	f.Var(&parsedValue[manifest.Precision]{p: &o.cfg.Precision, typ: "precision", parse: manifest.ParsePrecision,
		text: func(p manifest.Precision) string { return string(p) }}, "precision", "with a model file: its precision, which picks the default thresholds (default fp32)")
	f.StringSliceVar(&o.cfg.Models, "models", nil, "check only these models of the repository")
	f.StringVar(&o.data.Path, "data", "", "validation data: images (.jpg, .png), .npy/.npz, .pb, .tfrecord or KServe .json; local or gs://bucket/prefix (default: seeded random data)")
	f.Var(&choiceValue{p: (*string)(&o.data.Format), choices: []string{"images", "numpy", "pb", "tfrecord", "json"}},
		"data-format", "data format when it cannot be told from file names: images, numpy, pb, tfrecord or json")
	f.Var(&parsedValue[dataset.Preprocess]{p: &o.data.Preprocess, typ: "spec", parse: dataset.ParsePreprocess, text: dataset.Preprocess.String},
		"preprocess", "image preprocessing, as kiln calibrate takes it (imagenet, or resize=640x640,scale=1/255,...)")
	f.StringVar(&o.calibDir, "calib-dir", "", "check on the validation split that kiln calibrate -o `DIR` set aside (the samples calibration did not see)")
	o.inputs.addFlags(f, "", "up to 32 of --data, or 8 random ones")
	thresholdFlag(f, &o.thresholds)
	f.BoolVar(&o.perf, "perf", true, "measure latency and throughput over the sweep (--perf=false: correctness only)")
	listFlag(f, &o.cfg.Perf.Concurrency, "concurrency", "ints", "concurrent requests of the latency sweep (default 1,2,4,8)", intAtLeast(1), strconv.Itoa)
	listFlag(f, &o.cfg.Perf.Batches, "perf-batch", "ints", "batch sizes of the sweep (default 1 and the config's max_batch_size)", intAtLeast(1), strconv.Itoa)
	f.IntVar(&o.cfg.Perf.Warmup, "warmup", 5, "requests sent before measuring, per batch size")
	f.DurationVar(&o.cfg.Perf.Window, "window", time.Second, "measurement window per concurrency and batch size")
	o.session.addFlags(f, "")
	f.StringVar(&o.trtexec, "trtexec", "", "trtexec executable `PATH` for TensorRT plans (default: trtexec on PATH)")
	f.StringVarP(&o.output, "output", "o", "", "`DIR` for report.json, report.md, report.html and <model>.b<batch>.perf.csv (perf_analyzer -f format)")
	o.endpoint.addFlags(f)
	f.BoolVar(&o.skip, "skip-unavailable", false, "exit 0 when the only artifacts not passed are ones this machine cannot run (TensorRT without a GPU; still reported not-checked)")
	formatFlag(f, &o.format)
}

func newServeCmd(g *globalOptions) *cobra.Command {
	o := &serveOptions{}
	c := &cobra.Command{
		Use:   "serve REPO | MODEL --reference REF",
		Short: "Load every artifact, compare it with fp32, time it, and say whether it may ship",
		Long: `serve loads every model of a Triton repository (or one model file), runs it on
validation data, compares every output with the fp32 ONNX Runtime reference and
times it over a concurrency sweep. Metrics per output: max abs/rel error, cosine
(mean and worst sample), top-1/top-5 agreement for classifiers, argmax or mask
agreement for dense outputs, NaN/Inf, and the smallest tolerance that would pass.

Exit codes: 0 every artifact passed; 3 one failed or did not load; 4 nothing
failed but some were not checked (TensorRT plans without trtexec/GPU) or not
judged (int8 on random data).

REPO may also be a published repository: gs://BUCKET/PREFIX, image:REF or
oci-layout:PATH[:TAG]. It is read (verified, as kiln pack --from reads it)
into a temporary directory, served from there and removed afterwards; the
verdicts serve records go to that copy.`,
		Example: `  kiln serve models --data val/ --preprocess imagenet -o report
  kiln serve model.fp16.onnx --reference model.onnx --precision fp16 --data val.npz
  kiln serve silero --input sr=16000 --shape input=1x512 --shape state=2x1x128
  kiln serve models --listen 127.0.0.1:8000 --metrics-listen 127.0.0.1:8002
  kiln serve models --triton http://triton:8000 --data val/ --preprocess imagenet
  kiln serve gs://my-bucket/models/resnet --listen 127.0.0.1:8000`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if err := g.initORT(); err != nil {
				return err
			}
			subject, cleanup, err := fetchRepo(c.Context(), g, args[0], c.ErrOrStderr())
			if err != nil {
				return err
			}
			defer cleanup()
			if o.endpoint.listen != "" {
				return o.endpoint.listenAndServe(c.Context(), subject, *o, g.logger(c.ErrOrStderr()), c.OutOrStdout())
			}
			rep, err := o.run(c.Context(), g, subject, c.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := o.print(c.OutOrStdout(), rep); err != nil {
				return err
			}
			if code := rep.ExitCode(); code != 0 && !(o.skip && rep.Verdict == report.NotChecked) {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	o.addFlags(c.Flags())
	return c
}

// fetchRepo reads a published repository (gs://, image:, oci-layout:)
// into a temporary directory under os.TempDir and returns that directory
// and the function that removes it; any other subject is returned as it is.
func fetchRepo(ctx context.Context, g *globalOptions, subject string, stderr io.Writer) (string, func(), error) {
	if !strings.HasPrefix(subject, "gs://") && !strings.HasPrefix(subject, "image:") && !strings.HasPrefix(subject, "oci-layout:") {
		return subject, func() {}, nil
	}
	src, err := pack.ParseDestination(subject)
	if err != nil {
		return "", nil, usageErr(err)
	}
	tmp, err := os.MkdirTemp("", "kiln-serve-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	dir := filepath.Join(tmp, "repo")
	_, err = pack.Pull(ctx, src, dir, pack.WithLogger(g.logger(stderr)), pack.WithRegistry(pack.DefaultRegistry(false)))
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return dir, cleanup, nil
}

// run builds the config from the flags and runs the checks.
func (o *serveOptions) run(ctx context.Context, g *globalOptions, subject string, stderr io.Writer) (*report.Report, error) {
	cfg := o.cfg
	st, err := os.Stat(subject)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		cfg.Repository = subject
	} else {
		cfg.Model = subject
	}
	if cfg.Feed, err = o.inputs.spec(); err != nil {
		return nil, err
	}
	if o.calibDir != "" && o.data.Path != "" {
		return nil, usageErr(errors.New("give --data or --calib-dir, not both"))
	}
	if o.calibDir != "" {
		out, err := calibrate.ReadOutput(o.calibDir)
		if err != nil {
			return nil, err
		}
		if out.Validation == nil {
			return nil, fmt.Errorf("%s records no validation split (calibrated with --validation -1, or by an older kiln): give --data", o.calibDir)
		}
		pre, err := dataset.ParsePreprocess(out.Validation.Preprocess)
		if err != nil {
			return nil, fmt.Errorf("%s: the recorded preprocessing: %w", o.calibDir, err)
		}
		o.data = dataset.Spec{Path: out.Validation.Path, Format: dataset.Format(out.Validation.Format), Preprocess: pre}
		cfg.Feed.Indices = out.Validation.Indices
	}
	if o.data.Path != "" {
		d := o.data
		cfg.Feed.Dataset = &d
		if strings.HasPrefix(d.Path, "gs://") {
			gcs, err := dataset.NewGCS(ctx)
			if err != nil {
				return nil, err
			}
			cfg.Feed.FS = gcs
		}
	}
	cfg.Thresholds = o.thresholds
	cfg.Perf.Disabled = !o.perf
	cfg.Tool = "kiln " + version()
	cfg.Device = o.session.device
	if err := cfg.Validate(); err != nil {
		return nil, usageErr(err)
	}
	log := g.logger(stderr)
	opts, stop, err := o.runtimes(ctx, &cfg, log)
	if err != nil {
		return nil, err
	}
	defer stop()
	rep, err := serve.Run(ctx, cfg, opts...)
	if err != nil {
		return nil, err
	}
	rep.ORTVersion = ort.Version()
	if o.output != "" {
		if _, err := serve.WriteReports(o.output, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// runtimes picks what runs each platform: ONNX Runtime for ONNX models;
// trtexec for TensorRT plans when it is here (without it they are "not
// checked: needs GPU/TensorRT"; an explicit --trtexec that is not there is
// an error); or, with --triton/--start-triton, the server for both.
func (o *serveOptions) runtimes(ctx context.Context, cfg *serve.Config, log *slog.Logger) ([]serve.Option, func(), error) {
	opts := []serve.Option{serve.WithLogger(log), serve.WithRuntime(pbtxt.PlatformONNX, serve.ORT{Options: o.session.options()})}
	if o.endpoint.triton != "" || o.endpoint.startTriton {
		if cfg.Repository == "" {
			return nil, nil, usageErr(errors.New("--triton and --start-triton check a repository, not a model file"))
		}
		rt, stop, err := o.endpoint.tritonRuntime(ctx, cfg.Repository, log)
		if err != nil {
			return nil, nil, err
		}
		cfg.Device = "triton " + o.endpoint.triton
		if o.endpoint.startTriton {
			cfg.Device = "tritonserver started by kiln"
		}
		return append(opts, serve.WithRuntime(pbtxt.PlatformONNX, rt), serve.WithRuntime(pbtxt.PlatformTensorRT, rt)), stop, nil
	}
	path, err := execx.LookPath("trtexec", o.trtexec)
	switch {
	case err == nil:
		opts = append(opts, serve.WithRuntime(pbtxt.PlatformTensorRT, serve.Trtexec{Tool: &trtexec.Tool{Path: path, Logger: log}}))
	case o.trtexec != "":
		return nil, nil, err
	}
	return opts, func() {}, nil
}

// print writes the report's summary on stdout: the Markdown tables, or the
// JSON report with --format json.
func (o *serveOptions) print(w io.Writer, rep *report.Report) error {
	if o.format == formatJSON {
		return report.WriteJSON(w, rep)
	}
	if err := report.WriteMarkdown(w, rep); err != nil {
		return err
	}
	if o.output != "" {
		_, err := fmt.Fprintf(w, "\nreports: %s/%s (open in a browser), %s, %s\n", o.output, serve.ReportHTML, serve.ReportMarkdown, serve.ReportJSON)
		return err
	}
	return nil
}
