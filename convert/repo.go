package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt"
)

// Int8Inputs are the files `kiln calibrate` wrote (see its -o directory).
type Int8Inputs struct {
	// QDQModel is the explicitly quantized ONNX model (model.int8.onnx).
	QDQModel string
	// Cache is the TensorRT calibration cache (calibration.cache), for
	// implicit int8 builds on TensorRT 8-10.
	Cache string
	// Mode chooses the TensorRT int8 path (Int8Auto: Q/DQ when a Q/DQ model
	// is given, else the cache).
	Mode Int8Mode
	// RandomRanges builds perf-only int8 engines with trtexec's placeholder
	// ranges (no calibration); such variants are marked perf-only everywhere.
	RandomRanges bool
	// Method, Samples and Dataset describe the calibration for the manifest.
	Method  string
	Samples int
	Dataset manifest.Digest
	// Cosine and Top1 are the int8 model's agreement with fp32 on the
	// validation samples (first output), from the calibration report.
	Cosine, Top1 float64
}

// TRTOptions are the engine build settings shared by every plan variant.
type TRTOptions struct {
	WorkspaceMiB      int
	OptimizationLevel *int
	HardwareCompat    string
	VersionCompatible bool
	// TimingCache is shared by all variants of the model; empty means none.
	TimingCache string
	Target      *Target
	Timeout     time.Duration
}

// Options configure a conversion run.
type Options struct {
	// Source is the fp32 ONNX model.
	Source string
	// Repo is the Triton model repository to write.
	Repo string
	// Name is the base model name (default: the source file's stem, sanitized).
	Name     string
	Variants []manifest.Variant
	FP16     FP16Options
	Int8     Int8Inputs
	// Builder builds TensorRT engines; nil means trtexec is not available,
	// and plan variants are reported as needing TensorRT.
	Builder Builder
	// BuilderMissing says why Builder is nil ("trtexec not found").
	BuilderMissing string
	// GPU describes the build machine's GPU for provenance, if known.
	GPU *GPUInfo
	TRT TRTOptions
	// Config is the template for every variant's config.pbtxt; Name,
	// Platform, MaxBatchSize and InstanceCount are set per variant.
	Config pbtxt.GenerateOptions
	// Labels are label files to place next to each config (name -> content).
	Labels map[string][]byte
	// ExternalOver is the weight size above which ONNX variants are written
	// with an external data file (0: 1 GiB; negative: never).
	ExternalOver int64
	// Force rebuilds variants even when the repository already holds them.
	Force bool
	// ToolVersion is kiln's version, part of the cache key.
	ToolVersion string
	Progress    progress.Reporter
	Logger      *slog.Logger
}

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
	Rows   []Row  `json:"variants"`
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

// Run builds every variant into the repository. Each model directory is
// written atomically by pbtxt.WriteModel and kiln.json is written last, so
// an interrupted run leaves complete models and a manifest that describes
// them. A variant whose inputs did not change since the last run is reused
// ("using existing <variant>") unless Force is set.
func Run(ctx context.Context, o Options) (*Result, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	name := o.Name
	if name == "" {
		name = manifest.SanitizeName(stem(o.Source))
	}
	if err := manifest.ValidateName(name); err != nil {
		return nil, fmt.Errorf("model name: %w", err)
	}
	if err := os.MkdirAll(o.Repo, 0o755); err != nil {
		return nil, err
	}
	man, err := manifest.Read(o.Repo)
	if errors.Is(err, os.ErrNotExist) {
		man = manifest.New("kiln " + o.ToolVersion)
	} else if err != nil {
		return nil, err
	}
	man.Tool = "kiln " + o.ToolVersion
	src, err := sourceRecord(o.Source, name, man.Source, o.Force)
	if err != nil {
		return nil, err
	}
	man.Source = src
	srcDigest := src.Digest

	work, err := os.MkdirTemp("", "kiln-convert-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	b := &builder{o: o, log: log, name: name, src: srcDigest, work: work, man: man}
	res := &Result{Repo: o.Repo, Source: o.Source}
	task := progress.Start(o.Progress, "convert "+name, int64(len(o.Variants)), "variants")
	var runErr error
	for _, v := range o.Variants {
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
	// The manifest goes last and describes only complete model directories.
	if err := writeManifest(o.Repo, man); err != nil && runErr == nil {
		runErr = fmt.Errorf("writing %s: %w", manifest.FileName, err)
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

type builder struct {
	o     Options
	log   *slog.Logger
	model *onnx.Model // loaded on first use: a rerun that reuses everything never parses it
	sig   pbtxt.Signature
	name  string
	src   manifest.Digest
	work  string
	man   *manifest.Manifest
	fp32  saved // the source as written for the variants, once made
	fp16  saved // the fp16 rewrite, once made
	trtV  *manifest.TRTVersion
}

func (b *builder) variant(ctx context.Context, v manifest.Variant) Row {
	start := time.Now()
	model := v.ModelName(b.name)
	row := Row{Variant: v, Model: model}
	key, err := b.cacheKey(ctx, v)
	if err != nil {
		return b.fail(row, start, err)
	}
	if rec := b.man.Model(model); rec != nil && !b.o.Force && rec.Build != nil && rec.Build.CacheKey == key && rec.Status != manifest.StatusNeedsGPU {
		if err := verifyFiles(filepath.Join(b.o.Repo, model), rec.Files); err == nil {
			b.log.Info("using existing "+v.ID(), "variant", v.ID(), "path", model)
			row.Status, row.Reused, row.Detail = rec.Status, true, "using existing "+v.ID()
			row.File, row.Size = mainFile(rec)
			row.Duration = time.Since(start)
			return row
		} else {
			b.log.Info("rebuilding "+v.ID(), "variant", v.ID(), "reason", err.Error())
		}
	}
	if v.Runtime == manifest.RuntimeTRT && b.o.Builder == nil {
		why := b.o.BuilderMissing
		if why == "" {
			why = "trtexec not found"
		}
		row.Status, row.Detail = manifest.StatusNeedsGPU, "needs TensorRT ("+why+")"
		b.man.Put(&manifest.Model{Name: model, Variant: v, Source: b.src, Version: 1, Files: []manifest.File{},
			Status: row.Status, Note: row.Detail})
		row.Duration = time.Since(start)
		return row
	}
	if err := b.load(); err != nil {
		return b.fail(row, start, err)
	}
	var art *artifact
	switch v.Runtime {
	case manifest.RuntimeONNX:
		art, err = b.onnxArtifact(v)
	case manifest.RuntimeTRT:
		art, err = b.planArtifact(ctx, v, model)
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

// sourceRecord describes the source file, reusing the digest of the last
// run when the file's name, size and modification time are unchanged.
func sourceRecord(path, name string, last *manifest.Source, force bool) (*manifest.Source, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading source model: %w", err)
	}
	rec := &manifest.Source{Name: name, Path: filepath.Base(path), Format: "onnx", Size: st.Size(), ModTime: st.ModTime().UTC()}
	if !force && last != nil && last.Path == rec.Path && last.Size == rec.Size && last.ModTime.Equal(rec.ModTime) && last.Digest.Validate() == nil {
		rec.Digest = last.Digest
		return rec, nil
	}
	if rec.Digest, rec.Size, err = manifest.DigestFile(path); err != nil {
		return nil, err
	}
	return rec, nil
}

// load reads the source model and its signature once, when a variant needs building.
func (b *builder) load() error {
	if b.model != nil {
		return nil
	}
	m, err := onnx.Load(b.o.Source)
	if err != nil {
		return err
	}
	sig, err := pbtxt.SignatureFromONNX(m)
	if err != nil {
		return fmt.Errorf("reading the signature of %s: %w", b.o.Source, err)
	}
	b.model, b.sig = m, sig
	return nil
}

func (b *builder) fail(row Row, start time.Time, err error) Row {
	row.Status, row.Err = manifest.StatusFailed, fmt.Errorf("variant %s: %w", row.Variant.ID(), err)
	row.Detail = err.Error()
	row.Duration = time.Since(start)
	b.log.Info("variant failed", "variant", row.Variant.ID(), "err", err) // the result table and exit status report it
	return row
}

// artifact is a built model file waiting to be placed in the repository.
type artifact struct {
	path     string
	platform string
	build    *manifest.Build
	calib    *manifest.Calibration
	status   manifest.Status
	note     string
	extra    map[string]string // more files for the version directory
}

func (b *builder) onnxArtifact(v manifest.Variant) (*artifact, error) {
	a := &artifact{platform: pbtxt.PlatformONNX, status: manifest.StatusOK, build: &manifest.Build{Tool: "kiln", ToolVersion: b.o.ToolVersion, Inputs: []manifest.Digest{b.src}}}
	switch v.Precision {
	case manifest.FP32:
		art, _, err := b.fp32Model()
		if err != nil {
			return nil, err
		}
		a.path = art
	case manifest.FP16:
		art, _, err := b.fp16Model()
		if err != nil {
			return nil, err
		}
		a.path = art
	case manifest.INT8:
		if b.o.Int8.QDQModel == "" {
			return nil, errors.New("the ONNX int8 variant is the Q/DQ model from `kiln calibrate`; pass --calib-dir")
		}
		d, _, err := manifest.DigestFile(b.o.Int8.QDQModel)
		if err != nil {
			return nil, err
		}
		a.path = b.o.Int8.QDQModel
		a.build.Inputs = append(a.build.Inputs, d)
		a.calib = b.calibration()
	}
	return a, nil
}

func (b *builder) calibration() *manifest.Calibration {
	i := b.o.Int8
	if i.RandomRanges && i.QDQModel == "" && i.Cache == "" {
		return &manifest.Calibration{Method: "random", RandomRanges: true}
	}
	return &manifest.Calibration{Method: i.Method, Samples: i.Samples, Dataset: i.Dataset, Cosine: i.Cosine, Top1Agreement: i.Top1}
}

// saved is a model written for the variants: art is what goes into the
// version directory (a file, or a directory holding model.onnx and its
// external data), file is the .onnx file itself (what trtexec reads).
type saved struct{ art, file string }

// fp32Model writes the source model once for every variant that needs it.
func (b *builder) fp32Model() (art, file string, err error) {
	if b.fp32.file == "" {
		if b.fp32, err = b.save(b.model, "fp32"); err != nil {
			return "", "", err
		}
	}
	return b.fp32.art, b.fp32.file, nil
}

// fp16Model rewrites the source once and reuses the file for every variant.
func (b *builder) fp16Model() (art, file string, err error) {
	if b.fp16.file != "" {
		return b.fp16.art, b.fp16.file, nil
	}
	out, rep, err := ToFP16(b.model, b.o.FP16)
	if err != nil {
		return "", "", err
	}
	for _, c := range rep.Clamped {
		b.log.Warn("fp16 rewrite clamped values", "tensor", c.Tensor, "clamped", c.Clamped, "flushed", c.Flushed)
	}
	if b.fp16, err = b.save(out, "fp16"); err != nil {
		return "", "", err
	}
	return b.fp16.art, b.fp16.file, nil
}

// save writes a variant's model into the work directory. Models whose
// weights exceed ExternalOver (default 1 GiB; the protobuf limit is 2 GiB)
// are written as a directory holding model.onnx and model.onnx.data, the
// layout Triton's ONNX Runtime backend loads when model.onnx is a directory.
func (b *builder) save(m *onnx.Model, stem string) (saved, error) {
	limit := b.o.ExternalOver
	if limit == 0 {
		limit = 1 << 30
	}
	var total int64
	for _, p := range m.Params() {
		total += p.Bytes
	}
	if limit < 0 || total <= limit {
		p := filepath.Join(b.work, stem+".onnx")
		return saved{p, p}, m.Save(p)
	}
	dir := filepath.Join(b.work, stem)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return saved{}, err
	}
	p := filepath.Join(dir, "model.onnx")
	return saved{dir, p}, m.SaveWith(p, onnx.SaveOptions{ExternalData: "model.onnx.data"})
}

// write places the artifact and its config in the repository and returns its record.
func (b *builder) write(v manifest.Variant, model string, a *artifact) (*manifest.Model, error) {
	opts := b.o.Config
	opts.Name = model
	opts.Platform = a.platform
	opts.MaxBatchSize = v.MaxBatch
	if v.Instances > 1 {
		opts.InstanceCount = v.Instances
	}
	cfg, err := pbtxt.Generate(b.sig, opts)
	if err != nil {
		return nil, err // pbtxt names the model and the field
	}
	if err := pbtxt.WriteModel(b.o.Repo, pbtxt.WriteSpec{Config: cfg, Version: 1, ModelPath: a.path, Labels: b.o.Labels, VersionFiles: a.extra}); err != nil {
		return nil, err
	}
	rec := &manifest.Model{Name: model, Variant: v, Source: b.src, Version: 1, Build: a.build, Calibration: a.calib,
		Status: a.status, Note: a.note, Inputs: tensors(b.sig.Inputs), Outputs: tensors(b.sig.Outputs)}
	files, err := listFiles(filepath.Join(b.o.Repo, model))
	if err != nil {
		return nil, err
	}
	rec.Files = files
	return rec, nil
}

func tensors(ts []pbtxt.TensorSig) []manifest.Tensor {
	out := make([]manifest.Tensor, 0, len(ts))
	for _, t := range ts {
		out = append(out, manifest.Tensor{Name: t.Name, Type: t.DataType.String(), Shape: t.Shape})
	}
	return out
}

// cacheKey digests everything a variant's artifact depends on.
func (b *builder) cacheKey(ctx context.Context, v manifest.Variant) (manifest.Digest, error) {
	parts := map[string]any{
		"source": b.src, "variant": v.ID(), "tool": b.o.ToolVersion, "config": b.o.Config, "labels": b.o.Labels, "external": b.o.ExternalOver,
	}
	if v.Precision == manifest.FP16 {
		parts["fp16"] = b.o.FP16
	}
	if v.Precision == manifest.INT8 {
		for k, p := range map[string]string{"qdq": b.o.Int8.QDQModel, "cache": b.o.Int8.Cache} {
			if p == "" {
				continue
			}
			d, _, err := manifest.DigestFile(p)
			if err != nil {
				return "", err
			}
			parts[k] = d
		}
		parts["int8"] = []any{b.o.Int8.Mode, b.o.Int8.RandomRanges}
	}
	if v.Runtime == manifest.RuntimeTRT && b.o.Builder != nil {
		ver, err := b.trtVersion(ctx)
		if err != nil {
			return "", err
		}
		parts["tensorrt"] = ver.String()
		parts["trt"] = b.o.TRT
		if b.o.GPU != nil {
			parts["gpu"] = []string{b.o.GPU.Name, b.o.GPU.ComputeCapability}
		}
	}
	data, err := json.Marshal(parts)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return manifest.Digest("sha256:" + hex.EncodeToString(sum[:])), nil
}

// listFiles returns every regular file under dir with its digest, sorted.
func listFiles(dir string) ([]manifest.File, error) {
	var files []manifest.File
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		dg, n, err := manifest.DigestFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files = append(files, manifest.File{Path: filepath.ToSlash(rel), Size: n, Digest: dg})
		return nil
	})
	return files, err
}

// verifyFiles checks that the files a record lists are still there and
// unchanged: digests for files under 16 MiB, sizes for larger ones (hashing
// big engines on every rerun would cost as much as copying them).
func verifyFiles(dir string, files []manifest.File) error {
	if len(files) == 0 {
		return errors.New("no files recorded")
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Size() != f.Size {
			return fmt.Errorf("%s changed size", f.Path)
		}
		if f.Size < 16<<20 {
			d, _, err := manifest.DigestFile(p)
			if err != nil {
				return err
			}
			if d != f.Digest {
				return fmt.Errorf("%s changed", f.Path)
			}
		}
	}
	return nil
}

func mainFile(rec *manifest.Model) (string, int64) {
	for _, f := range rec.Files {
		if filepath.Base(f.Path) == "model.onnx" || filepath.Base(f.Path) == "model.plan" {
			return rec.Name + "/" + f.Path, f.Size
		}
	}
	return "", 0
}

func stem(path string) string {
	base := filepath.Base(path)
	return base[:len(base)-len(filepath.Ext(base))]
}

var _ = io.EOF
