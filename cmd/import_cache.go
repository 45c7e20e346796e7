package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// importKey is where importedSource records an import of a local
// SavedModel, so that a rerun on unchanged files reuses the ONNX it wrote
// instead of importing again: the digest of every file below the source
// (name, size, content), the import options and kiln's version. The zero
// key (a gs:// source, whose objects would have to be read to be hashed)
// records nothing.
type importKey struct {
	path string // the record, kiln/import/keys/KEY.json in the user cache directory
}

// importEntry is an import's record: the ONNX written and what kiln.json
// keeps of the import.
type importEntry struct {
	ONNX   string           `json:"onnx"`
	Size   int64            `json:"onnx_size"`
	Import *manifest.Import `json:"import"`
}

// importSettings are the settings importedSource imports with
// (savedmodel.ConvertOptions{}): a change to them changes every key.
const importSettings = "tags=serve signature=serving_default"

// newImportKey hashes the SavedModel at source; a gs:// source gets the
// zero key.
func newImportKey(ctx context.Context, fsys dataset.FS, source string) (importKey, error) {
	if strings.HasPrefix(source, "gs://") {
		return importKey{}, nil
	}
	names, err := fsys.List(ctx, source)
	if err != nil {
		return importKey{}, fmt.Errorf("listing SavedModel %s: %w", source, err)
	}
	sort.Strings(names)
	type file struct {
		Name   string          `json:"name"`
		Size   int64           `json:"size"`
		Digest manifest.Digest `json:"digest"`
	}
	files := make([]file, 0, len(names))
	for _, n := range names {
		rc, err := fsys.Open(ctx, n)
		if err != nil {
			return importKey{}, err
		}
		d, size, err := manifest.DigestReader(rc)
		rc.Close()
		if err != nil {
			return importKey{}, fmt.Errorf("hashing %s: %w", n, err)
		}
		rel, _ := filepath.Rel(source, n)
		files = append(files, file{filepath.ToSlash(rel), size, d})
	}
	b, err := json.Marshal(map[string]any{"source": source, "options": importSettings, "tool": version(), "files": files})
	if err != nil {
		return importKey{}, err
	}
	ucd, err := os.UserCacheDir()
	if err != nil {
		return importKey{}, nil // no cache directory: nothing is recorded
	}
	return importKey{filepath.Join(ucd, "kiln", "import", "keys", manifest.DigestBytes(b).Hex()[:32]+".json")}, nil
}

// cached returns the import recorded under k, if the ONNX it names is
// still there with its size.
func (k importKey) cached() (string, *manifest.Import, bool) {
	if k.path == "" {
		return "", nil, false
	}
	b, err := os.ReadFile(k.path)
	if err != nil {
		return "", nil, false
	}
	var e importEntry
	if json.Unmarshal(b, &e) != nil || e.Import == nil {
		return "", nil, false // an unreadable record imports again
	}
	if st, err := os.Stat(e.ONNX); err != nil || st.Size() != e.Size {
		return "", nil, false
	}
	return e.ONNX, e.Import, true
}

// save records the import of onnx under k.
func (k importKey) save(onnx string, rec *manifest.Import) error {
	if k.path == "" {
		return nil
	}
	st, err := os.Stat(onnx)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(importEntry{ONNX: onnx, Size: st.Size(), Import: rec}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(k.path), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(k.path, append(b, '\n'), 0o644)
}

// cachedImport returns the ONNX an earlier import of the local SavedModel
// source wrote, when its files are unchanged.
func cachedImport(ctx context.Context, source string) (string, *manifest.Import, bool, error) {
	fsys, done, err := dataFS(ctx, source)
	if err != nil {
		return "", nil, false, err
	}
	defer done()
	key, err := newImportKey(ctx, fsys, source)
	if err != nil {
		return "", nil, false, err
	}
	out, rec, ok := key.cached()
	return out, rec, ok, nil
}
