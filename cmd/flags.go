package cmd

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

// kiln's flag vocabulary: one flag per concept, the same in every command
// (README.md, "Flags every command shares"). Enumerated values, versions,
// sizes and lists are pflag.Values checked when the command line is parsed,
// so a wrong value is a usage error (exit 2) that names the flag and lists
// what it accepts, before any work is done.

// Result formats on stdout (--format).
const (
	formatText = "text"
	formatJSON = "json"
)

// Progress modes on stderr (--progress).
const (
	progressAuto  = "auto"  // bars on a terminal, plain lines otherwise
	progressBar   = "bar"   // progressbar bars
	progressPlain = "plain" // one line per state change and every 10%
	progressJSON  = "json"  // one JSON object per event
	progressNone  = "none"
)

// choiceValue is a string flag that takes one of a fixed set of words.
type choiceValue struct {
	p       *string
	choices []string
}

// choice defines a flag that accepts only the given words; the first one
// not given is def.
func choice(f *pflag.FlagSet, p *string, name, def, usage string, choices ...string) {
	*p = def
	f.Var(&choiceValue{p: p, choices: choices}, name, usage)
}

func (c *choiceValue) String() string { return *c.p }
func (c *choiceValue) Type() string   { return strings.Join(c.choices, "|") }
func (c *choiceValue) Set(s string) error {
	if !slices.Contains(c.choices, s) {
		return fmt.Errorf("want one of %s", strings.Join(c.choices, ", "))
	}
	*c.p = s
	return nil
}

// formatFlag is --format: how a command prints its result on stdout.
func formatFlag(f *pflag.FlagSet, p *string) {
	choice(f, p, "format", formatText, "result format on stdout", formatText, formatJSON)
}

// progressFlag is --progress: how a long-running command reports progress on stderr.
func progressFlag(f *pflag.FlagSet, p *string) {
	choice(f, p, "progress", progressAuto, "progress on stderr: auto (bars on a terminal, lines otherwise), bar, plain, json (one object per event) or none",
		progressAuto, progressBar, progressPlain, progressJSON, progressNone)
}

// parsedValue is a flag whose text is parsed into T when it is set.
// Its text is "" or "0" for a value help should not show as a default.
type parsedValue[T any] struct {
	p     *T
	typ   string
	parse func(string) (T, error)
	text  func(T) string
}

func (v *parsedValue[T]) String() string { return v.text(*v.p) }
func (v *parsedValue[T]) Type() string   { return v.typ }
func (v *parsedValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

// trtVersionFlag is --trt-version: a TensorRT release as 10.3, 10.3.0 or
// trtexec's banner number (100300), parsed by manifest.ParseTRTSpec. An
// unset flag leaves *p as it is.
func trtVersionFlag(f *pflag.FlagSet, p *manifest.TRTSpec, usage string) {
	f.Var(&parsedValue[manifest.TRTSpec]{p: p, typ: "version", parse: manifest.ParseTRTSpec,
		text: func(s manifest.TRTSpec) string {
			if s.IsZero() {
				return ""
			}
			return s.String()
		}}, "trt-version", usage)
}

// computeCapabilityFlag is --compute-capability: a GPU architecture as 8.6 or sm86.
func computeCapabilityFlag(f *pflag.FlagSet, p *string, usage string) {
	f.Var(&parsedValue[string]{p: p, typ: "cc", parse: manifest.ParseComputeCapability,
		text: func(s string) string { return s }}, "compute-capability", usage)
}

// sizeUnits are the units a size flag takes: binary, as memory is sized.
var sizeUnits = []struct {
	name  string
	bytes int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// parseSize reads a size with a unit: "512MiB", "4GiB", "1.5GiB", "64KiB",
// "100B"; "0" needs none. Decimal units (MB, GB) are refused rather than
// guessed at, since tools disagree on what they mean.
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	for _, u := range sizeUnits {
		num, ok := strings.CutSuffix(s, u.name)
		if !ok {
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || x < 0 || math.IsInf(x, 0) || x*float64(u.bytes) > math.MaxInt64/2 {
			break
		}
		n := x * float64(u.bytes)
		if n != math.Trunc(n) {
			return 0, fmt.Errorf("%q is not a whole number of bytes", s)
		}
		return int64(n), nil
	}
	return 0, fmt.Errorf("want a size with a binary unit: B, KiB, MiB, GiB or TiB (e.g. 512MiB, 4GiB)")
}

// formatSize writes a size in the largest unit that keeps it whole.
func formatSize(n int64) string {
	if n == 0 {
		return "0"
	}
	for _, u := range sizeUnits {
		if n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// sizeFlag defines a size in bytes written with a unit.
func sizeFlag(f *pflag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	f.Var(&parsedValue[int64]{p: p, typ: "size", parse: parseSize, text: formatSize}, name, usage)
}

// listValue is a repeatable, comma-separated list flag whose items are
// parsed into T as they are given.
type listValue[T any] struct {
	p     *[]T
	typ   string
	parse func(string) (T, error)
	text  func(T) string
	set   bool
}

func (v *listValue[T]) String() string {
	parts := make([]string, len(*v.p))
	for i, x := range *v.p {
		parts[i] = v.text(x)
	}
	return strings.Join(parts, ",")
}
func (v *listValue[T]) Type() string { return v.typ }
func (v *listValue[T]) Set(s string) error {
	if !v.set {
		*v.p, v.set = nil, true // the first use replaces the default
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		x, err := v.parse(item)
		if err != nil {
			return err
		}
		*v.p = append(*v.p, x)
	}
	return nil
}

// listFlag defines a comma-separated, repeatable list flag.
func listFlag[T any](f *pflag.FlagSet, p *[]T, name, typ, usage string, parse func(string) (T, error), text func(T) string) {
	f.Var(&listValue[T]{p: p, typ: typ, parse: parse, text: text}, name, usage)
}

// gpuIDsFlag is --gpus (and --server-gpus): GPU ids, comma-separated.
// A count of GPUs is --gpu-count.
func gpuIDsFlag(f *pflag.FlagSet, p *[]int32, name, usage string) {
	listFlag(f, p, name, "ids", usage, func(s string) (int32, error) {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a GPU id (0, 1, ...)", s)
		}
		return int32(n), nil
	}, int32Text)
}

func positiveInt32(s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a whole number >= 1", s)
	}
	return int32(n), nil
}

func int32Text(n int32) string { return strconv.Itoa(int(n)) }

// intAtLeast parses a whole number of at least min.
func intAtLeast(min int) func(string) (int, error) {
	return func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < min {
			return 0, fmt.Errorf("%q is not a whole number >= %d", s, min)
		}
		return n, nil
	}
}

// durationFlag defines a duration flag that must be a whole multiple of
// unit and not negative (--max-queue-delay 100us).
func durationFlag(f *pflag.FlagSet, p *time.Duration, name string, unit time.Duration, usage string) {
	f.Var(&parsedValue[time.Duration]{p: p, typ: "duration", parse: func(s string) (time.Duration, error) {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || d%unit != 0 {
			return 0, fmt.Errorf("want a duration that is a whole number of %s, such as 100%s", unit, strings.TrimPrefix(unit.String(), "1"))
		}
		return d, nil
	}, text: func(d time.Duration) string {
		if d == 0 {
			return "0"
		}
		return d.String()
	}}, name, usage)
}

// feedFlags are the flags that say what a model is fed (serve, inspect
// --run, convert's checks): inputs by name, shapes of the rest, samples.
type feedFlags struct {
	named   []string
	shapes  []string
	samples int
	batch   int
	seed    uint64
}

// addFlags defines the flags; prefix starts the names of those another
// flag of the command could clash with ("check-" in convert).
func (o *feedFlags) addFlags(f *pflag.FlagSet, prefix string, defSamples string) {
	f.StringArrayVar(&o.named, "input", nil, "feed an input by name: NAME=FILE.npy, NAME=FILE.pb or NAME=NUMBER for a scalar (repeatable), e.g. --input sr=16000")
	f.StringArrayVar(&o.shapes, "shape", nil, "shape of an input filled with random data: NAME=DIMS, e.g. --shape x=1x3x640x640 (repeatable)")
	f.IntVar(&o.samples, prefix+"samples", 0, "samples to check with (0: "+defSamples+")")
	f.IntVar(&o.batch, "check-batch", 1, "samples per run of a batched model during the checks")
	f.Uint64Var(&o.seed, prefix+"seed", 1, "seed of the sample choice and of random data")
}

// spec builds the feed spec the flags describe.
func (o *feedFlags) spec() (check.FeedSpec, error) {
	named, err := check.ParseInputs(o.named)
	if err != nil {
		return check.FeedSpec{}, usageErr(err)
	}
	shapes, err := check.ParseShapes(o.shapes)
	if err != nil {
		return check.FeedSpec{}, usageErr(err)
	}
	if o.batch < 1 {
		return check.FeedSpec{}, usageErr(fmt.Errorf("--check-batch %d is not a whole number >= 1", o.batch))
	}
	return check.FeedSpec{Named: named, Shapes: shapes, Samples: o.samples, Batch: o.batch, Seed: o.seed}, nil
}

// thresholdFlag is --threshold, shared by serve and convert.
func thresholdFlag(f *pflag.FlagSet, p *[]check.Override) {
	listFlag(f, p, "threshold", "spec", "override a threshold: [MODEL[/OUTPUT]:]METRIC=VALUE, METRIC one of atol, rtol, cosine, worst_cosine, top1, top5, agreement, norm_deviation, allow_non_finite (repeatable)",
		check.ParseOverride, check.Override.String)
}

// fixFlag is --fix, shared by convert and calibrate.
func fixFlag(f *pflag.FlagSet, p *[]string) {
	f.StringArrayVar(p, "fix", nil, "fold an input into the model as a constant: NAME=NUMBER or NAME=FILE.npy (repeatable), e.g. --fix sr=16000; If branches it decides are resolved and the input disappears (Triton cannot serve scalars without batching)")
}

// fixedInputs reads --fix values as tensors of the model's input types.
func fixedInputs(model string, values []string) (map[string]*onnx.Tensor, error) {
	if len(values) == 0 {
		return nil, nil
	}
	named, err := check.ParseInputs(values)
	if err != nil {
		return nil, usageErr(errors.New("--fix: " + strings.TrimPrefix(err.Error(), "--input: ")))
	}
	m, err := onnx.LoadWith(model, onnx.LoadOptions{SkipExternalData: true})
	if err != nil {
		return nil, err
	}
	ts, err := check.NamedTensors(m.Inputs(), named)
	if err != nil {
		return nil, usageErr(fmt.Errorf("--fix: %w", err))
	}
	return ts, nil
}
