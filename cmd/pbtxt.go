package cmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

func newPbtxtCmd(g *globalOptions) *cobra.Command {
	c := &cobra.Command{
		Use:   "pbtxt",
		Short: "Write, format and check Triton model configurations and repositories",
		Long: `pbtxt works with Triton's config.pbtxt: gen writes one from an ONNX model,
fmt rewrites configs in Triton's documentation style, and lint checks configs
and whole model repositories with Triton's own rules, model files included.`,
		Example: `  kiln pbtxt gen model.onnx --max-batch 16 --repo models
  kiln pbtxt fmt --check models/*/config.pbtxt
  kiln pbtxt lint models`,
	}
	c.AddCommand(newPbtxtGenCmd(g), newPbtxtFmtCmd(), newPbtxtLintCmd())
	return c
}

type pbtxtGenOptions struct {
	gen           pbtxt.GenerateOptions
	versionPolicy string
	labels        string
	params        map[string]string
	repo          string
	file          string
	version       int64
	out           string
}

func (o *pbtxtGenOptions) addFlags(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&o.gen.Name, "name", "", "model name (default: the model file name without its extension)")
	f.StringVar(&o.gen.Platform, "platform", pbtxt.PlatformONNX, "platform: onnxruntime_onnx, or tensorrt_plan for a plan built from this ONNX model")
	f.IntVar(&o.gen.MaxBatchSize, "max-batch", 0, "max_batch_size: 0 picks Triton's default (4) when the model can batch, -1 turns batching off")
	f.Int32SliceVar(&o.gen.PreferredBatchSizes, "preferred-batch", nil, "dynamic batching preferred batch sizes, e.g. 4,8")
	f.Uint64Var(&o.gen.MaxQueueDelayMicros, "max-queue-delay-us", 0, "dynamic batching max_queue_delay_microseconds")
	f.BoolVar(&o.gen.NoDynamicBatching, "no-dynamic-batching", false, "do not enable dynamic batching for a batching model")
	f.IntVar(&o.gen.InstanceCount, "instances", 0, "instances per device (0: Triton's default)")
	f.StringVar(&o.gen.InstanceKind, "kind", "", "instance kind: auto, gpu, cpu or model (default: Triton decides)")
	f.Int32SliceVar(&o.gen.InstanceGPUs, "gpus", nil, "GPU ids for the instances (default: all GPUs)")
	f.StringVar(&o.labels, "labels", "", "label file for a classification output; its base name becomes label_filename and --repo copies it")
	f.StringVar(&o.gen.LabelOutput, "labels-output", "", "output the labels belong to (default: the only output)")
	f.StringVar(&o.versionPolicy, "version-policy", "", `version policy: "latest:N", "all" or "specific:1,3" (default: Triton's latest:1)`)
	f.StringVar(&o.gen.Warmup, "warmup", "", "add a warmup sample with zero or random data")
	f.Uint32Var(&o.gen.WarmupBatchSize, "warmup-batch", 1, "batch size of the warmup sample")
	f.BoolVar(&o.gen.TensorRTAccelerator, "trt-accelerator", false, "run the ONNX model through ONNX Runtime's TensorRT execution provider on GPU")
	f.StringVar(&o.gen.TensorRTPrecision, "trt-precision", "", "precision_mode for --trt-accelerator: FP32, FP16 or INT8")
	f.Int64Var(&o.gen.TensorRTWorkspaceBytes, "trt-workspace-bytes", 0, "max_workspace_size_bytes for --trt-accelerator (0: backend default)")
	f.BoolVar(&o.gen.ResponseCache, "response-cache", false, "enable Triton's response cache for the model")
	f.StringToStringVar(&o.params, "param", nil, "model parameter key=value (repeatable), e.g. --param intra_op_thread_count=4")
	f.BoolVar(&o.gen.Complete, "complete", false, "write every default Triton fills in (instance groups, version policy, file name, pinned memory)")
	f.Int32SliceVar(&o.gen.GPUs, "server-gpus", nil, "GPU ids of the serving machine, used by --complete to resolve instance groups")
	f.StringVar(&o.repo, "repo", "", "write <repo>/<name>/config.pbtxt, <repo>/<name>/<version>/<file> and the labels, atomically")
	f.Int64Var(&o.version, "version", 1, "version directory to write with --repo")
	f.StringVar(&o.file, "model-file", "", "file to put in the version directory with --repo (default: MODEL; for tensorrt_plan, the engine built from MODEL)")
	f.StringVarP(&o.out, "out", "o", "", "write the config to this file instead of stdout")
}

// resolve fills the derived options and checks the combination.
func (o *pbtxtGenOptions) resolve(model string) error {
	if o.gen.Name == "" {
		o.gen.Name = strings.TrimSuffix(filepath.Base(model), filepath.Ext(model))
	}
	if o.labels != "" {
		o.gen.LabelsFile = filepath.Base(o.labels)
	}
	o.gen.Parameters = o.params
	if o.repo != "" && o.out != "" {
		return usageErr(errors.New("use either --repo or --out, not both"))
	}
	if o.gen.Platform == pbtxt.PlatformTensorRT && o.repo != "" && o.file == "" {
		return usageErr(errors.New("--platform tensorrt_plan with --repo needs --model-file ENGINE.plan; MODEL is the ONNX the engine was built from"))
	}
	if o.file != "" && o.repo == "" {
		return usageErr(errors.New("--model-file only applies with --repo"))
	}
	if o.file == "" {
		o.file = model
	}
	if o.version < 1 {
		return usageErr(fmt.Errorf("--version must be a positive integer, not %d", o.version))
	}
	if err := parseVersionPolicy(o.versionPolicy, &o.gen); err != nil {
		return usageErr(err)
	}
	if err := o.gen.Validate(); err != nil {
		return usageErr(err)
	}
	return nil
}

func parseVersionPolicy(s string, g *pbtxt.GenerateOptions) error {
	kind, arg, _ := strings.Cut(s, ":")
	switch kind {
	case "":
	case "all":
		g.AllVersions = true
	case "latest":
		n, err := strconv.ParseUint(arg, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("--version-policy latest:N needs a positive N, not %q", arg)
		}
		g.LatestVersions = uint32(n)
	case "specific":
		for _, p := range strings.Split(arg, ",") {
			v, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
			if err != nil || v < 0 {
				return fmt.Errorf("--version-policy specific:V,... needs version numbers, not %q", p)
			}
			g.SpecificVersions = append(g.SpecificVersions, v)
		}
	default:
		return fmt.Errorf(`--version-policy must be "latest:N", "all" or "specific:1,3", not %q`, s)
	}
	return nil
}

func newPbtxtGenCmd(g *globalOptions) *cobra.Command {
	o := &pbtxtGenOptions{}
	c := &cobra.Command{
		Use:   "gen MODEL",
		Short: "Generate a Triton config.pbtxt from an ONNX model",
		Long: `gen reads the inputs and outputs of an ONNX model and writes the config Triton
would auto-complete for it (batching when every input and output has a dynamic
first dimension, default max batch 4), plus the deployment choices given by
flags. The config is validated, also against the model, before it is written.`,
		Example: `  kiln pbtxt gen resnet50.onnx
  kiln pbtxt gen resnet50.onnx --name resnet50_onnx_fp16 --max-batch 16 --preferred-batch 8,16 \
      --max-queue-delay-us 100 --instances 2 --kind gpu --labels imagenet.txt --repo models
  kiln pbtxt gen bert.onnx --trt-accelerator --trt-precision FP16 --warmup random -o config.pbtxt`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.resolve(args[0]); err != nil {
				return err
			}
			sig, err := pbtxt.LoadSignature(args[0])
			if err != nil {
				return err
			}
			cfg, err := pbtxt.Generate(sig, o.gen)
			if err != nil {
				return err
			}
			switch {
			case o.repo != "":
				spec := pbtxt.WriteSpec{Config: cfg, Version: o.version, ModelPath: o.file}
				if o.labels != "" {
					data, err := os.ReadFile(o.labels)
					if err != nil {
						return fmt.Errorf("reading labels: %w", err)
					}
					spec.Labels = map[string][]byte{o.gen.LabelsFile: data}
				}
				if err := pbtxt.WriteModel(o.repo, spec); err != nil {
					return err
				}
				g.logger(c.ErrOrStderr()).Info("wrote model", "path", filepath.Join(o.repo, cfg.GetName()), "version", o.version)
				fmt.Fprintln(c.OutOrStdout(), filepath.Join(o.repo, cfg.GetName(), pbtxt.ConfigFile))
			case o.out != "":
				if err := atomicfile.WriteFile(o.out, pbtxt.Print(cfg), 0o644); err != nil {
					return fmt.Errorf("writing config: %w", err)
				}
			default:
				_, err := c.OutOrStdout().Write(pbtxt.Print(cfg))
				return err
			}
			return nil
		},
	}
	o.addFlags(c)
	return c
}

func newPbtxtFmtCmd() *cobra.Command {
	var check bool
	c := &cobra.Command{
		Use:   "fmt FILE...",
		Short: "Rewrite config.pbtxt files in Triton's documentation style",
		Long: `fmt parses each config and rewrites it in one deterministic style: two-space
indent, fields in schema order, lists as input [ { ... } ], enums bare and
strings quoted. Comments are not kept. "-" reads stdin and writes stdout.
With --check nothing is written: files that would change are listed and the
command exits 3.`,
		Example: `  kiln pbtxt fmt models/*/config.pbtxt
  kiln pbtxt fmt --check models/*/config.pbtxt
  cat config.pbtxt | kiln pbtxt fmt -`,
		Args: argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			var changed []string
			for _, path := range args {
				var data []byte
				var err error
				if path == "-" {
					data, err = io.ReadAll(c.InOrStdin())
				} else {
					data, err = os.ReadFile(path)
				}
				if err != nil {
					return fmt.Errorf("reading config: %w", err)
				}
				out, err := pbtxt.Format(data)
				if err != nil {
					return withFile(err, path)
				}
				switch {
				case path == "-":
					if _, err := c.OutOrStdout().Write(out); err != nil {
						return err
					}
				case bytes.Equal(out, data):
				case check:
					changed = append(changed, path)
					fmt.Fprintln(c.OutOrStdout(), path)
				default:
					st, err := os.Stat(path)
					if err != nil {
						return err
					}
					if err := atomicfile.WriteFile(path, out, st.Mode().Perm()); err != nil {
						return fmt.Errorf("rewriting %s: %w", path, err)
					}
					fmt.Fprintln(c.OutOrStdout(), path)
				}
			}
			if len(changed) > 0 {
				return &ExitError{Code: ExitCheck, Err: fmt.Errorf("%d file(s) are not formatted; run kiln pbtxt fmt on them", len(changed))}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&check, "check", false, "write nothing; list files that would change and exit 3 if any")
	return c
}

// withFile names the file in a syntax error.
func withFile(err error, path string) error {
	var se *pbtxt.SyntaxError
	if errors.As(err, &se) && se.File == "" {
		se.File = path
		if path == "-" {
			se.File = "<stdin>"
		}
	}
	return err
}

type pbtxtLintOptions struct {
	output     string
	strict     bool
	gpus       int
	defaultMBS int
}

func newPbtxtLintCmd() *cobra.Command {
	o := &pbtxtLintOptions{}
	c := &cobra.Command{
		Use:   "lint FILE|MODEL_DIR|REPO...",
		Short: "Check configs and model repositories with Triton's rules",
		Long: `lint checks a config file on its own, or a model directory or whole repository
with its model files: names, platform and backend, dims and reshapes, batching
and queue policies, instance groups, version policy and version directories,
warmup, ensembles against the models they use, and every input and output
against the ONNX model itself. Each problem names the field path and what
would be right. Exit status 3 when an error is found.`,
		Example: `  kiln pbtxt lint models
  kiln pbtxt lint models/resnet50_onnx_fp32/config.pbtxt
  kiln pbtxt lint --output json --gpus 1 models | jq '.problems[] | select(.severity == "error")'`,
		Args: argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if o.output != "text" && o.output != "json" {
				return usageErr(fmt.Errorf("--output must be text or json, not %q", o.output))
			}
			if o.gpus < 0 || o.defaultMBS < 0 {
				return usageErr(errors.New("--gpus and --default-max-batch must not be negative"))
			}
			var all pbtxt.Problems
			for _, path := range args {
				opts := pbtxt.LintOptions{GPUs: o.gpus, DefaultMaxBatchSize: o.defaultMBS}
				plans, err := planSignatures(path)
				if err != nil {
					return err
				}
				opts.Plans = plans
				ps, err := pbtxt.LintPath(path, opts)
				if err != nil {
					return err
				}
				all = append(all, ps...)
			}
			all.Sort()
			errs := len(all.Errors())
			warns := len(all) - errs
			if o.output == "json" {
				if all == nil {
					all = pbtxt.Problems{}
				}
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				if err := enc.Encode(struct {
					Problems pbtxt.Problems `json:"problems"`
					Errors   int            `json:"errors"`
					Warnings int            `json:"warnings"`
				}{all, errs, warns}); err != nil {
					return err
				}
			} else {
				for _, p := range all {
					fmt.Fprintln(c.OutOrStdout(), p.String())
				}
				fmt.Fprintf(c.OutOrStdout(), "%d error(s), %d warning(s)\n", errs, warns)
			}
			if errs > 0 || (o.strict && warns > 0) {
				return &ExitError{Code: ExitCheck}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.output, "output", "text", "output format: text or json")
	f.BoolVar(&o.strict, "strict", false, "exit 3 on warnings too")
	f.IntVar(&o.gpus, "gpus", 0, "number of GPUs on the serving machine, to check gpu ids (0: unknown)")
	f.IntVar(&o.defaultMBS, "default-max-batch", 0, "Triton's default-max-batch-size for auto-complete (0: Triton's default, 4)")
	return c
}

// planSignatures reads the plan signatures kiln recorded in the kiln.json of
// a repository (or of the repository a model directory is in), so that lint
// can check TensorRT configs against engines it cannot open itself.
func planSignatures(path string) (map[string]pbtxt.Signature, error) {
	for _, dir := range []string{path, filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
		mf := filepath.Join(dir, manifest.FileName)
		if st, err := os.Stat(mf); err != nil || !st.Mode().IsRegular() {
			continue
		}
		m, err := manifest.Read(mf)
		if err != nil {
			return nil, err
		}
		out := map[string]pbtxt.Signature{}
		for _, rec := range m.Models {
			if rec.Variant.Runtime != manifest.RuntimeTRT || len(rec.Inputs) == 0 {
				continue
			}
			out[rec.Name] = pbtxt.Signature{Inputs: sigTensors(rec.Inputs), Outputs: sigTensors(rec.Outputs)}
		}
		return out, nil
	}
	return nil, nil
}

func sigTensors(ts []manifest.Tensor) []pbtxt.TensorSig {
	out := make([]pbtxt.TensorSig, 0, len(ts))
	for _, t := range ts {
		out = append(out, pbtxt.TensorSig{Name: t.Name, DataType: configpb.DataType(configpb.DataType_value[t.Type]), Shape: t.Shape})
	}
	return out
}
