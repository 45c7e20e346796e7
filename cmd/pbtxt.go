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
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/atomicfile"
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
	groupCommand(c)
	c.AddCommand(newPbtxtGenCmd(g), newPbtxtFmtCmd(), newPbtxtLintCmd())
	return c
}

type pbtxtGenOptions struct {
	gen             pbtxt.GenerateOptions
	dynamicBatching bool
	queueDelay      time.Duration
	policy          versionPolicy
	labels          string
	params          map[string]string
	repo            string
	file            string
	version         int64
	out             string
}

func (o *pbtxtGenOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.gen.Name, "name", "", "model name (default: the model file name without its extension)")
	choice(f, &o.gen.Platform, "platform", pbtxt.PlatformONNX, "platform: onnxruntime_onnx, or tensorrt_plan for a plan built from this ONNX model",
		pbtxt.PlatformONNX, pbtxt.PlatformTensorRT)
	f.IntVar(&o.gen.MaxBatchSize, "max-batch", 0, "max_batch_size: 0 picks Triton's default (4) when the model can batch, -1 turns batching off")
	listFlag(f, &o.gen.PreferredBatchSizes, "preferred-batch", "ints", "dynamic batching preferred batch sizes, e.g. 4,8", positiveInt32, int32Text)
	durationFlag(f, &o.queueDelay, "max-queue-delay", time.Microsecond, "dynamic batching max_queue_delay_microseconds, as a duration (100us, 2ms)")
	f.BoolVar(&o.dynamicBatching, "dynamic-batching", true, "enable dynamic batching for a batching model (--dynamic-batching=false leaves it out)")
	f.IntVar(&o.gen.InstanceCount, "instances", 0, "instances per device (0: Triton's default)")
	kindFlag(f, &o.gen.InstanceKind)
	gpuIDsFlag(f, &o.gen.InstanceGPUs, "gpus", "GPU ids for the instances, e.g. 0,1 (default: all GPUs)")
	f.StringVar(&o.labels, "labels", "", "label `FILE` for a classification output; its base name becomes label_filename and --repo copies it")
	f.StringVar(&o.gen.LabelOutput, "labels-output", "", "output the labels belong to (default: the only output)")
	f.Var(&parsedValue[versionPolicy]{p: &o.policy, typ: "policy", parse: parseVersionPolicy, text: func(v versionPolicy) string { return v.text }},
		"version-policy", `version policy: "latest:N", "all" or "specific:1,3" (default: Triton's latest:1)`)
	choice(f, &o.gen.Warmup, "warmup", "", "add a warmup sample with zero or random data", "zero", "random")
	f.Uint32Var(&o.gen.WarmupBatchSize, "warmup-batch", 1, "batch size of the warmup sample")
	f.BoolVar(&o.gen.TensorRTAccelerator, "trt-accelerator", false, "run the ONNX model through ONNX Runtime's TensorRT execution provider on GPU")
	choice(f, &o.gen.TensorRTPrecision, "trt-precision", "", "precision_mode for --trt-accelerator", "FP32", "FP16", "INT8")
	sizeFlag(f, &o.gen.TensorRTWorkspaceBytes, "trt-workspace", 0, "max_workspace_size_bytes for --trt-accelerator, e.g. 4GiB (0: the backend's default)")
	f.BoolVar(&o.gen.ResponseCache, "response-cache", false, "enable Triton's response cache for the model")
	f.StringToStringVar(&o.params, "param", nil, "model parameter `key=value` (repeatable), e.g. --param intra_op_thread_count=4")
	f.BoolVar(&o.gen.Complete, "complete", false, "write every default Triton fills in (instance groups, version policy, file name, pinned memory)")
	gpuIDsFlag(f, &o.gen.GPUs, "server-gpus", "GPU ids of the serving machine, e.g. 0,1, used by --complete to resolve instance groups")
	f.StringVar(&o.repo, "repo", "", "repository `DIR`: write <repo>/<name>/config.pbtxt, <repo>/<name>/<version>/<file> and the labels, atomically")
	f.Int64Var(&o.version, "model-version", 1, "version directory to write with --repo")
	f.StringVar(&o.file, "model-file", "", "`FILE` to put in the version directory with --repo (default: MODEL; for tensorrt_plan, the engine built from MODEL)")
	f.StringVarP(&o.out, "output", "o", "", "write the config to `FILE` instead of stdout")
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
	o.gen.NoDynamicBatching = !o.dynamicBatching
	o.gen.MaxQueueDelayMicros = uint64(o.queueDelay / time.Microsecond)
	o.gen.LatestVersions, o.gen.AllVersions, o.gen.SpecificVersions = o.policy.latest, o.policy.all, o.policy.specific
	if o.repo != "" && o.out != "" {
		return usageErr(errors.New("use either --repo or --output, not both"))
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
		return usageErr(fmt.Errorf("--model-version must be a positive integer, not %d", o.version))
	}
	if err := o.gen.Validate(); err != nil {
		return usageErr(err)
	}
	return nil
}

// versionPolicy is a parsed --version-policy.
type versionPolicy struct {
	text     string
	latest   uint32
	all      bool
	specific []int64
}

func parseVersionPolicy(s string) (versionPolicy, error) {
	p := versionPolicy{text: s}
	kind, arg, _ := strings.Cut(s, ":")
	switch kind {
	case "all":
		p.all = true
	case "latest":
		n, err := strconv.ParseUint(arg, 10, 32)
		if err != nil || n == 0 {
			return p, fmt.Errorf("latest:N needs a positive N, not %q", arg)
		}
		p.latest = uint32(n)
	case "specific":
		for _, part := range strings.Split(arg, ",") {
			v, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
			if err != nil || v < 0 {
				return p, fmt.Errorf("specific:V,... needs version numbers, not %q", part)
			}
			p.specific = append(p.specific, v)
		}
	default:
		return p, fmt.Errorf(`want "latest:N", "all" or "specific:1,3"`)
	}
	return p, nil
}

// kindFlag is --kind, the instance kind in generated configs.
func kindFlag(f *pflag.FlagSet, p *string) {
	choice(f, p, "kind", "", "instance kind: auto, gpu, cpu or model (default: Triton decides)", "auto", "gpu", "cpu", "model")
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
      --max-queue-delay 100us --instances 2 --kind gpu --labels imagenet.txt --repo models
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
			return o.write(c, g, cfg)
		},
	}
	o.addFlags(c.Flags())
	return c
}

// write puts the config where the flags say: into a repository with the
// model and labels, into a file, or on stdout.
func (o *pbtxtGenOptions) write(c *cobra.Command, g *globalOptions, cfg *configpb.ModelConfig) error {
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
		_, err := fmt.Fprintln(c.OutOrStdout(), filepath.Join(o.repo, cfg.GetName(), pbtxt.ConfigFile))
		return err
	case o.out != "":
		if err := atomicfile.WriteFile(o.out, pbtxt.Print(cfg), 0o644); err != nil {
			return fmt.Errorf("writing config: %w", err)
		}
		return nil
	}
	_, err := c.OutOrStdout().Write(pbtxt.Print(cfg))
	return err
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
	format     string
	progress   string
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
against the ONNX model itself (TensorRT plans against the signature kiln
recorded in kiln.json). Each problem names the field path and what would be
right. Exit status 3 when an error is found.`,
		Example: `  kiln pbtxt lint models
  kiln pbtxt lint models/resnet50_onnx_fp32/config.pbtxt
  kiln pbtxt lint --format json --gpu-count 1 models | jq '.problems[] | select(.severity == "error")'`,
		Args: argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if o.gpus < 0 || o.defaultMBS < 0 {
				return usageErr(errors.New("--gpu-count and --default-max-batch must not be negative"))
			}
			report, done := newProgress(c.ErrOrStderr(), o.progress)
			all, err := lintPaths(args, pbtxt.LintOptions{GPUs: o.gpus, DefaultMaxBatchSize: o.defaultMBS, Progress: report})
			done()
			if err != nil {
				return err
			}
			errs := len(all.Errors())
			if err := printLint(c.OutOrStdout(), o.format, all); err != nil {
				return err
			}
			if errs > 0 || (o.strict && len(all) > errs) {
				return &ExitError{Code: ExitCheck}
			}
			return nil
		},
	}
	f := c.Flags()
	formatFlag(f, &o.format)
	f.BoolVar(&o.strict, "strict", false, "exit 3 on warnings too")
	f.IntVar(&o.gpus, "gpu-count", 0, "number of GPUs on the serving machine, to check gpu ids (0: unknown)")
	f.IntVar(&o.defaultMBS, "default-max-batch", 0, "Triton's default-max-batch-size for auto-complete (0: Triton's default, 4)")
	progressFlag(f, &o.progress)
	return c
}

// lintPaths lints every path and returns the problems sorted.
func lintPaths(paths []string, opts pbtxt.LintOptions) (pbtxt.Problems, error) {
	var all pbtxt.Problems
	for _, path := range paths {
		ps, err := pbtxt.LintPath(path, opts)
		if err != nil {
			return nil, err
		}
		all = append(all, ps...)
	}
	all.Sort()
	return all, nil
}

func printLint(w io.Writer, format string, all pbtxt.Problems) error {
	errs := len(all.Errors())
	warns := len(all) - errs
	if format == formatJSON {
		if all == nil {
			all = pbtxt.Problems{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(struct {
			Problems pbtxt.Problems `json:"problems"`
			Errors   int            `json:"errors"`
			Warnings int            `json:"warnings"`
		}{all, errs, warns})
	}
	for _, p := range all {
		fmt.Fprintln(w, p.String())
	}
	_, err := fmt.Fprintf(w, "%d error(s), %d warning(s)\n", errs, warns)
	return err
}
