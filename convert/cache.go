package convert

import (
	"context"
	"encoding/json"

	"github.com/kiln-ml/kiln/manifest"
)

// cacheKey digests everything a variant's artifact depends on: a rerun
// reuses a variant only when its key is unchanged. The inputs are fixed for
// the run, so each key is computed once.
func (b *builder) cacheKey(ctx context.Context, v manifest.Variant) (manifest.Digest, error) {
	if k, ok := b.keys[v.ID()]; ok {
		return k, nil
	}
	parts := map[string]any{
		"source": b.src, "variant": v.ID(), "tool": b.cfg.ToolVersion, "config": b.template, "labels": b.labels, "external": b.cfg.ExternalOver,
	}
	if n := b.cfg.Normalize; len(n.Fix) > 0 || n.MinOpset > 0 || n.NoFoldBatchNorm {
		parts["normalize"] = n
	}
	if v.Precision == manifest.FP16 {
		parts["fp16"] = b.cfg.FP16
	}
	if v.Precision == manifest.INT8 {
		if cal := b.cfg.Int8.Calibration; cal != nil {
			for k, p := range map[string]string{"qdq": cal.QDQModel, "cache": cal.Cache} {
				if p == "" {
					continue
				}
				d, _, err := manifest.DigestFile(p)
				if err != nil {
					return "", err
				}
				parts[k] = d
			}
		}
		parts["int8"] = []any{b.cfg.Int8.Mode, b.cfg.Int8.RandomRanges}
	}
	if v.Runtime == manifest.RuntimeTRT && b.c.builder != nil {
		ver, err := b.trtVersion(ctx)
		if err != nil {
			return "", err
		}
		parts["tensorrt"] = ver.String()
		parts["trt"] = b.cfg.TRT
		if g := b.c.gpu; g != nil {
			parts["gpu"] = []string{g.Name, g.ComputeCapability}
		}
	}
	data, err := json.Marshal(parts)
	if err != nil {
		return "", err
	}
	key := manifest.DigestBytes(data)
	b.keys[v.ID()] = key
	return key, nil
}
