package convert

import (
	"errors"
	"fmt"
	"github.com/kiln-ml/kiln/onnx/normalize"
	"log/slog"
	"time"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt"
)

// Config is one conversion. It is plain data: the zero value of each
// optional field is a meaningful default, and Validate checks the rest.
type Config struct {
	// Source is the fp32 ONNX model.
	Source string
	// Imported, when kiln imported Source from another format (a
	// SavedModel), is recorded with the source in kiln.json.
	Imported *manifest.Import
	// Repo is the Triton model repository to write.
	Repo string
	// Name is the base model name (default: the source file's stem, sanitized).
	Name string
	// Variants are the variants asked for; Run checks them against the
	// model (CheckPlan) before it builds any.
	Variants []manifest.Variant
	// FP16 configures the rewrite behind every fp16 variant.
	FP16 fp16.Options
	// Int8 is what the int8 variants are made from.
	Int8 Int8Config
	// TRT are the engine build settings shared by every plan variant.
	TRT TRTConfig
	// Template is the template for every variant's config.pbtxt; Name,
	// Platform, MaxBatchSize and InstanceCount are set per variant, and
	// LabelsFile when Labels is given.
	Template pbtxt.GenerateOptions
	// Labels is the path of a label file to place next to each config (""
	// for none). Run reads it; its base name becomes label_filename.
	Labels string
	// ExternalOver is the weight size above which ONNX variants are written
	// with an external data file (0: 1 GiB; negative: never).
	ExternalOver int64
	// Force rebuilds variants even when the repository already holds them.
	Force bool
	// ToolVersion is kiln's version, part of the cache key.
	ToolVersion string
	// Check says how each ONNX variant is checked before it is recorded.
	Check CheckConfig
	// Normalize configures the source normalizer every variant starts from
	// (onnx/normalize): inputs fixed to values, a minimum opset. fp16
	// storage and compute are always raised to fp32 first, so that the fp32
	// variant computes in fp32 and the fp16 one in fp16.
	Normalize normalize.Options
}

// Int8Config says what the int8 variants are made from.
type Int8Config struct {
	// Calibration is what `kiln calibrate` wrote (calibrate.ReadOutput);
	// nil when there is none. Its Q/DQ model is the ONNX int8 variant and
	// the source of Q/DQ engines, its cache that of implicitly quantized
	// engines; its record goes into kiln.json for every int8 variant.
	Calibration *manifest.CalibrationOutput
	// Mode chooses the TensorRT int8 path: qdq or cache; Int8Auto (the
	// zero value) takes the Q/DQ model when there is one, else the cache.
	Mode trtexec.Int8Mode
	// RandomRanges builds perf-only int8 engines with trtexec's placeholder
	// ranges when there is no calibration; such variants are marked
	// perf-only everywhere.
	RandomRanges bool
}

// TRTConfig are the engine build settings shared by every plan variant.
type TRTConfig struct {
	// WorkspaceBytes caps the TensorRT builder's workspace (0: trtexec's
	// default). trtexec takes MiB; a size that is not whole MiB is
	// rounded up.
	WorkspaceBytes int64
	// OptimizationLevel is the builder optimization level, 0-5 (nil:
	// trtexec's default).
	OptimizationLevel *int
	// HardwareCompat is the hardware compatibility level ("": none asked).
	HardwareCompat trtexec.HardwareCompat
	// VersionCompatible builds engines newer TensorRT releases can run.
	VersionCompatible bool
	// TimingCacheDir is where the model's timing cache lives, shared by all
	// its variants and runs ("": no timing cache). Run names the file after
	// the source's digest.
	TimingCacheDir string
	// Target, when set, refuses a build machine whose GPU or TensorRT
	// release is not the target's.
	Target *trtexec.Target
	// Timeout bounds one engine build (0: none).
	Timeout time.Duration
}

// Validate refuses a config Run cannot carry out whatever the model is:
// missing paths, unknown enumerated values, negative sizes.
func (c Config) Validate() error {
	var errs []error
	if c.Source == "" {
		errs = append(errs, errors.New("no source model given"))
	}
	if c.Repo == "" {
		errs = append(errs, errors.New("no model repository given"))
	}
	if c.Name != "" {
		if err := manifest.ValidateName(c.Name); err != nil {
			errs = append(errs, fmt.Errorf("model name: %w", err))
		}
	}
	errs = append(errs, c.FP16.Validate(), c.Int8.Validate(), c.TRT.Validate())
	return errors.Join(errs...)
}

// Validate refuses an unknown int8 mode.
func (c Int8Config) Validate() error {
	switch c.Mode {
	case trtexec.Int8Auto, trtexec.Int8QDQ, trtexec.Int8Cache:
		return nil
	}
	return fmt.Errorf("unknown int8 mode %q (want qdq or cache)", c.Mode)
}

// Validate refuses negative sizes and durations and unknown levels.
func (c TRTConfig) Validate() error {
	var errs []error
	if c.WorkspaceBytes < 0 {
		errs = append(errs, fmt.Errorf("TensorRT workspace of %d bytes is negative", c.WorkspaceBytes))
	}
	if l := c.OptimizationLevel; l != nil && (*l < 0 || *l > trtexec.MaxOptimizationLevel) {
		errs = append(errs, fmt.Errorf("builder optimization level %d out of range 0-%d", *l, trtexec.MaxOptimizationLevel))
	}
	if err := c.HardwareCompat.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Target != nil {
		if err := c.Target.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("engine build timeout %s is negative", c.Timeout))
	}
	return errors.Join(errs...)
}

// workspaceMiB is WorkspaceBytes as trtexec takes it, rounded up.
func (c TRTConfig) workspaceMiB() int {
	return int((c.WorkspaceBytes + 1<<20 - 1) >> 20)
}

// Option supplies one of Run's collaborators.
type Option func(*collaborators)

type collaborators struct {
	builder  Builder
	missing  string // why there is no builder
	gpu      *trtexec.GPU
	progress progress.Reporter
	log      *slog.Logger
}

// WithBuilder builds the TensorRT engines with b (a *trtexec.Tool in
// production).
func WithBuilder(b Builder) Option {
	return func(c *collaborators) { c.builder, c.missing = b, "" }
}

// WithoutBuilder says there is no engine builder here, and why ("trtexec
// not found"): plan variants are then recorded as needs-gpu. It is the
// default, with that reason.
func WithoutBuilder(reason string) Option {
	return func(c *collaborators) { c.builder, c.missing = nil, reason }
}

// WithGPU describes the build machine's GPU, for the provenance of the
// engines and the check of TRTConfig.Target before a build.
func WithGPU(g *trtexec.GPU) Option {
	return func(c *collaborators) { c.gpu = g }
}

// WithProgress reports progress, one step per variant, to r.
func WithProgress(r progress.Reporter) Option {
	return func(c *collaborators) { c.progress = r }
}

// WithLogger sends Run's log records to l (default: discarded).
func WithLogger(l *slog.Logger) Option {
	return func(c *collaborators) { c.log = l }
}
