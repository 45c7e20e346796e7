package pack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// copyDir writes the tree into dir: into a fresh temporary directory next
// to it, checked against kiln.json, then renamed into dir's place. A
// failure leaves dir as it was. It returns the digest of kiln.json as written.
func copyDir(ctx context.Context, t *tree, dir string) (manifest.Digest, error) {
	var digest manifest.Digest
	err := atomicfile.ReplaceDir(dir, func(tmp string) error {
		for _, e := range t.entries {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := writeEntry(tmp, e); err != nil {
				return err
			}
		}
		if err := verifyFiles(tmp, t.man); err != nil {
			return err
		}
		d, _, err := manifest.DigestFile(filepath.Join(tmp, manifest.FileName))
		digest = d
		return err
	})
	if err != nil {
		return "", fmt.Errorf("copying to dir:%s: %w", dir, err)
	}
	return digest, nil
}

// writeEntry writes one entry of the tree below root.
func writeEntry(root string, e entry) error {
	p := filepath.Join(root, filepath.FromSlash(e.rel))
	if e.dir {
		return os.MkdirAll(p, 0o755)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := e.copyTo(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
