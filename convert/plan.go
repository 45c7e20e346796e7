package convert

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt"
)

// versionDetector is implemented by builders that can say which TensorRT
// they drive before building (Trtexec does, from trtexec's banner).
type versionDetector interface {
	DetectVersion(ctx context.Context) (manifest.TRTVersion, error)
}

func (b *builder) trtVersion(ctx context.Context) (manifest.TRTVersion, error) {
	if b.trtV != nil {
		return *b.trtV, nil
	}
	d, ok := b.o.Builder.(versionDetector)
	if !ok {
		return manifest.TRTVersion{}, nil
	}
	v, err := d.DetectVersion(ctx)
	if err != nil {
		return manifest.TRTVersion{}, err
	}
	b.trtV = &v
	return v, nil
}

// planArtifact builds one TensorRT engine. The ONNX model handed to trtexec
// depends on the release: TensorRT 11 is strongly typed, so fp16 engines are
// built from the fp16 rewrite; earlier releases get the fp32 model and
// --fp16. int8 uses the Q/DQ model or the calibration cache (Int8Inputs.Mode).
func (b *builder) planArtifact(ctx context.Context, v manifest.Variant, model string) (*artifact, error) {
	ver, err := b.trtVersion(ctx)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.work, v.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	_, src, err := b.fp32Model()
	if err != nil {
		return nil, err
	}
	spec := BuildSpec{
		ONNX: src, Plan: filepath.Join(dir, "model.plan"), Precision: Precision(v.Precision),
		MaxBatch: v.MaxBatch, WorkspaceMiB: b.o.TRT.WorkspaceMiB, OptimizationLevel: b.o.TRT.OptimizationLevel,
		TimingCache: b.o.TRT.TimingCache, HardwareCompat: b.o.TRT.HardwareCompat,
		VersionCompatible: b.o.TRT.VersionCompatible, SkipInference: true,
		LayerInfo: filepath.Join(dir, "model.plan.layers.json"), Target: b.o.TRT.Target,
	}
	if b.o.TRT.Target != nil && b.o.GPU != nil {
		if err := b.o.TRT.Target.Check(*b.o.GPU, ver); err != nil {
			return nil, err
		}
	}
	for _, in := range b.sig.Inputs {
		spec.Inputs = append(spec.Inputs, InputShape{Name: in.Name, Dims: in.Shape})
	}
	if spec.MaxBatch == 0 && b.o.Config.MaxBatchSize == 0 {
		if ok, _ := b.sig.Batchable(); ok {
			spec.MaxBatch = pbtxt.DefaultMaxBatchSize
		}
	}
	a := &artifact{platform: pbtxt.PlatformTensorRT, status: manifest.StatusOK}
	switch v.Precision {
	case manifest.FP16:
		if ver.Major >= 11 {
			if _, spec.ONNX, err = b.fp16Model(); err != nil {
				return nil, err
			}
			spec.ONNXIsFP16 = true
		}
	case manifest.INT8:
		a.calib = b.calibration()
		mode := b.o.Int8.Mode
		switch {
		case b.o.Int8.QDQModel != "" && (mode == Int8Auto || mode == Int8QDQ):
			spec.ONNX, spec.ONNXIsQDQ, spec.Int8Mode = b.o.Int8.QDQModel, true, Int8QDQ
		case b.o.Int8.Cache != "" && (mode == Int8Auto || mode == Int8Cache):
			spec.CalibCache, spec.Int8Mode = b.o.Int8.Cache, Int8Cache
		case b.o.Int8.RandomRanges:
			spec.Int8Mode = Int8Random
			a.status = manifest.StatusPerfOnly
			a.note = "perf-only: int8 ranges are trtexec placeholders, not calibrated"
		default:
			return nil, fmt.Errorf("int8 mode %q needs the matching file from `kiln calibrate` (model.int8.onnx for qdq, calibration.cache for cache)", mode)
		}
	}
	res, err := b.o.Builder.Build(ctx, spec)
	if err != nil {
		return nil, err
	}
	prov := NewProvenance(spec, res)
	a.path = res.PlanPath
	// The build log and layer information stay next to the plan.
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
	if b.o.GPU != nil {
		a.build.Driver, a.build.CUDA = b.o.GPU.Driver, b.o.GPU.CUDA
		if a.build.GPU == "" {
			a.build.GPU, a.build.ComputeCapability = b.o.GPU.Name, b.o.GPU.ComputeCapability
		}
	}
	return a, nil
}
