package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
	"github.com/kiln-ml/kiln/ort"
)

type inspectOptions struct {
	format     string
	run        bool
	feed       feedFlags
	batch      int
	iterations int
	session    sessionFlags
	progress   string
}

func (o *inspectOptions) addFlags(f *pflag.FlagSet) {
	formatFlag(f, &o.format)
	f.BoolVar(&o.run, "run", false, "also run the model once through ONNX Runtime on synthetic inputs and time it")
	f.IntVar(&o.batch, "batch", 1, "with --run: size of dynamic first dimensions")
	f.IntVar(&o.iterations, "iterations", 10, "with --run: timed runs after one warm-up")
	o.session.addFlags(f, "with --run: ")
	f.StringArrayVar(&o.feed.named, "input", nil, "with --run: feed an input by name: NAME=FILE.npy, NAME=FILE.pb or NAME=NUMBER (repeatable), e.g. --input sr=16000")
	f.StringArrayVar(&o.feed.shapes, "shape", nil, "with --run: shape of an input filled with random data: NAME=DIMS, e.g. --shape x=1x3x640x640 (repeatable); a dynamic dimension other than the batch needs one")
	progressFlag(f, &o.progress)
}

func (o *inspectOptions) validate() error {
	if o.batch < 1 || o.iterations < 1 {
		return usageErr(fmt.Errorf("--batch and --iterations must be at least 1"))
	}
	return nil
}

// inspectResult is one model's summary plus, with --run, its smoke run.
type inspectResult struct {
	onnx.Summary
	// SourcePrecision is what the model really computes in (fp32, mixed,
	// fp16, int8; onnx/normalize), PrecisionReason how kiln can tell.
	SourcePrecision string           `json:"source_precision"`
	PrecisionReason string           `json:"precision_reason"`
	Run             *ort.SmokeReport `json:"run,omitempty"`
}

func newInspectCmd(g *globalOptions) *cobra.Command {
	o := &inspectOptions{}
	c := &cobra.Command{
		Use:   "inspect MODEL...",
		Short: "Describe an ONNX model (signature, opsets, parameters, ops, precision, batching) or a SavedModel",
		Long: `inspect prints what kiln sees in an ONNX model: IR version, opsets, producer,
inputs and outputs (element type and shape, with symbolic dimensions), the
parameter count and bytes per element type, node counts per op type, whether
the model is already fp16 or INT8 (Q/DQ or QLinear operators), and whether
Triton can batch it (every input and output has a dynamic first dimension).

Given a TensorFlow SavedModel directory (local or gs://) instead, it prints
each MetaGraphDef's tags and SignatureDefs as saved_model_cli show --all does;
a model base directory's highest numeric version is used, as TensorFlow
Serving picks it. With --run, each SavedModel is imported as convert imports
it (a --shape naming an input TensorFlow left unranked gives it its shape) and
the ONNX import is described and run.`,
		Example: `  kiln inspect model.onnx
  kiln inspect models/half_plus_two          # SavedModel: highest version directory
  kiln inspect --format json model.onnx | jq .batch
  kiln inspect --run --batch 8 model.onnx`,
		Args: argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			sm, err := savedModelArgs(args)
			switch {
			case err != nil:
				return err
			case sm && o.run:
				if args, err = o.importForRun(c.Context(), args); err != nil {
					return err
				}
			case sm:
				return o.inspectSavedModels(c.Context(), c.OutOrStdout(), args)
			}
			if o.run {
				if err := g.initORT(); err != nil {
					return err
				}
			}
			report, done := newProgress(c.ErrOrStderr(), o.progress)
			sums, err := o.inspect(c.Context(), args, report)
			done()
			if err != nil {
				return err
			}
			return printInspect(c.OutOrStdout(), o.format, sums)
		},
	}
	o.addFlags(c.Flags())
	return c
}

// inspect summarizes every model and, with --run, smoke-runs it.
func (o *inspectOptions) inspect(ctx context.Context, paths []string, report progress.Reporter) ([]inspectResult, error) {
	task := progress.Start(report, "inspect", int64(len(paths)), "models")
	var sums []inspectResult
	for _, path := range paths {
		r, err := inspectFile(path)
		if err != nil {
			task.Finish(err)
			return nil, err
		}
		if o.run {
			if r.Run, err = ort.Smoke(ctx, path, o.session.options(), o.batch, o.iterations, o.smokeInputs(ctx)); err != nil {
				err = fmt.Errorf("running %s: %w", path, err)
				task.Finish(err)
				return nil, err
			}
		}
		sums = append(sums, r)
		task.Add(1)
	}
	task.Finish(nil)
	return sums, nil
}

func printInspect(w io.Writer, format string, sums []inspectResult) error {
	return printResults(w, format, sums, printSummary)
}

// printResults prints inspect's results: one JSON object for one result,
// an array for several, or each as text (print) with a blank line between.
func printResults[T any](w io.Writer, format string, results []T, print func(io.Writer, T)) error {
	if format == formatJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if len(results) == 1 {
			return enc.Encode(results[0])
		}
		return enc.Encode(results)
	}
	for i, r := range results {
		if i > 0 {
			fmt.Fprintln(w)
		}
		print(w, r)
	}
	return nil
}

func inspectFile(path string) (inspectResult, error) {
	st, err := os.Stat(path)
	if err != nil {
		return inspectResult{}, err
	}
	if st.IsDir() {
		return inspectResult{}, fmt.Errorf("%s is a directory: inspect reads ONNX model files and SavedModel directories", path)
	}
	m, err := onnx.Load(path)
	if err != nil {
		return inspectResult{}, err
	}
	// Refuse what ONNX Runtime would refuse, with the reason, before
	// describing it as if it were usable.
	if err := normalize.Check(m); err != nil {
		return inspectResult{}, err
	}
	r := inspectResult{Summary: onnx.Summarize(m)}
	p, why := normalize.SourcePrecision(m)
	r.SourcePrecision, r.PrecisionReason = string(p), why
	return r, nil
}

func printSummary(w io.Writer, r inspectResult) {
	s := r.Summary
	fmt.Fprintf(w, "model:      %s\n", s.Path)
	fmt.Fprintf(w, "ir_version: %d\n", s.IRVersion)
	var ops []string
	for _, o := range s.Opsets {
		ops = append(ops, fmt.Sprintf("%s %d", o.Domain, o.Version))
	}
	fmt.Fprintf(w, "opsets:     %s\n", strings.Join(ops, ", "))
	if s.Producer != "" {
		fmt.Fprintf(w, "producer:   %s %s\n", s.Producer, s.ProducerVersion)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nI/O\tNAME\tTYPE\tSHAPE")
	for _, t := range s.Inputs {
		fmt.Fprintf(tw, "input\t%s\t%s\t%s\n", t.Name, typeOrKind(t), shapeText(t))
	}
	for _, t := range s.Outputs {
		fmt.Fprintf(tw, "output\t%s\t%s\t%s\n", t.Name, typeOrKind(t), shapeText(t))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nparameters: %s (%s)\n", humanCount(s.Params.Count), humanBytes(s.Params.Bytes))
	for _, p := range s.Params.ByType {
		fmt.Fprintf(w, "  %-10s %12d  %s\n", p.Type, p.Count, humanBytes(p.Bytes))
	}
	fmt.Fprintf(w, "nodes:      %d\n", s.Nodes)
	for _, o := range s.OpCounts {
		fmt.Fprintf(w, "  %-24s %d\n", o.Op, o.Count)
	}
	fmt.Fprintf(w, "precision:  %s: %s (float types: %s)\n", r.SourcePrecision, r.PrecisionReason, orNone(s.Precision.FloatTypes))
	verdict := "no"
	if s.Batch.Batchable {
		verdict = "yes"
	}
	fmt.Fprintf(w, "batchable:  %s: %s\n", verdict, s.Batch.Reason)
	for _, kv := range s.Metadata {
		fmt.Fprintf(w, "metadata:   %s = %s\n", kv.Key, kv.Value)
	}
	for _, warn := range s.Warnings {
		fmt.Fprintf(w, "warning:    %s\n", warn)
	}
	if run := r.Run; run != nil {
		fmt.Fprintf(w, "\nrun:        ONNX Runtime %s, %s, batch %d: mean %.3f ms, p50 %.3f ms, max %.3f ms over %d runs\n",
			run.ORTVersion, run.Provider, run.Batch, run.LatencyMeanMS, run.LatencyP50MS, run.LatencyMaxMS, run.Iterations)
		for _, o := range run.Outputs {
			finite := "all finite"
			if !o.Finite {
				finite = "NaN/Inf present"
			}
			fmt.Fprintf(w, "  %s %s %v: min %.4g max %.4g mean %.4g (%s)\n", o.Name, o.Type, o.Shape, o.Min, o.Max, o.Mean, finite)
		}
	}
}

func typeOrKind(t onnx.TensorInfo) string {
	if t.Type != "" {
		return t.Type
	}
	return t.Kind
}

func shapeText(t onnx.TensorInfo) string {
	if t.Rank < 0 {
		return "unranked"
	}
	return "[" + strings.Join(t.Shape, ",") + "]"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// smokeInputs builds --run's inputs from --input and --shape: named tensors
// as given, the rest seeded random data of the given shape, the batch
// dimension set by --batch. An input with a dynamic dimension other than
// the batch needs --shape: a detector fed a 1x1 image or an audio model a
// one-sample chunk would run, but its timings would mean nothing.
func (o *inspectOptions) smokeInputs(ctx context.Context) func([]ort.IOInfo) (map[string]*onnx.Tensor, error) {
	return func(infos []ort.IOInfo) (map[string]*onnx.Tensor, error) {
		o.feed.batch = max(o.batch, 1)
		spec, err := o.feed.spec()
		if err != nil {
			return nil, err
		}
		spec.Samples, spec.Batch = o.batch, o.batch
		spec.Inputs = ort.ValueInfos(infos)
		feeds, _, err := check.Feeds(ctx, spec)
		if err != nil {
			return nil, err
		}
		return feeds[0].Tensors, nil
	}
}
