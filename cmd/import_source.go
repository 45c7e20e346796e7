package cmd

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/savedmodel"
)

// isSavedModelSource reports whether a stage's MODEL argument names a
// SavedModel (a directory, or a gs:// prefix) rather than an ONNX file.
func isSavedModelSource(source string) bool {
	if strings.HasPrefix(source, "gs://") {
		return !strings.HasSuffix(source, ".onnx")
	}
	st, err := os.Stat(source)
	return err == nil && st.IsDir()
}

// importedSource returns the ONNX file convert and calibrate read for
// source: source itself for an ONNX file; for a SavedModel (local or
// gs://), its serving_default signature imported as kiln import does, into
// the user cache directory (kiln/import/DIGEST/NAME.onnx, DIGEST that of
// the ONNX bytes), so a rerun finds the same file and kiln.json the same
// source digest. NAME is the SavedModel's directory name (its parent's for
// a TF Serving version directory), which names the repository's models.
// shapes are the command's --shape values: those naming an input the
// signature leaves unranked give it its shape (-1 a dynamic dimension);
// the others only shape random data, leaving the import's dimensions
// dynamic where TensorFlow left them so. A local SavedModel whose files
// and shapes are those of an earlier import is not imported again
// (importKey).
func importedSource(ctx context.Context, source string, shapes map[string][]int64) (string, *manifest.Import, error) {
	if !isSavedModelSource(source) {
		return source, nil, nil
	}
	fsys, done, err := dataFS(ctx, source)
	if err != nil {
		return "", nil, err
	}
	defer done()
	key, err := newImportKey(ctx, fsys, source, shapes)
	if err != nil {
		return "", nil, err
	}
	if out, rec, ok := key.cached(); ok { // the same files, imported before
		return out, rec, nil
	}
	m, err := savedmodel.Open(ctx, source, fsys)
	if err != nil {
		return "", nil, err
	}
	conv, err := savedmodel.Convert(ctx, m, savedmodel.ConvertOptions{Shapes: unrankedShapes(m, shapes)})
	if err != nil {
		return "", nil, fmt.Errorf("importing %s: %w (kiln import converts it on its own, with --signature and --tag)", source, err)
	}
	rec := importRecord(source, m, conv)
	data, err := conv.Model.Marshal()
	if err != nil {
		return "", nil, fmt.Errorf("importing %s: %w", source, err)
	}
	ucd, err := os.UserCacheDir()
	if err != nil {
		return "", nil, fmt.Errorf("importing %s: %w", source, err)
	}
	digest := strings.TrimPrefix(string(manifest.DigestBytes(data)), "sha256:")
	out := filepath.Join(ucd, "kiln", "import", digest[:16], savedModelName(source)+".onnx")
	if _, err := os.Stat(out); err != nil {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return "", nil, err
		}
		if err := atomicfile.WriteFile(out, data, 0o644); err != nil {
			return "", nil, fmt.Errorf("importing %s: %w", source, err)
		}
	}
	return out, rec, key.save(out, rec)
}

// unrankedShapes keeps the shapes given for inputs of the default
// signature that TensorFlow left without a rank.
func unrankedShapes(m *savedmodel.Model, shapes map[string][]int64) map[string][]int64 {
	if len(shapes) == 0 {
		return nil
	}
	mg, err := m.MetaGraph(savedmodel.DefaultTags)
	if err != nil {
		return nil // Convert says why
	}
	out := map[string][]int64{}
	for _, sig := range savedmodel.ListSignatures(mg) {
		if sig.Key != savedmodel.DefaultSignature {
			continue
		}
		for _, in := range sig.Inputs {
			for _, name := range []string{in.Key, savedmodel.Sanitize(in.Key)} {
				if d, ok := shapes[name]; ok && in.UnknownRank {
					out[in.Key] = d
				}
			}
		}
	}
	return out
}

// importRecord is what kiln.json keeps of an import: where from, which
// signature, and its names.
func importRecord(source string, m *savedmodel.Model, conv *savedmodel.Conversion) *manifest.Import {
	rec := &manifest.Import{From: source, Format: "savedmodel", Tags: conv.Tags, Signature: conv.Signature}
	if m.Version >= 0 {
		rec.Version = m.Version
	}
	names := func(ms []savedmodel.NameMapping) []manifest.Name {
		var out []manifest.Name
		for _, n := range ms {
			out = append(out, manifest.Name{Key: n.Key, Tensor: n.Tensor, ONNX: n.ONNX, Shape: n.Shape, UnknownRank: n.UnknownRank, ShapeFrom: n.ShapeFrom})
		}
		return out
	}
	rec.Inputs, rec.Outputs = names(conv.Inputs), names(conv.Outputs)
	return rec
}

// savedModelName is the last element of a SavedModel's path, or its
// parent's when that element is a numeric version directory.
func savedModelName(source string) string {
	p := strings.TrimSuffix(filepath.ToSlash(source), "/")
	base := path.Base(p)
	if strings.Trim(base, "0123456789") == "" {
		base = path.Base(path.Dir(p))
	}
	return manifest.SanitizeName(base)
}
