package calibrate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"iter"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
	"github.com/kiln-ml/kiln/ort"
)

// The files Run writes into its output directory; CacheFile only with
// Config.TRTCache and ORTDir only with Config.ORTTable. The ONNX Runtime
// TensorRT execution provider table (see WriteORTTable) goes into ORTDir
// because its text file is also named calibration.cache.
const (
	RangesFile = "ranges.json"
	CacheFile  = "calibration.cache"
	ModelFile  = "model.int8.onnx"
	ReportJSON = "report.json"
	ReportMD   = "report.md"
	ORTDir     = "ort"
)

// DefaultTRTVersion is the TensorRT version the cache header names when
// Config.TRTVersion is zero: TensorRT 10.3.0, the version of the newest NGC
// Triton images that still calibrate implicitly with trtexec --calib.
var DefaultTRTVersion = manifest.TRTVersion{Major: 10, Minor: 3, Patch: 0}

// DefaultBatch is the batch size for models with a dynamic batch dimension.
const DefaultBatch = 16

// Config is one calibration run. The zero value of every field but Model and
// Data.Path is a sensible default.
type Config struct {
	// Model is the path of the fp32 ONNX model.
	Model string
	// Data says where the samples are (Path, Format, Preprocess, ImageKey);
	// Inputs is filled in from the model.
	Data dataset.Spec
	// Method chooses ranges; "" means Entropy.
	Method        Method
	MethodOptions MethodOptions
	// Samples is how many samples to draw from the dataset with Seed
	// (0: all of them).
	Samples int
	Seed    int64
	// CalibShare is the share of the drawn samples used for calibration: a
	// fraction below 1 or a count; the others validate. 0 means 0.5.
	CalibShare float64
	// Validation caps the validation samples (0: all the others). -1 means
	// no validation: every drawn sample calibrates, whatever CalibShare
	// says, and there is no accuracy report.
	Validation int
	// Fix folds inputs to values before calibrating (as convert --fix does;
	// give the same values to both).
	Fix map[string]*onnx.Tensor
	// Batch is the batch size; 0 means the model's fixed batch dimension,
	// or DefaultBatch.
	Batch int
	// TRTVersion is the TensorRT release the cache header names; the zero
	// value means DefaultTRTVersion.
	TRTVersion manifest.TRTVersion
	// TRTCache writes the TensorRT calibration cache (CacheFile, for
	// implicitly quantized engines, TensorRT <= 10) and ORTTable ONNX
	// Runtime's TensorRT execution provider table (ORTDir). Both need a
	// range for every tensor, so either makes the run observe every tensor
	// (ScopeAll); without them it observes only what the Q/DQ model
	// quantizes (ScopeQDQ). See Config.Scope.
	TRTCache, ORTTable bool
	// Exclude lists nodes (name or first output) and op types kept in fp32.
	// The report then also shows the accuracy without exclusions.
	Exclude []string
	// Target is the accuracy the Q/DQ model must reach on the validation
	// samples: until it does, layers are kept in fp32, worst first (see
	// TargetReport). nil keeps every layer Exclude does not name in int8.
	Target Target
	// Session configures ONNX Runtime.
	Session ort.SessionOptions
	// MemoryBudget caps, in bytes, the activations one ONNX Runtime run
	// fetches (see CollectOptions.MemoryBudget); 0 means no cap. It changes
	// how the work is split, never the results.
	MemoryBudget int64
}

// Validate checks the config on its own.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("no model given"))
	}
	if c.Data.Path == "" {
		errs = append(errs, errors.New("no dataset given"))
	}
	if c.Method != "" && !c.Method.valid() {
		_, err := ParseMethod(string(c.Method))
		errs = append(errs, err)
	}
	if p := c.MethodOptions.Percentile; p < 0 || p > 100 || math.IsNaN(p) {
		errs = append(errs, fmt.Errorf("percentile %v is not in (0, 100]", p))
	}
	if c.MemoryBudget < 0 {
		errs = append(errs, fmt.Errorf("memory budget %d is negative", c.MemoryBudget))
	}
	if c.Samples < 0 || c.Batch < 0 || c.Validation < -1 {
		errs = append(errs, errors.New("samples and batch must not be negative"))
	}
	if c.CalibShare < 0 || math.IsNaN(c.CalibShare) || math.IsInf(c.CalibShare, 0) || c.CalibShare >= 1 && c.CalibShare != math.Trunc(c.CalibShare) {
		errs = append(errs, fmt.Errorf("calibration share %v: want a fraction in (0,1) or a whole count", c.CalibShare))
	}
	if err := c.Session.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Target.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(c.Target) > 0 && c.Validation < 0 {
		errs = append(errs, errNoTargetSamples)
	}
	return errors.Join(errs...)
}

// Scope is which tensors the run observes: ScopeAll when the TensorRT cache
// or ONNX Runtime table is asked for, else ScopeQDQ.
func (c Config) Scope() Scope {
	if c.TRTCache || c.ORTTable {
		return ScopeAll
	}
	return ScopeQDQ
}

// Option injects a collaborator into Run.
type Option func(*runner)

// WithProgress reports progress over the calibration and validation samples.
func WithProgress(r progress.Reporter) Option { return func(rn *runner) { rn.progress = r } }

// WithLogger logs what Run does; the default discards.
func WithLogger(l *slog.Logger) Option { return func(rn *runner) { rn.log = l } }

// WithFS reads the dataset through fsys (for gs://); the default is dataset.Local.
func WithFS(fsys dataset.FS) Option { return func(rn *runner) { rn.fsys = fsys } }

type runner struct {
	progress progress.Reporter
	log      *slog.Logger
	fsys     dataset.FS
}

// newRunner applies opts over the defaults: no progress, a discarding
// logger and the local file system.
func newRunner(opts []Option) *runner {
	rn := &runner{log: slog.New(slog.NewTextHandler(io.Discard, nil)), fsys: dataset.Local{}}
	for _, o := range opts {
		o(rn)
	}
	return rn
}

// withDefaults spells out the fields whose zero value stands for a
// default, so that a config and the same config with its defaults written
// out calibrate, and are cached by RunCached, alike.
func (c Config) withDefaults() Config {
	if c.Method == "" {
		c.Method = Entropy
	}
	if c.CalibShare == 0 {
		c.CalibShare = 0.5
	}
	if c.TRTVersion.IsZero() {
		c.TRTVersion = DefaultTRTVersion
	}
	return c
}

// Run calibrates cfg.Model on cfg.Data and writes into dir: ranges.json
// (the tensors of cfg.Scope), model.int8.onnx (Q/DQ, see Quantize),
// report.json and report.md, and as asked calibration.cache (cfg.TRTCache;
// TensorRT, header for cfg.TRTVersion) and ort/ (cfg.ORTTable; ONNX
// Runtime's TensorRT execution provider table). The files are written into
// a temporary directory next to dir that replaces dir only when everything succeeded,
// so a failed run leaves dir as it was. An existing dir is replaced only when
// it is empty or holds a previous run (a ranges.json).
func Run(ctx context.Context, cfg Config, dir string, opts ...Option) (*Report, error) {
	rn := newRunner(opts)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("calibrating: %w", err)
	}
	if err := checkOutDir(dir); err != nil {
		return nil, err
	}
	start := time.Now()
	rep, files, err := rn.calibrate(ctx, cfg.withDefaults())
	if err != nil {
		return nil, fmt.Errorf("calibrating %s: %w", cfg.Model, err)
	}
	if err := checkOutDir(dir); err != nil { // again: the directory may have changed while calibrating
		return nil, err
	}
	rep.Scope = cfg.Scope()
	err = atomicfile.ReplaceDir(dir, func(tmp string) error {
		for name, write := range files {
			if name == CacheFile && !cfg.TRTCache || name == ORTDir && !cfg.ORTTable {
				continue // not asked for
			}
			if err := write(filepath.Join(tmp, name)); err != nil {
				return err
			}
			if name == ORTDir {
				name += "/"
			}
			rep.Files = append(rep.Files, name)
		}
		rep.Files = append(rep.Files, ReportJSON, ReportMD)
		sort.Strings(rep.Files)
		rep.Duration = time.Since(start).Round(time.Millisecond).String()
		if err := writeReport(tmp, rep); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", dir, err)
	}
	rn.log.Info("calibrated", "path", dir, "dur", time.Since(start))
	return rep, nil
}

// job is one calibration once the model is loaded and its samples drawn.
type job struct {
	cfg   Config // with its defaults (see Config.withDefaults)
	m     *onnx.Model
	name  string // the model's file name without extension, for progress
	batch int
	bopts dataset.BatchOptions
	drawn
}

// drawn are the samples of a job: the opened dataset and the indices that
// calibrate and validate.
type drawn struct {
	src          dataset.Source
	calib, valid []int
	// unused counts drawn samples left out because they make no full
	// batch of a model that fixes its batch size.
	unused int
}

// calibrate does the work and returns the report and the writers of the
// output files, which run only when everything succeeded.
func (rn *runner) calibrate(ctx context.Context, cfg Config) (*Report, map[string]func(string) error, error) {
	modelBytes, m, err := loadModel(ctx, cfg.Model, cfg.Fix)
	if err != nil {
		return nil, nil, err
	}
	if err := cfg.Target.checkOutputs(m); err != nil {
		return nil, nil, err
	}
	sig := m.Inputs()
	batch, fixed, err := batchSize(sig, cfg.Batch)
	if err != nil {
		return nil, nil, err
	}
	d, err := rn.draw(ctx, cfg, sig, fixed)
	if err != nil {
		return nil, nil, err
	}
	if len(cfg.Target) > 0 && len(d.valid) == 0 {
		return nil, nil, errNoTargetSamples
	}
	j := &job{
		cfg: cfg, m: m, name: strings.TrimSuffix(filepath.Base(cfg.Model), filepath.Ext(cfg.Model)),
		batch: batch, bopts: dataset.BatchOptions{Size: batch, Inputs: sig}, drawn: d,
	}
	ranges, samples, err := rn.collectRanges(ctx, j)
	if err != nil {
		return nil, nil, err
	}
	ranges.ModelDigest = manifest.DigestBytes(modelBytes)
	q, models, err := quantizeAll(m, ranges, cfg.Exclude)
	if err != nil {
		return nil, nil, err
	}
	rep := j.report(ranges, samples, q)
	// The collection's activations are garbage now; return them to the
	// system before validation allocates its own.
	debug.FreeOSMemory()
	accs, err := rn.validate(ctx, j, models, ranges)
	if err != nil {
		return nil, nil, err
	}
	rep.setAccuracy(accs, len(j.valid))
	if len(j.valid) > 0 {
		rep.ValidationSplit = &manifest.DataSplit{Path: cfg.Data.Path, Format: string(cfg.Data.Format),
			Preprocess: cfg.Data.Preprocess.String(), Indices: j.valid}
	}
	if len(cfg.Target) > 0 {
		if q, err = rn.meetTarget(ctx, j, ranges, rep, q); err != nil {
			return nil, nil, err
		}
	}
	return rep, outputFiles(ranges, q, cfg.TRTVersion), nil
}

// loadModel reads and parses the fp32 model, keeping its bytes for the
// model digest, and refuses before any data is read what calibration
// cannot use: a model without float32 tensors or with fp16 inputs (an fp16
// model; its fp32 original is the one to calibrate).
func loadModel(ctx context.Context, path string, fix map[string]*onnx.Tensor) ([]byte, *onnx.Model, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	m, err := onnx.Parse(data, filepath.Dir(path))
	if err != nil {
		return nil, nil, err
	}
	m.Path = path
	for _, in := range m.Inputs() {
		if in.Type == onnx.Float16 || in.Type == onnx.BFloat16 {
			return nil, nil, fmt.Errorf("input %q is %s: calibrate the fp32 model", in.Name, in.Type)
		}
	}
	// Calibrate what convert builds from: the normalized source (Constant
	// weights as initializers, so they are quantized per channel; opset 13,
	// which per-channel Q/DQ needs; fp16 storage raised; inputs fixed).
	if m, _, err = normalize.Normalize(ctx, m, normalize.Options{MinOpset: 13, RaiseFP16: true, Fix: fix}); err != nil {
		return nil, nil, err
	}
	if _, err := Observed(m); err != nil {
		return nil, nil, err
	}
	if err := checkQuantizable(m); err != nil {
		return nil, nil, err
	}
	for _, in := range m.Inputs() {
		if in.Type == onnx.Float16 || in.Type == onnx.BFloat16 {
			return nil, nil, fmt.Errorf("input %q is %s: calibrate the fp32 model", in.Name, in.Type)
		}
	}
	return data, m, nil
}

// batchSize is the batch to run and the one the model fixes (fixed, 0 when
// the batch dimension is free or there is none): the one asked for, else
// the fixed one, else DefaultBatch for a batched model and 1 for another.
// A batch the model does not take is an error.
func batchSize(sig []onnx.ValueInfo, asked int) (batch, fixed int, err error) {
	for _, in := range sig {
		if d := in.Shape.Dims; dataset.Batched(sig) && len(d) > 0 && d[0].Known {
			fixed = int(d[0].Value)
		}
	}
	switch {
	case asked == 0 && fixed > 0:
		return fixed, fixed, nil
	case asked == 0 && dataset.Batched(sig):
		return DefaultBatch, fixed, nil
	case asked == 0:
		return 1, fixed, nil
	case fixed > 0 && asked != fixed:
		return 0, 0, fmt.Errorf("batch %d: the model fixes its batch dimension at %d", asked, fixed)
	}
	return asked, fixed, nil
}

// draw opens the dataset and draws the calibration and validation samples
// as cfg says. A model that fixes its batch runs full batches only: the
// samples past the last full batch are left out, and counted in the report.
func (rn *runner) draw(ctx context.Context, cfg Config, sig []onnx.ValueInfo, fixed int) (drawn, error) {
	spec := cfg.Data
	spec.Inputs = sig
	src, err := dataset.Open(ctx, spec, rn.fsys)
	if err != nil {
		return drawn{}, err
	}
	picked := dataset.Select(cfg.Samples, src.Len(), cfg.Seed)
	calib, valid := picked, []int(nil) // no validation: every sample calibrates
	if cfg.Validation >= 0 {
		if calib, valid, err = dataset.Split(picked, cfg.CalibShare); err != nil {
			return drawn{}, err
		}
	}
	if len(calib) == 0 {
		return drawn{}, fmt.Errorf("no calibration samples: %d drawn, calibration share %v", len(picked), cfg.CalibShare)
	}
	if cfg.Validation > 0 && len(valid) > cfg.Validation {
		valid = valid[:cfg.Validation]
	}
	unused := 0
	if fixed > 1 {
		unused = len(calib)%fixed + len(valid)%fixed
		calib, valid = calib[:len(calib)-len(calib)%fixed], valid[:len(valid)-len(valid)%fixed]
		if len(calib) == 0 {
			return drawn{}, fmt.Errorf("the model fixes its batch dimension at %d, and the %d calibration samples make no full batch", fixed, unused)
		}
	}
	return drawn{src: src, calib: calib, valid: valid, unused: unused}, nil
}

// collectRanges collects the statistics of the calibration samples and
// computes the ranges, whose dataset digest hashes the samples as they ran.
// It returns the number of samples collected.
func (rn *runner) collectRanges(ctx context.Context, j *job) (Ranges, int, error) {
	h := manifest.NewHash()
	task := progress.Start(rn.progress, "calibrate "+j.name, int64(len(j.calib)), "samples")
	stats, err := Collect(ctx, j.m, hashed(dataset.Batches(ctx, j.src, j.calib, j.bopts), h), CollectOptions{
		Session:      j.cfg.Session,
		Scope:        j.cfg.Scope(),
		MemoryBudget: j.cfg.MemoryBudget,
		Progress:     func(n int) { task.Add(int64(n)) },
	})
	task.Finish(err)
	if err != nil {
		return Ranges{}, 0, err
	}
	ranges, err := stats.Ranges(j.cfg.Method, j.cfg.MethodOptions)
	if err != nil {
		return Ranges{}, 0, err
	}
	ranges.DatasetDigest = manifest.HashDigest(h)
	return ranges, stats.Samples, nil
}

// quantizeAll makes the Q/DQ model to write and the models to validate:
// with exclusions, the one without them first, the report's baseline.
func quantizeAll(m *onnx.Model, ranges Ranges, exclude []string) (*Quantized, []*Quantized, error) {
	models := []*Quantized{}
	q, err := Quantize(m, ranges, QuantizeOptions{Exclude: exclude})
	if err != nil {
		return nil, nil, err
	}
	if len(exclude) > 0 {
		base, err := Quantize(m, ranges, QuantizeOptions{})
		if err != nil {
			return nil, nil, err
		}
		models = append(models, base)
	}
	return q, append(models, q), nil
}

// report records what the job ran; setAccuracy adds how well it did.
func (j *job) report(ranges Ranges, samples int, q *Quantized) *Report {
	return &Report{
		Model: j.cfg.Model, ModelDigest: ranges.ModelDigest, Dataset: j.cfg.Data.Path, DatasetDigest: ranges.DatasetDigest,
		Method: j.cfg.Method, Batch: j.batch, CalibrationSamples: samples, UnusedSamples: j.unused, TensorRanges: len(ranges.Tensors),
		Exclude: j.cfg.Exclude, Quantization: q, TRTVersion: j.cfg.TRTVersion.Number(),
	}
}

// validate measures the Q/DQ models against fp32 on the validation samples.
// That also proves that the Q/DQ model loads and runs in ONNX Runtime;
// without validation samples one calibration batch does that (see check),
// and there are no accuracies.
func (rn *runner) validate(ctx context.Context, j *job, models []*Quantized, ranges Ranges) ([]*Accuracy, error) {
	if len(j.valid) == 0 {
		return nil, rn.check(ctx, j, models)
	}
	task := progress.Start(rn.progress, "validate "+j.name, int64(len(j.valid)), "samples")
	accs, err := Evaluate(ctx, j.m, models, ranges, counted(dataset.Batches(ctx, j.src, j.valid, j.bopts), task), j.cfg.Session)
	task.Finish(err)
	return accs, err
}

// setAccuracy records the results of validate: the written model's last,
// the baseline without exclusions first when there is one. Results of the
// check run on calibration samples are no accuracy and are left out.
func (r *Report) setAccuracy(accs []*Accuracy, validation int) {
	if validation > 0 {
		r.ValidationSamples = validation
		r.Accuracy = accs[len(accs)-1]
		if len(accs) > 1 {
			r.Baseline = accs[0]
		}
	}
	r.worst()
}

// outputFiles are the writers of the files Run puts in its directory, by
// name, run once everything else has succeeded; Run leaves out CacheFile
// and ORTDir unless the config asks for them.
func outputFiles(ranges Ranges, q *Quantized, trt manifest.TRTVersion) map[string]func(string) error {
	return map[string]func(string) error{
		RangesFile: func(p string) error { return WriteRanges(p, ranges) },
		CacheFile:  func(p string) error { return WriteCacheFile(p, ranges.Cache(trt)) },
		ModelFile:  func(p string) error { return q.Model.Save(p) },
		ORTDir: func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return WriteORTTable(p, ranges.ORTTable())
		},
	}
}

// hashed passes batches through, hashing sample IDs and tensor bytes into h
// (the dataset digest of the ranges file).
func hashed(batches iter.Seq2[*dataset.Batch, error], h hash.Hash) iter.Seq2[*dataset.Batch, error] {
	return func(yield func(*dataset.Batch, error) bool) {
		var buf []byte
		for b, err := range batches {
			if b != nil {
				for _, id := range b.IDs {
					io.WriteString(h, id+"\n")
				}
				names := make([]string, 0, len(b.Tensors))
				for n := range b.Tensors {
					names = append(names, n)
				}
				sort.Strings(names)
				for _, n := range names {
					io.WriteString(h, n+"\n")
					if v, ok := b.Tensors[n].Data.([]float32); ok {
						buf = buf[:0]
						for _, x := range v {
							buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
						}
						h.Write(buf)
					} else {
						fmt.Fprint(h, b.Tensors[n].Data)
					}
				}
			}
			if !yield(b, err) {
				return
			}
		}
	}
}

// counted reports progress over the samples of batches.
func counted(batches iter.Seq2[*dataset.Batch, error], t *progress.Task) iter.Seq2[*dataset.Batch, error] {
	return func(yield func(*dataset.Batch, error) bool) {
		for b, err := range batches {
			if !yield(b, err) {
				return
			}
			if b != nil {
				t.Add(int64(len(b.IDs)))
			}
		}
	}
}

// checkOutDir refuses an output path that is a file or a directory that
// holds something other than a previous run, before any work is done.
func checkOutDir(dir string) error {
	if dir == "" {
		return errors.New("no output directory given")
	}
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("output %s is a file, not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, RangesFile)); err != nil {
		return fmt.Errorf("output directory %s is not empty and holds no %s of an earlier run: refusing to replace it", dir, RangesFile)
	}
	return nil
}
