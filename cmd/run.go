package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/convert"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pack"
	"github.com/kiln-ml/kiln/serve"
	"github.com/kiln-ml/kiln/serve/report"
)

// The stages kiln run chains, in order.
var runStages = []string{"import", "calibrate", "convert", "serve", "pack"}

// runStateFile is where kiln run records, in the report directory, what
// serve checked and what pack published, so a rerun can skip them.
const runStateFile = "kiln-run.json"

type runOptions struct {
	file        string
	until, only string
	repo        string
	to          []string
	report      string
	skipUnavail bool
	format      string
	progress    string
}

func (o *runOptions) addFlags(f *pflag.FlagSet) {
	f.StringVarP(&o.file, "file", "f", "", "pipeline `FILE` to run (default $KILN_PIPELINE)")
	choice(f, &o.until, "until", "", "run the stages up to and including this one", runStages...)
	choice(f, &o.only, "only", "", "run only this stage, on what the earlier ones left", runStages...)
	f.StringVar(&o.repo, "repo", "", "model repository `DIR` (default $KILN_REPO, then repository: in the file)")
	f.StringArrayVar(&o.to, "to", nil, "`DEST` to publish to, replacing destinations: (default $KILN_TO, comma-separated); repeatable")
	f.StringVarP(&o.report, "output", "o", "", "`DIR` for serve's reports (default $KILN_REPORT, then report: in the file, then <repository>-report)")
	f.BoolVar(&o.skipUnavail, "skip-unavailable", false, "accept TensorRT variants this machine cannot build or run (no trtexec or GPU) instead of exiting 4")
	formatFlag(f, &o.format)
	progressFlag(f, &o.progress)
}

func newRunCmd(g *globalOptions) *cobra.Command {
	o := &runOptions{}
	c := &cobra.Command{
		Use:   "run -f pipeline.yaml",
		Short: "Take a model through import, calibrate, convert, serve and pack as a pipeline file says",
		Long: `run reads a pipeline file (schemaVersion: 1; kiln init MODEL writes a starter)
and runs its stages in one process: import (a SavedModel source) → calibrate
(int8) → convert → serve → pack. A stage whose inputs are unchanged does no
work: calibration and variants are reused from their caches, serve is skipped
when the repository's artifacts and the check settings are those it last
passed, and a destination is skipped when it already holds this repository.
It ends with one table: stage, status (ran, skipped, failed), time, result.

The file is checked before any work: an unknown field, a missing source or
an int8 variant without calibration data is an error naming its line.
Flags override the file, and KILN_* variables override it where no flag is
given: --repo ($KILN_REPO), --to ($KILN_TO), -o ($KILN_REPORT), -f
($KILN_PIPELINE). Exit codes are those of the stage that stopped the run.`,
		Example: `  kiln init model.onnx -o pipeline.yaml
  kiln run -f pipeline.yaml
  kiln run -f pipeline.yaml --until convert
  kiln run -f pipeline.yaml --only pack --to image:registry.local/resnet:1`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error {
			p, err := o.resolve(c.Flags())
			if err != nil {
				return err
			}
			r := &pipelineRun{o: o, p: p, g: g, c: c}
			err = r.run(c.Context())
			if perr := printRun(c.OutOrStdout(), o.format, r.rows); perr != nil && err == nil {
				err = perr
			}
			return err
		},
	}
	o.addFlags(c.Flags())
	return c
}

// resolve reads the pipeline file and applies the environment and the
// flags over it, once: flag > KILN_* > file > default.
func (o *runOptions) resolve(f *pflag.FlagSet) (*pipeline, error) {
	env := func(name string, flag string, p *string) {
		if v := os.Getenv(name); v != "" && !f.Changed(flag) {
			*p = v
		}
	}
	env("KILN_PIPELINE", "file", &o.file)
	if o.file == "" {
		return nil, usageErr(errors.New("-f pipeline.yaml is required (kiln init MODEL writes one)"))
	}
	if o.until != "" && o.only != "" {
		return nil, usageErr(errors.New("give --until or --only, not both"))
	}
	p, err := readPipeline(o.file)
	if err == nil {
		err = p.requireRun()
	}
	if err != nil {
		return nil, usageErr(err)
	}
	env("KILN_REPO", "repo", &p.Repository)
	env("KILN_REPORT", "output", &p.Report)
	if v := os.Getenv("KILN_TO"); v != "" && !f.Changed("to") {
		p.Destinations = strings.Split(v, ",")
	}
	if f.Changed("repo") {
		p.Repository = o.repo
	}
	if f.Changed("output") {
		p.Report = o.report
	}
	if f.Changed("to") {
		p.Destinations = o.to
	}
	for _, d := range p.Destinations {
		if _, err := pack.ParseDestination(d); err != nil {
			return nil, usageErr(fmt.Errorf("destination %s: %w", d, err))
		}
	}
	if p.Report == "" {
		p.Report = strings.TrimSuffix(p.Repository, string(filepath.Separator)) + "-report"
	}
	return p, nil
}

// runRow is one line of the summary table.
type runRow struct {
	Stage    string        `json:"stage"`
	Status   string        `json:"status"` // ran, skipped, failed
	Duration time.Duration `json:"duration_ns"`
	Result   string        `json:"result"`
}

// pipelineRun is one kiln run: the resolved pipeline and what each stage
// hands the next.
type pipelineRun struct {
	o     *runOptions
	p     *pipeline
	g     *globalOptions
	c     *cobra.Command
	rows  []runRow
	state runState

	report   progress.Reporter
	model    string                      // the ONNX the stages read
	imported *manifest.Import            // where model came from, for a SavedModel source
	calib    *manifest.CalibrationOutput // calibrate's output, for int8 and serve
}

// runState is kiln-run.json: the key of the checks serve last passed and
// the repository each destination last received.
type runState struct {
	Serve     manifest.Digest            `json:"serve,omitempty"`
	Published map[string]manifest.Digest `json:"published,omitempty"`
}

// selected reports whether stage runs under --until and --only.
func (r *pipelineRun) selected(stage string) bool {
	switch {
	case r.o.only != "":
		return stage == r.o.only
	case r.o.until != "":
		return slices.Index(runStages, stage) <= slices.Index(runStages, r.o.until)
	}
	return true
}

// run runs the selected stages in order and stops at the first failure.
func (r *pipelineRun) run(ctx context.Context) error {
	if err := r.g.initORT(); err != nil {
		return err
	}
	rep, done := newProgress(r.c.ErrOrStderr(), r.o.progress)
	defer done()
	r.report = rep
	if data, err := os.ReadFile(filepath.Join(r.p.Report, runStateFile)); err == nil {
		_ = json.Unmarshal(data, &r.state) // an unreadable state runs the stages again
	}
	stages := []struct {
		name string
		fn   func(context.Context) (string, bool, error)
	}{{"import", r.importStage}, {"calibrate", r.calibrateStage}, {"convert", r.convertStage}, {"serve", r.serveStage}, {"pack", r.packStage}}
	for _, s := range stages {
		// import and calibrate hand their outputs on (serve checks on the
		// calibration's validation split), so a later selected stage still
		// needs them: they run, usually from their caches.
		needed := s.name == "import" || (s.name == "calibrate" && (r.selected("convert") || r.selected("serve")))
		if !r.selected(s.name) && !needed {
			continue
		}
		start := time.Now()
		result, ran, err := s.fn(ctx)
		row := runRow{Stage: s.name, Status: "skipped", Duration: time.Since(start), Result: result}
		if ran {
			row.Status = "ran"
		}
		if err != nil {
			row.Status = "failed"
			if row.Result == "" {
				row.Result = firstLine(err.Error())
			}
			r.rows = append(r.rows, row)
			return err
		}
		r.rows = append(r.rows, row)
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// importStage makes the ONNX the other stages read: the source itself, or
// a SavedModel's import, which is not redone while the SavedModel's files
// are those it was imported from (importKey).
func (r *pipelineRun) importStage(ctx context.Context) (string, bool, error) {
	if !isSavedModelSource(r.p.Source) {
		r.model = r.p.Source
		return "ONNX source " + r.p.Source, false, nil
	}
	shapes, _ := check.ParseShapes(r.p.Shapes) // checked when the file was read
	model, rec, ok, err := cachedImport(ctx, r.p.Source, shapes)
	if err != nil {
		return "", false, err
	}
	if ok {
		r.model, r.imported = model, rec
		return "unchanged: imported to " + model, false, nil
	}
	if model, rec, err = importedSource(ctx, r.p.Source, shapes); err != nil {
		return "", true, err
	}
	r.model, r.imported = model, rec
	return "imported to " + model, true, nil
}

// calibrateStage calibrates into the user cache directory, as convert's
// --calib-data does, reusing a calibration with the same inputs.
func (r *pipelineRun) calibrateStage(ctx context.Context) (string, bool, error) {
	pc := r.p.Calibration
	if pc == nil {
		return "no calibration: data (no int8 variants)", false, nil
	}
	co := &calibrateOptions{}
	co.addFlags(pflag.NewFlagSet("calibrate", pflag.ContinueOnError))
	co.cfg.Data.Path, co.cfg.Samples, co.cfg.Seed = pc.Data, pc.Samples, pc.Seed
	co.cfg.Data.Preprocess, _ = dataset.ParsePreprocess(pc.Preprocess) // checked when the file was read
	if pc.Method != "" {
		co.cfg.Method, _ = calibrate.ParseMethod(pc.Method)
	}
	cfg, err := co.config(r.model)
	if err != nil {
		return "", false, err
	}
	ucd, err := os.UserCacheDir()
	if err != nil {
		return "", false, fmt.Errorf("calibrating: %w", err)
	}
	fsys, closeFS, err := dataFS(ctx, cfg.Data.Path)
	if err != nil {
		return "", false, err
	}
	defer closeFS()
	opts := []calibrate.Option{calibrate.WithFS(fsys), calibrate.WithProgress(r.report), calibrate.WithLogger(r.g.logger(r.c.ErrOrStderr()))}
	dir, rep, err := calibrate.RunCached(ctx, cfg, filepath.Join(ucd, "kiln", "calib"), opts...)
	if te := (*calibrate.TargetError)(nil); errors.As(err, &te) {
		return "", true, &ExitError{Code: ExitCheck, Err: err}
	}
	if err != nil {
		return "", true, err
	}
	out, err := calibrate.ReadOutput(dir)
	if err != nil {
		return "", true, err
	}
	r.calib = &out
	result := fmt.Sprintf("%s, %d samples, %s", out.Calibration.Method, out.Calibration.Samples, dir)
	if rep == nil {
		return "unchanged: " + result, false, nil
	}
	return result, true, nil
}

// convertStage builds the variants as kiln convert does; a variant the
// repository already holds, unchanged, is reused.
func (r *pipelineRun) convertStage(ctx context.Context) (string, bool, error) {
	o := &convertOptions{}
	o.addFlags(pflag.NewFlagSet("convert", pflag.ContinueOnError))
	// The ONNX the import stage made, and its import record for kiln.json
	// (config's importedSource passes an ONNX file through).
	o.cfg.Source, o.cfg.Repo, o.cfg.Name, o.cfg.Labels = r.model, r.p.Repository, r.p.Name, r.p.Labels
	o.cfg.Variants = r.p.variants()
	o.skipUnavail = r.o.skipUnavail
	if t := r.p.Target; t != nil {
		o.matrix.Target, _ = manifest.ParseComputeCapability(t.GPU)
		if t.TensorRT != "" {
			o.trt, _ = manifest.ParseTRTSpec(t.TensorRT)
		}
	}
	if c := r.p.Checks; c != nil && c.Data != "" {
		o.checkData.Path = c.Data
		o.checkData.Preprocess, _ = dataset.ParsePreprocess(c.Preprocess)
	}
	if err := o.config(ctx, nil); err != nil {
		return "", false, err
	}
	o.cfg.Imported, o.cfg.Int8.Calibration = r.imported, r.calib
	opts, err := o.collaborators(r.c, r.g)
	if err != nil {
		return "", false, err
	}
	res, err := convert.Run(ctx, o.cfg, append(opts, convert.WithProgress(r.report))...)
	if err == nil && r.g.verbose > 0 {
		err = printConvert(r.c.ErrOrStderr(), formatText, res)
	}
	err = o.finish(io.Discard, res, err)
	if res == nil {
		return "", true, err
	}
	count := map[string]int{}
	ran := false
	for _, row := range res.Rows {
		switch {
		case row.Reused:
			count["reused"]++
		case row.Status == manifest.StatusOK || row.Status == manifest.StatusPerfOnly:
			count["built"]++
			ran = true
		default:
			count[string(row.Status)]++
			ran = true
		}
	}
	return fmt.Sprintf("%d variants (%s) in %s", len(res.Rows), counts(count), r.p.Repository), ran, err
}

// counts writes {"built": 2, "reused": 1} as "1 reused, 2 built".
func counts(m map[string]int) string {
	var parts []string
	for _, k := range []string{"reused", "built", string(manifest.StatusNeedsGPU), string(manifest.StatusFailed)} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
		}
	}
	return strings.Join(parts, ", ")
}

// serveOptions are serve's settings from the pipeline file: checks:, or
// the calibration's validation split.
func (r *pipelineRun) serveOptions() *serveOptions {
	o := &serveOptions{}
	o.addFlags(pflag.NewFlagSet("serve", pflag.ContinueOnError))
	o.output, o.skip = r.p.Report, r.o.skipUnavail
	if c := r.p.Checks; c != nil {
		o.data.Path = c.Data
		o.data.Preprocess, _ = dataset.ParsePreprocess(c.Preprocess)
		for _, s := range c.Thresholds {
			ov, _ := check.ParseOverride(s)
			o.thresholds = append(o.thresholds, ov)
		}
		if c.Perf != nil {
			o.perf = *c.Perf
		}
		if c.Window != "" {
			o.cfg.Perf.Window, _ = time.ParseDuration(c.Window)
		}
	}
	if o.data.Path == "" && r.calib != nil && r.calib.Validation != nil {
		o.calibDir = r.calib.Dir
	}
	return o
}

// serveKey digests what decides serve's verdicts: every model's files and
// status and the check settings. The verdicts kiln.json holds are part of
// it, so a repository whose records changed is checked again.
func serveKey(settings []byte, repo string) (manifest.Digest, *manifest.Manifest, error) {
	man, err := manifest.Read(repo)
	if err != nil {
		return "", nil, err
	}
	type model struct {
		Name   string
		Status manifest.Status
		Files  []manifest.File
		Checks json.RawMessage
	}
	var models []model
	for _, m := range man.Models {
		models = append(models, model{m.Name, m.Status, m.Files, m.Checks})
	}
	b, err := json.Marshal(map[string]any{"models": models, "settings": json.RawMessage(settings)})
	if err != nil {
		return "", nil, err
	}
	return manifest.DigestBytes(b), man, nil
}

// serveStage checks the repository as kiln serve does, unless it last
// passed with the same artifacts, records and settings.
func (r *pipelineRun) serveStage(ctx context.Context) (string, bool, error) {
	o := r.serveOptions()
	// The settings as given, before serve resolves them (run changes o).
	settings, err := json.Marshal(map[string]any{
		"data": o.data.Path, "preprocess": o.data.Preprocess.String(), "calib": o.calibDir,
		"thresholds": fmt.Sprint(o.thresholds), "perf": o.perf, "window": o.cfg.Perf.Window.String(), "tool": version(),
	})
	if err != nil {
		return "", false, err
	}
	key, _, err := serveKey(settings, r.p.Repository)
	if err != nil {
		return "", false, err
	}
	html := filepath.Join(r.p.Report, serve.ReportHTML)
	if _, err := os.Stat(html); err == nil && key == r.state.Serve {
		return "unchanged since it passed: " + html, false, nil
	}
	rep, err := o.run(ctx, r.g, r.p.Repository, r.c.ErrOrStderr())
	if err != nil {
		return "", true, err
	}
	result := fmt.Sprintf("%s (%d models): %s", rep.Verdict, len(rep.Models), html)
	if code := rep.ExitCode(); code != 0 && !(o.skip && rep.Verdict == report.NotChecked) {
		return result, true, &ExitError{Code: code, Err: fmt.Errorf("serve: verdict %s (see %s)", rep.Verdict, html)}
	}
	if key, _, err = serveKey(settings, r.p.Repository); err != nil { // with the verdicts serve recorded
		return result, true, err
	}
	r.state.Serve = key
	return result, true, r.saveState()
}

// saveState writes kiln-run.json into the report directory.
func (r *pipelineRun) saveState() error {
	b, err := json.MarshalIndent(r.state, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.p.Report, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.p.Report, runStateFile), append(b, '\n'), 0o644)
}

// repoDigest is the digest of the repository's kiln.json without its
// publication records: what a dir: destination's record holds, and what
// changes whenever anything pack would publish changes.
func repoDigest(repo string) (manifest.Digest, *manifest.Manifest, error) {
	man, err := manifest.Read(repo)
	if err != nil {
		return "", nil, err
	}
	pub := man.Published
	man.Published = nil
	b, err := man.Marshal()
	man.Published = pub
	if err != nil {
		return "", nil, err
	}
	return manifest.DigestBytes(b), man, nil
}

// packStage publishes to every destination that does not already hold
// this repository (its record in kiln.json and in kiln-run.json agree).
func (r *pipelineRun) packStage(ctx context.Context) (string, bool, error) {
	if len(r.p.Destinations) == 0 {
		return "no destinations", false, nil
	}
	digest, man, err := repoDigest(r.p.Repository)
	if err != nil {
		return "", false, err
	}
	o := &packOptions{}
	o.addFlags(pflag.NewFlagSet("pack", pflag.ContinueOnError))
	o.cfg.Repo, o.cfg.Compression = r.p.Repository, pack.Compression(o.compression)
	if r.p.Base != "" {
		o.cfg.Base = r.p.Base
	}
	if t := r.p.Target; t != nil {
		o.cfg.Target.ComputeCapability, _ = manifest.ParseComputeCapability(t.GPU)
		if t.TensorRT != "" {
			o.cfg.Target.TRT, _ = manifest.ParseTRTSpec(t.TensorRT)
		}
	}
	var kept []string
	for _, s := range r.p.Destinations {
		d, _ := pack.ParseDestination(s)
		if r.state.Published[d.String()] == digest && published(man, d.String()) && destinationExists(d) {
			kept = append(kept, d.String())
			continue
		}
		o.cfg.To = append(o.cfg.To, d)
	}
	if len(o.cfg.To) == 0 {
		return "unchanged: " + strings.Join(kept, ", "), false, nil
	}
	o.gcs.Progress = r.report
	opts := []pack.Option{pack.WithLogger(r.g.logger(r.c.ErrOrStderr())), pack.WithRegistry(pack.DefaultRegistry(false)), pack.WithGCS(o.gcs)}
	pubs, err := pack.Run(ctx, o.cfg, opts...)
	if r.state.Published == nil {
		r.state.Published = map[string]manifest.Digest{}
	}
	var parts []string
	for _, p := range pubs {
		r.state.Published[p.Destination] = digest
		parts = append(parts, p.Destination+" "+shortDigest(p.Digest))
	}
	if serr := r.saveState(); serr != nil && err == nil {
		err = serr
	}
	if re := (*pack.RefusedError)(nil); errors.As(err, &re) {
		err = &ExitError{Code: ExitCheck, Err: err}
	}
	if len(kept) > 0 {
		parts = append(parts, "unchanged: "+strings.Join(kept, ", "))
	}
	return strings.Join(parts, "; "), true, err
}

func shortDigest(d manifest.Digest) string {
	s := string(d)
	if len(s) > len("sha256:")+12 {
		return s[:len("sha256:")+12]
	}
	return s
}

// published reports whether kiln.json records a publication to dest.
func published(man *manifest.Manifest, dest string) bool {
	return slices.ContainsFunc(man.Published, func(p manifest.Publication) bool { return p.Destination == dest })
}

// destinationExists reports whether a local destination is still there;
// a remote one is taken on its record.
func destinationExists(d pack.Destination) bool {
	switch d.Kind {
	case pack.KindDir, pack.KindOCILayout, pack.KindOCIArchive:
		_, err := os.Stat(d.Path)
		return err == nil
	}
	return true
}

// printRun writes the summary table, or with --format json {"stages": [...]}.
func printRun(w io.Writer, format string, rows []runRow) error {
	if format == formatJSON {
		if rows == nil {
			rows = []runRow{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"stages": rows})
	}
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STAGE\tSTATUS\tTIME\tRESULT")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Stage, r.Status, r.Duration.Round(time.Millisecond), r.Result)
	}
	return tw.Flush()
}
