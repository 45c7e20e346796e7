package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/serve/report"
)

// Config says what to check and how. Either Repository or Model is set.
type Config struct {
	// Repository is a model repository directory; Models narrows it to
	// some of its models (nil: every model Triton would load).
	Repository string
	Models     []string
	// Model is one model file to compare with Reference, an fp32 ONNX
	// model (what Polygraphy's run --onnxrt does for two files). Precision
	// is the model's precision, which picks the default thresholds.
	Model, Reference string
	Precision        manifest.Precision
	// Feed says which inputs to use (its Inputs are filled in from the
	// reference's signature).
	Feed check.FeedSpec
	// Thresholds override the defaults per model and output.
	Thresholds []check.Override
	Perf       PerfConfig
	// Device names where the artifacts run, for the report ("cpu").
	Device string
	// Tool is kiln's name and version, for the report.
	Tool string
}

// Validate checks the config on its own.
func (c Config) Validate() error {
	switch {
	case c.Repository == "" && c.Model == "":
		return errors.New("nothing to check: give a repository or a model file")
	case c.Repository != "" && c.Model != "":
		return errors.New("give a repository or a model file, not both")
	case c.Model != "" && c.Reference == "":
		return fmt.Errorf("checking %s alone needs a reference model to compare with (--reference)", c.Model)
	}
	if c.Precision != "" {
		if _, err := manifest.ParsePrecision(string(c.Precision)); err != nil {
			return err
		}
	}
	return c.Perf.Validate()
}

// Option injects a collaborator into Run.
type Option func(*runner)

// WithRuntime runs artifacts of a Triton platform with rt (by default
// onnxruntime_onnx runs on ONNX Runtime's CPU provider, and tensorrt_plan
// is not checked).
func WithRuntime(platform string, rt Runtime) Option {
	return func(r *runner) { r.runtimes[platform] = rt }
}

// WithReferenceOptions opens the fp32 reference with these ONNX Runtime
// options (default: the CPU provider, whatever device the artifacts use:
// the reference is what the GPU results are judged by).
func WithReferenceOptions(o ort.SessionOptions) Option { return func(r *runner) { r.refOptions = o } }

// WithLogger logs what Run does.
func WithLogger(l *slog.Logger) Option { return func(r *runner) { r.log = l } }

// runner holds one Run's collaborators.
type runner struct {
	cfg        Config
	runtimes   map[string]Runtime
	refOptions ort.SessionOptions
	log        *slog.Logger
}

// Run checks every artifact and returns the report, its verdict summarized.
// Artifacts that fail are in the report, not in the error: the error says
// that serve itself could not do its job (unreadable repository, no
// reference, inputs that cannot be built).
func Run(ctx context.Context, cfg Config, opts ...Option) (*report.Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, runtimes: map[string]Runtime{pbtxt.PlatformONNX: ORT{}}, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(r)
	}
	rep := &report.Report{Tool: cfg.Tool, Created: time.Now().UTC(), Device: cfg.Device}
	var err error
	if cfg.Model != "" {
		rep.Subject = cfg.Model
		err = r.checkFile(ctx, rep)
	} else {
		rep.Subject = cfg.Repository
		err = r.checkRepository(ctx, rep)
	}
	if err != nil {
		return nil, err
	}
	rep.Summarize()
	return rep, nil
}

// checkFile compares one model file with the reference file.
func (r *runner) checkFile(ctx context.Context, rep *report.Report) error {
	prec := r.cfg.Precision
	if prec == "" {
		prec = manifest.FP32
	}
	a := Artifact{Name: filepath.Base(r.cfg.Model), Platform: pbtxt.PlatformONNX, Path: r.cfg.Model,
		Variant: manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: prec}}
	st, err := os.Stat(a.Path)
	if err != nil {
		return err
	}
	a.Size = st.Size()
	ref := Artifact{Name: filepath.Base(r.cfg.Reference), Platform: pbtxt.PlatformONNX, Path: r.cfg.Reference,
		Variant: manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: manifest.FP32}}
	return r.checkGroup(ctx, rep, group{ref: ref, hasRef: true, members: []Artifact{a}}, nil)
}

// checkRepository checks every artifact of the repository against the
// fp32 ONNX model of its source.
func (r *runner) checkRepository(ctx context.Context, rep *report.Report) error {
	repo, err := readRepository(r.cfg.Repository, r.cfg.Models)
	if err != nil {
		return err
	}
	refs := map[manifest.Digest]string{}
	for _, g := range groupArtifacts(repo) {
		if err := r.checkGroup(ctx, rep, g, repo.problems); err != nil {
			return err
		}
		if g.hasRef {
			refs[g.ref.Source] = g.ref.Name
		}
	}
	for _, rec := range repo.unbuilt {
		m := report.Model{Name: rec.Name, Reference: refs[rec.Source], Variant: rec.Variant.ID(), Runtime: string(rec.Variant.Runtime), Precision: string(rec.Variant.Precision),
			Verdict: report.NotChecked, Reason: fmt.Sprintf("not built: kiln.json records it as %s", rec.Status)}
		if rec.Status == manifest.StatusNeedsGPU {
			m.Reason = "not built here: " + rec.Note
		}
		rep.Models = append(rep.Models, m)
	}
	return recordChecks(r.cfg.Repository, repo.manifest, rep)
}
