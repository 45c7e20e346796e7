package convert

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
	"github.com/kiln-ml/kiln/pbtxt"
)

// Row is the outcome of one variant.
type Row struct {
	Variant  manifest.Variant `json:"variant"`
	Model    string           `json:"model"`
	File     string           `json:"file,omitempty"`
	Size     int64            `json:"size,omitempty"`
	Duration time.Duration    `json:"duration_ns"`
	// Status is the variant's state, as kiln.json records it.
	Status manifest.Status `json:"status"`
	// Reused says the repository already held the variant, unchanged, and
	// this run did no work for it ("using existing <variant>").
	Reused bool   `json:"reused,omitempty"`
	Detail string `json:"detail,omitempty"`
	Err    error  `json:"-"`
}

// Result is the outcome of a run.
type Result struct {
	Repo   string `json:"repository"`
	Source string `json:"source"`
	// Precision is what the source computes in; Normalized what the
	// normalizer changed in it before any variant was made (empty when
	// every variant was reused and the source was not read).
	Precision  string   `json:"source_precision,omitempty"`
	Normalized []string `json:"normalized,omitempty"`
	// FP16Kept counts the nodes the data-aware pass kept in fp32 for the
	// fp16 variant.
	FP16Kept int   `json:"fp16_kept_fp32,omitempty"`
	Rows     []Row `json:"variants"`
}

// Partial reports whether some variant needs TensorRT that is missing here.
func (r *Result) Partial() bool {
	for _, row := range r.Rows {
		if row.Status == manifest.StatusNeedsGPU {
			return true
		}
	}
	return false
}

// recordedAny reports whether a row put something into the manifest: a
// variant built, reused or recorded as needing a GPU.
func (r *Result) recordedAny() bool {
	for _, row := range r.Rows {
		if row.Status != manifest.StatusFailed {
			return true
		}
	}
	return false
}

// Failed returns the rows that failed.
func (r *Result) Failed() []Row {
	var out []Row
	for _, row := range r.Rows {
		if row.Status == manifest.StatusFailed {
			out = append(out, row)
		}
	}
	return out
}

// Run builds every variant of cfg into the repository. It first checks cfg
// and the variants against the model's signature: variants that do not fit
// give a *PlanError and nothing is written. Each model directory is written
// atomically by pbtxt.WriteModel and kiln.json is written last, so an
// interrupted run leaves complete models and a manifest that describes
// them. A variant whose inputs did not change since the last run is reused
// ("using existing <variant>") unless cfg.Force is set. A variant that
// fails is a row with status failed, not an error of Run.
func Run(ctx context.Context, cfg Config, opts ...Option) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("checking the conversion config: %w", err)
	}
	var c collaborators
	for _, opt := range opts {
		opt(&c)
	}
	if c.builder == nil && c.missing == "" {
		c.missing = "trtexec not found"
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	b, err := newBuilder(ctx, cfg, c)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "kiln-convert-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	b.work = work

	res := &Result{Repo: cfg.Repo, Source: cfg.Source}
	task := progress.Start(c.progress, "convert "+b.name, int64(len(b.variants)), "variants")
	var runErr error
	for _, v := range b.variants {
		if err := ctx.Err(); err != nil {
			runErr = err
			break
		}
		row := b.variant(ctx, v)
		res.Rows = append(res.Rows, row)
		task.Add(1)
		if errors.Is(row.Err, context.Canceled) || errors.Is(row.Err, context.DeadlineExceeded) {
			runErr = row.Err
			break
		}
	}
	res.Precision, res.FP16Kept = string(b.precision), b.fp16Kept
	if b.normalized != nil {
		res.Normalized = b.normalized.Summaries()
	}
	// The manifest goes last and describes only complete model directories.
	// A run that built and recorded nothing leaves the repository as it was.
	if res.recordedAny() {
		if err := writeManifest(cfg.Repo, b.man); err != nil && runErr == nil {
			runErr = fmt.Errorf("writing %s: %w", manifest.FileName, err)
		}
	} else if b.created {
		os.Remove(cfg.Repo) // only if it is still empty
	}
	task.Finish(runErr)
	return res, runErr
}

// writeManifest puts kiln.json in the repository atomically.
func writeManifest(repo string, m *manifest.Manifest) error {
	data, err := m.Marshal()
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(repo, manifest.FileName), data, 0o644)
}

// builder is one run of Run: the checked inputs and what was made so far.
type builder struct {
	cfg      Config
	c        collaborators
	log      *slog.Logger
	name     string
	variants []manifest.Variant // checked against the model, sorted
	template pbtxt.GenerateOptions
	labels   map[string][]byte
	timing   string // the timing cache file; "" for none
	model    *onnx.Model
	sig      pbtxt.Signature // read on first use (loaded): a rerun that reuses everything never needs it
	loaded   bool
	src      manifest.Digest
	work     string
	man      *manifest.Manifest
	fp32     saved // the source as written for the variants, once made
	fp16     saved // the fp16 rewrite, once made
	trtV     *manifest.TRTVersion
	keys     map[string]manifest.Digest // cache keys by variant ID, once computed
	checkRef *reference                 // the fp32 source's outputs on the check feeds, once run
	created  bool                       // the run made the repository directory
	// normalized is what the normalizer did to the source, once loaded.
	normalized *normalize.Report
	// precision is what the source computes in, why says how kiln knows.
	precision normalize.Precision
	why       string
	fp16Kept  int      // nodes the data-aware pass kept in fp32
	fp16Extra []string // nodes kept in fp32 after a failed check (widen.go)
	// fp16Analysis is the data-aware pass's result, once run: a rebuild
	// after a failed check (widen.go) reuses it, and logs only the rewrite
	// warnings not yet logged (fp16Warned).
	fp16Analysis *fp16.Analysis
	fp16Warned   map[string]bool
}

// newBuilder does what comes before any variant: the model name, the label
// file, the manifest and the source's record, the check of the variants
// against the model, the timing cache. A refused plan writes nothing.
func newBuilder(ctx context.Context, cfg Config, c collaborators) (*builder, error) {
	b := &builder{cfg: cfg, c: c, log: c.log, name: cfg.Name, template: cfg.Template, keys: map[string]manifest.Digest{}}
	if b.name == "" {
		b.name = manifest.SanitizeName(stem(cfg.Source))
	}
	if err := manifest.ValidateName(b.name); err != nil {
		return nil, fmt.Errorf("model name: %w", err)
	}
	if cfg.Labels != "" {
		data, err := os.ReadFile(cfg.Labels)
		if err != nil {
			return nil, fmt.Errorf("reading the label file: %w", err)
		}
		name := filepath.Base(cfg.Labels)
		b.labels = map[string][]byte{name: data}
		b.template.LabelsFile = name
	}
	man, err := manifest.Read(cfg.Repo)
	if errors.Is(err, os.ErrNotExist) {
		man = manifest.New("kiln " + cfg.ToolVersion)
	} else if err != nil {
		return nil, err
	}
	if errors.Is(err, os.ErrNotExist) {
		if err := checkEmpty(cfg.Repo); err != nil {
			return nil, err
		}
	}
	man.Tool = "kiln " + cfg.ToolVersion
	src, err := sourceRecord(cfg.Source, b.name, man.SourceNamed(b.name), cfg.Force)
	if err != nil {
		return nil, err
	}
	src.Imported = cfg.Imported
	man.PutSource(src)
	b.man, b.src = man, src.Digest
	if err := b.checkVariants(ctx); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.Repo); errors.Is(err, os.ErrNotExist) {
		b.created = true
	}
	if err := os.MkdirAll(cfg.Repo, 0o755); err != nil {
		return nil, err
	}
	b.timing = b.timingCache()
	return b, nil
}

// checkVariants checks the variants against the model's signature. The
// weights are not needed for that; a model without external data is then
// complete and kept for the variants that need it. A rerun that can reuse
// every variant skips the check and never parses the model (BENCHMARKS.md):
// each cache key it matched was checked, with the same inputs, by the run
// that built the variant.
func (b *builder) checkVariants(ctx context.Context) error {
	if vs, ok := b.allReused(ctx); ok {
		b.variants = vs
		return nil
	}
	m, err := onnx.LoadWith(b.cfg.Source, onnx.LoadOptions{SkipExternalData: true})
	if err != nil {
		return err
	}
	m.Path = b.cfg.Source
	if err := normalize.Check(m); err != nil {
		return err // refused before anything is written
	}
	b.precision, b.why = normalize.SourcePrecision(m)
	if src := b.man.SourceNamed(b.name); src != nil {
		src.Precision = string(b.precision)
	}
	plan, err := CheckPlan(m, b.cfg.Variants, PlanOptions{HaveCalibration: b.haveCalibration(), RandomRanges: b.cfg.Int8.RandomRanges,
		SourcePrecision: b.precision, Why: b.why})
	if err != nil {
		return err
	}
	b.variants = plan.Variants
	if !m.HasExternalData() {
		b.model = m
	}
	return nil
}

// allReused returns the variants as CheckPlan would, without duplicates and
// sorted, when the repository holds every one of them built from the same
// inputs (the same cache key).
func (b *builder) allReused(ctx context.Context) ([]manifest.Variant, bool) {
	if b.cfg.Force || len(b.cfg.Variants) == 0 {
		return nil, false
	}
	seen := map[string]bool{}
	var out []manifest.Variant
	for _, v := range b.cfg.Variants {
		if v.Validate() != nil {
			return nil, false
		}
		if seen[v.ID()] {
			continue
		}
		seen[v.ID()] = true
		rec := b.man.Model(v.ModelName(b.name))
		if rec == nil || rec.Build == nil || rec.Status == manifest.StatusNeedsGPU {
			return nil, false
		}
		if key, err := b.cacheKey(ctx, v); err != nil || key != rec.Build.CacheKey {
			return nil, false
		}
		out = append(out, v)
	}
	sortVariants(out)
	return out, true
}

// haveCalibration says whether a Q/DQ model or calibration cache is given.
func (b *builder) haveCalibration() bool {
	cal := b.cfg.Int8.Calibration
	return cal != nil && (cal.QDQModel != "" || cal.Cache != "")
}

// timingCache names the model's timing cache file after the source digest,
// so that every variant and every run of one model share it. A directory
// that cannot be made means no timing cache, not a failed run: the cache
// only saves build time.
func (b *builder) timingCache() string {
	dir := b.cfg.TRT.TimingCacheDir
	if dir == "" || b.c.builder == nil {
		return ""
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.log.Warn("building without a timing cache", "path", dir, "err", err)
		return ""
	}
	return filepath.Join(dir, b.src.Hex()[:16]+".timing")
}

// variant builds one variant, or reuses it when the repository holds it
// with the same cache key.
func (b *builder) variant(ctx context.Context, v manifest.Variant) Row {
	start := time.Now()
	model := v.ModelName(b.name)
	row := Row{Variant: v, Model: model}
	key, err := b.cacheKey(ctx, v)
	if err != nil {
		return b.fail(row, start, err)
	}
	if rec := b.man.Model(model); rec != nil && !b.cfg.Force && rec.Build != nil && rec.Build.CacheKey == key && rec.Status != manifest.StatusNeedsGPU {
		if err := verifyFiles(filepath.Join(b.cfg.Repo, model), rec.Files); err == nil {
			b.log.Info("using existing "+v.ID(), "variant", v.ID(), "path", model)
			row.Status, row.Reused, row.Detail = rec.Status, true, "using existing "+v.ID()
			row.File, row.Size = mainFile(rec)
			row.Duration = time.Since(start)
			return row
		} else {
			b.log.Info("rebuilding "+v.ID(), "variant", v.ID(), "reason", err.Error())
		}
	}
	if v.Runtime == manifest.RuntimeTRT && b.c.builder == nil {
		row.Status, row.Detail = manifest.StatusNeedsGPU, "needs TensorRT ("+b.c.missing+")"
		b.man.Put(&manifest.Model{Name: model, Variant: v, Source: b.src, Version: 1, Files: []manifest.File{},
			Status: row.Status, Note: row.Detail})
		row.Duration = time.Since(start)
		return row
	}
	if err := b.load(ctx); err != nil {
		return b.fail(row, start, err)
	}
	var art *artifact
	switch v.Runtime {
	case manifest.RuntimeONNX:
		art, err = b.checkedONNX(ctx, v, model)
	case manifest.RuntimeTRT:
		art, err = b.planArtifact(ctx, v)
	default:
		err = fmt.Errorf("unknown runtime %q", v.Runtime)
	}
	if err != nil {
		return b.fail(row, start, err)
	}
	rec, err := b.write(v, model, art)
	if err != nil {
		return b.fail(row, start, err)
	}
	rec.Build.CacheKey = key
	rec.Build.Duration = time.Since(start)
	b.man.Put(rec)
	row.Status = rec.Status
	row.File, row.Size = mainFile(rec)
	row.Duration = time.Since(start)
	if art.note != "" {
		row.Detail = art.note
	}
	return row
}

func (b *builder) fail(row Row, start time.Time, err error) Row {
	row.Status, row.Err = manifest.StatusFailed, fmt.Errorf("variant %s: %w", row.Variant.ID(), err)
	row.Detail = err.Error()
	row.Duration = time.Since(start)
	b.log.Info("variant failed", "variant", row.Variant.ID(), "err", err) // the result table and exit status report it
	return row
}

// RepoError says that the repository directory cannot be written: it is
// not empty and not a kiln repository (it has no kiln.json), so kiln would
// mix its models with files it does not know.
type RepoError struct {
	Dir    string
	Reason string
}

func (e *RepoError) Error() string { return fmt.Sprintf("repository %s: %s", e.Dir, e.Reason) }

// checkEmpty refuses an existing, non-empty directory without kiln.json.
func checkEmpty(dir string) error {
	es, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return &RepoError{Dir: dir, Reason: err.Error()}
	case len(es) > 0:
		return &RepoError{Dir: dir, Reason: fmt.Sprintf("it holds %d entries (%s, ...) and no %s, so it is not a kiln repository; give a new or empty directory, or one kiln convert wrote",
			len(es), es[0].Name(), manifest.FileName)}
	}
	return nil
}

// sourceRecord describes the source file, reusing the digest of the last
// run when the file's name, size and modification time are unchanged.
func sourceRecord(path, name string, last *manifest.Source, force bool) (*manifest.Source, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading source model: %w", err)
	}
	rec := &manifest.Source{Name: name, Path: filepath.Base(path), Format: "onnx", Size: st.Size(), ModTime: st.ModTime().UTC()}
	if !force && last != nil && last.Path == rec.Path && last.Size == rec.Size && last.ModTime.Equal(rec.ModTime) && last.Digest.Validate() == nil {
		rec.Digest, rec.Precision = last.Digest, last.Precision // the same file computes in the same precision
		return rec, nil
	}
	if rec.Digest, rec.Size, err = manifest.DigestFile(path); err != nil {
		return nil, err
	}
	return rec, nil
}

// load reads the source model with its weights, unless the check of the
// variants already did, and its signature, once a variant needs building.
func (b *builder) load(ctx context.Context) error {
	if b.loaded {
		return nil
	}
	if b.model == nil {
		m, err := onnx.Load(b.cfg.Source)
		if err != nil {
			return err
		}
		b.model = m
	}
	opts := b.cfg.Normalize
	opts.RaiseFP16 = true
	nm, rep, err := normalize.Normalize(ctx, b.model, opts)
	if err != nil {
		return fmt.Errorf("normalizing %s: %w", b.cfg.Source, err)
	}
	b.model, b.normalized = nm, rep
	for _, p := range rep.Passes {
		b.log.Info("normalized the source: "+p.Summary, "pass", p.Name, "path", b.cfg.Source)
	}
	if src := b.man.SourceNamed(b.name); src != nil {
		src.Normalized = rep.Summaries()
	}
	sig, err := pbtxt.SignatureFromONNX(b.model)
	if err != nil {
		return fmt.Errorf("reading the signature of %s: %w", b.cfg.Source, err)
	}
	b.sig, b.loaded = sig, true
	return nil
}

func stem(path string) string {
	base := filepath.Base(path)
	return base[:len(base)-len(filepath.Ext(base))]
}
