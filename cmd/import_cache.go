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

// newImportKey hashes the SavedModel at source; a gs:// source, or no user
// cache directory, gets the zero key. A file whose size and modification
// time are those recorded when it was last hashed (kiln/import/stats) is
// not read again, as a source's digest is reused (manifest.Source.ModTime).
func newImportKey(ctx context.Context, fsys dataset.FS, source string, shapes map[string][]int64) (importKey, error) {
	ucd, err := os.UserCacheDir()
	if strings.HasPrefix(source, "gs://") || err != nil {
		return importKey{}, nil
	}
	names, err := fsys.List(ctx, source)
	if err != nil {
		return importKey{}, fmt.Errorf("listing SavedModel %s: %w", source, err)
	}
	sort.Strings(names)
	abs, _ := filepath.Abs(source)
	statsPath := filepath.Join(ucd, "kiln", "import", "stats", manifest.DigestBytes([]byte(abs)).Hex()[:32]+".json")
	var prev map[string]importFile
	if b, err := os.ReadFile(statsPath); err == nil {
		_ = json.Unmarshal(b, &prev) // an unreadable record hashes every file again
	}
	files := make([]importFile, 0, len(names))
	stats := map[string]importFile{}
	for _, n := range names {
		rel, _ := filepath.Rel(source, n)
		f, err := hashImportFile(ctx, fsys, n, filepath.ToSlash(rel), prev)
		if err != nil {
			return importKey{}, err
		}
		files, stats[f.Name] = append(files, f), f
	}
	if b, err := json.Marshal(stats); err == nil && os.MkdirAll(filepath.Dir(statsPath), 0o755) == nil {
		_ = atomicfile.WriteFile(statsPath, b, 0o644) // without it the next run hashes again
	}
	for i := range files {
		files[i].ModTime = 0 // the key is the content's, not the times'
	}
	b, err := json.Marshal(map[string]any{"source": source, "options": importSettings, "shapes": shapes, "tool": version(), "files": files})
	if err != nil {
		return importKey{}, err
	}
	return importKey{filepath.Join(ucd, "kiln", "import", "keys", manifest.DigestBytes(b).Hex()[:32]+".json")}, nil
}

// importFile is one file of a SavedModel as its key holds it.
type importFile struct {
	Name    string          `json:"name"`
	Size    int64           `json:"size"`
	ModTime int64           `json:"mod_time_ns,omitempty"`
	Digest  manifest.Digest `json:"digest"`
}

// hashImportFile digests the file n (rel below the source), or takes the
// digest from prev when its size and modification time are unchanged.
func hashImportFile(ctx context.Context, fsys dataset.FS, n, rel string, prev map[string]importFile) (importFile, error) {
	st, err := os.Stat(n)
	if err != nil {
		return importFile{}, err
	}
	f := importFile{Name: rel, Size: st.Size(), ModTime: st.ModTime().UnixNano()}
	if p, ok := prev[rel]; ok && p.Size == f.Size && p.ModTime == f.ModTime && p.Digest.Validate() == nil {
		f.Digest = p.Digest
		return f, nil
	}
	rc, err := fsys.Open(ctx, n)
	if err != nil {
		return importFile{}, err
	}
	defer rc.Close()
	if f.Digest, f.Size, err = manifest.DigestReader(rc); err != nil {
		return importFile{}, fmt.Errorf("hashing %s: %w", n, err)
	}
	return f, nil
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
func cachedImport(ctx context.Context, source string, shapes map[string][]int64) (string, *manifest.Import, bool, error) {
	fsys, done, err := dataFS(ctx, source)
	if err != nil {
		return "", nil, false, err
	}
	defer done()
	key, err := newImportKey(ctx, fsys, source, shapes)
	if err != nil {
		return "", nil, false, err
	}
	out, rec, ok := key.cached()
	return out, rec, ok, nil
}
