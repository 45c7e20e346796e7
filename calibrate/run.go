package calibrate

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"iter"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// The files Run writes into its output directory. The ONNX Runtime TensorRT
// execution provider table (see WriteORTTable) goes into ORTDir because its
// text file is also named calibration.cache.
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
	// Validation caps the validation samples (0: all the others; -1: none).
	Validation int
	// Batch is the batch size; 0 means the model's fixed batch dimension,
	// or DefaultBatch.
	Batch int
	// TRTVersion is the TensorRT release the cache header names; the zero
	// value means DefaultTRTVersion.
	TRTVersion manifest.TRTVersion
	// Exclude lists nodes (name or first output) and op types kept in fp32.
	// The report then also shows the accuracy without exclusions.
	Exclude []string
	// Session configures ONNX Runtime.
	Session ort.SessionOptions
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
	if c.Samples < 0 || c.Batch < 0 || c.Validation < -1 {
		errs = append(errs, errors.New("samples and batch must not be negative"))
	}
	if c.CalibShare < 0 || math.IsNaN(c.CalibShare) || math.IsInf(c.CalibShare, 0) || c.CalibShare >= 1 && c.CalibShare != math.Trunc(c.CalibShare) {
		errs = append(errs, fmt.Errorf("calibration share %v: want a fraction in (0,1) or a whole count", c.CalibShare))
	}
	if err := c.Session.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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

// Run calibrates cfg.Model on cfg.Data and writes into dir: ranges.json,
// calibration.cache (TensorRT, header for cfg.TRTVersion), model.int8.onnx
// (Q/DQ, see Quantize), report.json, report.md and ort/ (ONNX Runtime's
// TensorRT execution provider table). The files are written into a temporary
// directory next to dir that replaces dir only when everything succeeded,
// so a failed run leaves dir as it was. An existing dir is replaced only when
// it is empty or holds a previous run (a ranges.json).
func Run(ctx context.Context, cfg Config, dir string, opts ...Option) (*Report, error) {
	rn := &runner{log: slog.New(slog.NewTextHandler(io.Discard, nil)), fsys: dataset.Local{}}
	for _, o := range opts {
		o(rn)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("calibrating: %w", err)
	}
	if err := checkOutDir(dir); err != nil {
		return nil, err
	}
	start := time.Now()
	rep, files, err := rn.calibrate(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("calibrating %s: %w", cfg.Model, err)
	}
	if err := checkOutDir(dir); err != nil { // again: the directory may have changed while calibrating
		return nil, err
	}
	err = atomicfile.ReplaceDir(dir, func(tmp string) error {
		for name, write := range files {
			if err := write(filepath.Join(tmp, name)); err != nil {
				return err
			}
		}
		rep.Files = append(rep.Files, RangesFile, CacheFile, ModelFile, ReportJSON, ReportMD, ORTDir+"/")
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

// calibrate does the work and returns the report and the writers of the
// output files, which run only when everything succeeded.
func (rn *runner) calibrate(ctx context.Context, cfg Config) (*Report, map[string]func(string) error, error) {
	modelBytes, err := os.ReadFile(cfg.Model)
	if err != nil {
		return nil, nil, err
	}
	m, err := onnx.Parse(modelBytes, filepath.Dir(cfg.Model))
	if err != nil {
		return nil, nil, err
	}
	if _, err := Observed(m); err != nil {
		return nil, nil, err
	}
	sig := m.Inputs()
	for _, in := range sig {
		if in.Type == onnx.Float16 || in.Type == onnx.BFloat16 {
			return nil, nil, fmt.Errorf("input %q is %s: calibrate the fp32 model", in.Name, in.Type)
		}
	}
	method := cfg.Method
	if method == "" {
		method = Entropy
	}
	// fixed is the batch size the model fixes (0: free or no batch).
	fixed := 0
	for _, in := range sig {
		if d := in.Shape.Dims; dataset.Batched(sig) && len(d) > 0 && d[0].Known {
			fixed = int(d[0].Value)
		}
	}
	batch := cfg.Batch
	switch {
	case batch == 0 && fixed > 0:
		batch = fixed
	case batch == 0 && dataset.Batched(sig):
		batch = DefaultBatch
	case batch == 0:
		batch = 1
	case fixed > 0 && batch != fixed:
		return nil, nil, fmt.Errorf("batch %d: the model fixes its batch dimension at %d", batch, fixed)
	}
	spec := cfg.Data
	spec.Inputs = sig
	src, err := dataset.Open(ctx, spec, rn.fsys)
	if err != nil {
		return nil, nil, err
	}
	picked := dataset.Select(cfg.Samples, src.Len(), cfg.Seed)
	share := cfg.CalibShare
	if share == 0 {
		share = 0.5
	}
	calib, valid, err := dataset.Split(picked, share)
	if err != nil {
		return nil, nil, err
	}
	if len(calib) == 0 {
		return nil, nil, fmt.Errorf("no calibration samples: %d drawn, calibration share %v", len(picked), share)
	}
	switch {
	case cfg.Validation < 0:
		valid = nil
	case cfg.Validation > 0 && len(valid) > cfg.Validation:
		valid = valid[:cfg.Validation]
	}
	// A model that fixes its batch runs full batches only: the samples
	// past the last full batch are left out, and counted in the report.
	unused := 0
	if fixed > 1 {
		unused = len(calib)%fixed + len(valid)%fixed
		calib, valid = calib[:len(calib)-len(calib)%fixed], valid[:len(valid)-len(valid)%fixed]
		if len(calib) == 0 {
			return nil, nil, fmt.Errorf("the model fixes its batch dimension at %d, and the %d calibration samples make no full batch", fixed, unused)
		}
	}
	name := strings.TrimSuffix(filepath.Base(cfg.Model), filepath.Ext(cfg.Model))
	bopts := dataset.BatchOptions{Size: batch, Inputs: sig}

	digest := sha256.New()
	task := progress.Start(rn.progress, "calibrate "+name, int64(len(calib)), "samples")
	stats, err := Collect(ctx, m, hashed(dataset.Batches(ctx, src, calib, bopts), digest), CollectOptions{
		Session:  cfg.Session,
		Progress: func(n int) { task.Add(int64(n)) },
	})
	task.Finish(err)
	if err != nil {
		return nil, nil, err
	}
	ranges, err := stats.Ranges(method, cfg.MethodOptions)
	if err != nil {
		return nil, nil, err
	}
	msum := sha256.Sum256(modelBytes)
	ranges.ModelDigest = "sha256:" + hex.EncodeToString(msum[:])
	ranges.DatasetDigest = "sha256:" + hex.EncodeToString(digest.Sum(nil))

	models := []*Quantized{}
	q, err := Quantize(m, ranges, QuantizeOptions{Exclude: cfg.Exclude})
	if err != nil {
		return nil, nil, err
	}
	if len(cfg.Exclude) > 0 {
		base, err := Quantize(m, ranges, QuantizeOptions{})
		if err != nil {
			return nil, nil, err
		}
		models = append(models, base)
	}
	models = append(models, q)
	rep := &Report{
		Model: cfg.Model, ModelDigest: ranges.ModelDigest, Dataset: cfg.Data.Path, DatasetDigest: ranges.DatasetDigest,
		Method: method, Batch: batch, CalibrationSamples: stats.Samples, UnusedSamples: unused, TensorRanges: len(ranges.Tensors),
		Exclude: cfg.Exclude, Quantization: q,
	}
	trt := cfg.TRTVersion
	if trt.IsZero() {
		trt = DefaultTRTVersion
	}
	rep.TRTVersion = trt.Number()
	// Validation also proves that the Q/DQ model loads and runs in ONNX
	// Runtime; without validation samples one calibration batch does that.
	order, what := valid, "validate "
	if len(order) == 0 {
		order, what = calib[:min(len(calib), batch)], "check "
	}
	vtask := progress.Start(rn.progress, what+name, int64(len(order)), "samples")
	accs, err := Evaluate(ctx, m, models, ranges, counted(dataset.Batches(ctx, src, order, bopts), vtask), cfg.Session)
	vtask.Finish(err)
	if err != nil {
		return nil, nil, err
	}
	if len(valid) > 0 {
		rep.ValidationSamples = len(valid)
		rep.Accuracy = accs[len(accs)-1]
		if len(accs) > 1 {
			rep.Baseline = accs[0]
		}
	}
	rep.worst()
	files := map[string]func(string) error{
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
	return rep, files, nil
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
