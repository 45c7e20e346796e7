package calibrate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
)

// RunCached is Run into a directory of cacheDir named for everything that
// decides the result (see cacheKey), reusing that directory when it already
// holds a complete run, as a build cache would: then no work is done and
// rep is nil. Run replaces a directory only when everything succeeded, so a
// ranges.json there means a complete run.
func RunCached(ctx context.Context, cfg Config, cacheDir string, opts ...Option) (dir string, rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return "", nil, fmt.Errorf("calibrating: %w", err)
	}
	key, err := cacheKey(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("calibrating %s: %w", cfg.Model, err)
	}
	dir = filepath.Join(cacheDir, key.Hex()[:16])
	ok, err := exists(filepath.Join(dir, RangesFile))
	if err != nil {
		return "", nil, fmt.Errorf("calibrating %s: %w", cfg.Model, err)
	}
	if ok {
		newRunner(opts).log.Info("using existing calibration", "path", dir, "digest", key)
		return dir, nil, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", nil, fmt.Errorf("calibrating %s: %w", cfg.Model, err)
	}
	rep, err = Run(ctx, cfg, dir, opts...)
	if err != nil {
		return "", nil, err
	}
	return dir, rep, nil
}

// cacheKey digests everything that decides a calibration: the model's
// content (not its path), the dataset's absolute path (gs:// as it is), and
// every other field of cfg with its defaults spelled out, so that leaving a
// field at its zero value and writing out its default share a directory.
// Data.Inputs is left out: Run takes the inputs from the model.
func cacheKey(cfg Config) (manifest.Digest, error) {
	md, _, err := manifest.DigestFile(cfg.Model)
	if err != nil {
		return "", err
	}
	k := cfg.withDefaults()
	k.Model = string(md)
	if !strings.HasPrefix(k.Data.Path, "gs://") {
		if k.Data.Path, err = filepath.Abs(k.Data.Path); err != nil {
			return "", err
		}
	}
	k.Data.Inputs = nil
	if len(k.Exclude) == 0 {
		k.Exclude = nil
	}
	if len(k.Target) == 0 {
		k.Target = nil
	}
	data, err := json.Marshal(k)
	if err != nil {
		return "", fmt.Errorf("keying the calibration: %w", err)
	}
	return manifest.DigestBytes(data), nil
}
