package convert

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/internal/trtexec"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt"
)

// Builder builds TensorRT engines; *trtexec.Tool, which runs NVIDIA's
// trtexec, is the one kiln uses.
type Builder interface {
	// DetectVersion says which TensorRT release the builder drives, before
	// any build: the cache key and the model an fp16 engine is built from
	// depend on it.
	DetectVersion(ctx context.Context) (manifest.TRTVersion, error)
	// Build builds the engine spec describes.
	Build(ctx context.Context, spec trtexec.Spec) (*trtexec.Result, error)
}

var _ Builder = (*trtexec.Tool)(nil)

func (b *builder) trtVersion(ctx context.Context) (manifest.TRTVersion, error) {
	if b.trtV != nil {
		return *b.trtV, nil
	}
	v, err := b.c.builder.DetectVersion(ctx)
	if err != nil {
		return manifest.TRTVersion{}, err
	}
	b.trtV = &v
	return v, nil
}

// planArtifact builds one TensorRT engine, with its build log and layer
// information next to it.
func (b *builder) planArtifact(ctx context.Context, v manifest.Variant) (*artifact, error) {
	ver, err := b.trtVersion(ctx)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.work, v.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	spec, err := b.planSpec(v, dir)
	if err != nil {
		return nil, err
	}
	if t := b.cfg.TRT.Target; t != nil && b.c.gpu != nil {
		if err := t.Check(*b.c.gpu, ver); err != nil {
			return nil, err
		}
	}
	a := &artifact{platform: pbtxt.PlatformTensorRT, status: manifest.StatusOK}
	if err := b.planInput(ctx, &spec, a, v, ver); err != nil {
		return nil, err
	}
	res, err := b.c.builder.Build(ctx, spec)
	if err != nil {
		return nil, err
	}
	b.recordBuild(a, spec, res)
	return a, nil
}

// planSpec is the build of v from the fp32 model with the shared settings.
func (b *builder) planSpec(v manifest.Variant, dir string) (trtexec.Spec, error) {
	_, src, err := b.fp32Model()
	if err != nil {
		return trtexec.Spec{}, err
	}
	t := b.cfg.TRT
	spec := trtexec.Spec{
		ONNX: src, Plan: filepath.Join(dir, "model.plan"), Precision: v.Precision,
		MaxBatch: v.MaxBatch, WorkspaceMiB: t.workspaceMiB(), OptimizationLevel: t.OptimizationLevel,
		TimingCache: b.timing, HardwareCompat: t.HardwareCompat,
		VersionCompatible: t.VersionCompatible, SkipInference: true,
		LayerInfo: filepath.Join(dir, "model.plan.layers.json"), Target: t.Target, Timeout: t.Timeout,
	}
	for _, in := range b.sig.Inputs {
		spec.Inputs = append(spec.Inputs, trtexec.InputShape{Name: in.Name, Dims: in.Shape})
	}
	if spec.MaxBatch == 0 && b.template.MaxBatchSize == 0 {
		if ok, _ := b.sig.Batchable(); ok {
			spec.MaxBatch = pbtxt.DefaultMaxBatchSize
		}
	}
	return spec, nil
}

// planInput chooses the ONNX model trtexec gets, which depends on the
// release: TensorRT 11 is strongly typed, so fp16 engines are built from
// the fp16 rewrite; earlier releases get the fp32 model and --fp16. int8
// uses the Q/DQ model or the calibration cache (Int8Config.Mode), or
// placeholder ranges for perf-only engines.
func (b *builder) planInput(ctx context.Context, spec *trtexec.Spec, a *artifact, v manifest.Variant, ver manifest.TRTVersion) error {
	switch v.Precision {
	case manifest.FP16:
		if ver.Major >= 11 {
			var err error
			if _, spec.ONNX, err = b.fp16Model(ctx); err != nil {
				return err
			}
			spec.ONNXIsFP16 = true
		}
	case manifest.INT8:
		a.calib = b.calibration()
		var qdq, cache string
		if cal := b.cfg.Int8.Calibration; cal != nil {
			qdq, cache = cal.QDQModel, cal.Cache
		}
		mode := b.cfg.Int8.Mode
		switch {
		case qdq != "" && (mode == trtexec.Int8Auto || mode == trtexec.Int8QDQ):
			spec.ONNX, spec.ONNXIsQDQ, spec.Int8Mode = qdq, true, trtexec.Int8QDQ
		case cache != "" && (mode == trtexec.Int8Auto || mode == trtexec.Int8Cache):
			spec.CalibCache, spec.Int8Mode = cache, trtexec.Int8Cache
		case b.cfg.Int8.RandomRanges:
			spec.Int8Mode = trtexec.Int8Random
			a.status = manifest.StatusPerfOnly
			a.note = "perf-only: int8 ranges are trtexec placeholders, not calibrated"
		default:
			return int8Missing(mode, b.cfg.Int8.Calibration)
		}
	}
	return nil
}

// ErrNoCalibrationCache is the reason an implicitly quantized engine
// (int8 mode cache, TensorRT <= 10) is refused with a calibration that
// holds no TensorRT calibration cache: kiln calibrate writes one only when
// asked (calibrate.Config.TRTCache).
var ErrNoCalibrationCache = errors.New("implicit int8 (TensorRT <= 10) needs a TensorRT calibration cache, and the calibration was written without one")

// int8Missing says which calibration file an int8 engine lacks.
func int8Missing(mode trtexec.Int8Mode, cal *manifest.CalibrationOutput) error {
	switch {
	case mode == trtexec.Int8QDQ:
		return errors.New("int8 mode qdq needs a Q/DQ model, and the calibration has none")
	case mode == trtexec.Int8Cache && cal != nil:
		return fmt.Errorf("int8 mode cache: %s holds no calibration.cache: %w", cal.Dir, ErrNoCalibrationCache)
	case mode == trtexec.Int8Cache:
		return errors.New("int8 mode cache needs a calibration cache, and the calibration has none")
	}
	return ErrNoCalibration
}

// recordBuild fills the artifact from a finished build: the plan, the
// files kept next to it and the provenance kiln.json records.
func (b *builder) recordBuild(a *artifact, spec trtexec.Spec, res *trtexec.Result) {
	prov := trtexec.NewProvenance(spec, res)
	a.path = res.PlanPath
	a.extra = map[string]string{}
	for name, p := range map[string]string{"model.plan.log": res.LogPath, "model.plan.layers.json": spec.LayerInfo} {
		if _, err := os.Stat(p); p != "" && err == nil {
			a.extra[name] = p
		}
	}
	a.build = &manifest.Build{
		Tool: "trtexec", ToolVersion: res.Version.String(), Command: prov.Command, TensorRT: res.Version.String(),
		GPU: prov.GPU, ComputeCapability: prov.ComputeCapability, Inputs: []manifest.Digest{b.src},
	}
	if g := b.c.gpu; g != nil {
		a.build.Driver, a.build.CUDA = g.Driver, g.CUDA
		if a.build.GPU == "" {
			a.build.GPU, a.build.ComputeCapability = g.Name, g.ComputeCapability
		}
	}
}
