package savedmodel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// The file names of a SavedModel directory (formats.md §6.1).
const (
	ModelFile     = "saved_model.pb"
	ModelTextFile = "saved_model.pbtxt"
	// VariablesPrefix is the bundle prefix below the model directory:
	// VariablesPrefix+".index" and VariablesPrefix+".data-00000-of-00001".
	VariablesPrefix = "variables/variables"
)

// NoVersion is Model.Version when the opened path itself holds saved_model.pb.
const NoVersion int64 = -1

// DefaultTags is the tag set TensorFlow Serving loads.
const DefaultTags = "serve"

// ErrNoSavedModel is returned by Open when the chosen directory holds no
// saved_model.pb (or saved_model.pbtxt).
var ErrNoSavedModel = errors.New("no saved_model.pb")

// Model is an opened SavedModel.
type Model struct {
	// Dir is the directory holding saved_model.pb: the opened path, or its
	// chosen version subdirectory.
	Dir string
	// Version is the number of the version directory Open chose, or
	// NoVersion when the path itself is the model.
	Version int64
	// Proto is the parsed saved_model.pb.
	Proto *smpb.SavedModel

	fsys  dataset.FS
	files map[string]bool // below Dir, slash-separated
}

// Open reads the SavedModel at path, a local directory or gs://bucket/prefix,
// through fsys (nil means dataset.Local). A path holding saved_model.pb is
// the model; otherwise the path is a model base directory as TensorFlow
// Serving reads it, and the numerically highest version subdirectory
// (00000124 over 00000123) is used. The error wraps ErrNoSavedModel when that
// directory holds no saved_model.pb.
func Open(ctx context.Context, path string, fsys dataset.FS) (*Model, error) {
	if fsys == nil {
		fsys = dataset.Local{}
	}
	names, err := fsys.List(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("listing SavedModel %s: %w", path, err)
	}
	files := map[string]bool{}
	for _, n := range names {
		if r, ok := relName(path, n); ok {
			files[r] = true
		}
	}
	m := &Model{Dir: path, Version: NoVersion, fsys: fsys}
	if !files[ModelFile] && !files[ModelTextFile] {
		v, dir, err := latestVersion(path, files)
		if err != nil {
			return nil, err
		}
		m.Dir, m.Version, files = join(path, dir), v, below(files, dir)
		if !files[ModelFile] && !files[ModelTextFile] {
			return nil, fmt.Errorf("%s (version %d of %s): %w (it holds %s)", m.Dir, v, path, ErrNoSavedModel, listing(files))
		}
	}
	m.files = files
	if m.Proto, err = readModel(ctx, fsys, m.Dir, files[ModelFile]); err != nil {
		return nil, err
	}
	return m, nil
}

// relName returns name relative to dir, slash-separated.
func relName(dir, name string) (string, bool) {
	if isGCS(dir) {
		return strings.CutPrefix(name, strings.TrimSuffix(dir, "/")+"/")
	}
	r, err := filepath.Rel(dir, name)
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return "", false
	}
	return filepath.ToSlash(r), true
}

func isGCS(name string) bool { return strings.HasPrefix(name, "gs://") }

// join appends a slash-separated relative name to dir.
func join(dir, rel string) string {
	if isGCS(dir) {
		return strings.TrimSuffix(dir, "/") + "/" + rel
	}
	return filepath.Join(dir, filepath.FromSlash(rel))
}

// latestVersion picks the highest numeric first-level directory, as
// TensorFlow Serving's default version policy does.
func latestVersion(base string, files map[string]bool) (int64, string, error) {
	best, bestDir := int64(-1), ""
	for f := range files {
		dir, _, ok := strings.Cut(f, "/")
		if !ok {
			continue
		}
		v, err := strconv.ParseInt(dir, 10, 64)
		if err != nil || v < 0 || strings.HasPrefix(dir, "+") {
			continue
		}
		if v > best || (v == best && dir < bestDir) {
			best, bestDir = v, dir
		}
	}
	if best < 0 {
		return 0, "", fmt.Errorf("%s: %w and no numeric version directory (it holds %s)", base, ErrNoSavedModel, listing(files))
	}
	return best, bestDir, nil
}

// below returns the files under dir, relative to it.
func below(files map[string]bool, dir string) map[string]bool {
	out := map[string]bool{}
	for f := range files {
		if r, ok := strings.CutPrefix(f, dir+"/"); ok {
			out[r] = true
		}
	}
	return out
}

// listing names up to eight files for an error message.
func listing(files map[string]bool) string {
	if len(files) == 0 {
		return "no files"
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	if len(names) > 8 {
		return strings.Join(names[:8], ", ") + fmt.Sprintf(" and %d more", len(names)-8)
	}
	return strings.Join(names, ", ")
}

// readModel parses saved_model.pb, or saved_model.pbtxt when binary is false.
func readModel(ctx context.Context, fsys dataset.FS, dir string, binary bool) (*smpb.SavedModel, error) {
	name := join(dir, ModelFile)
	if !binary {
		name = join(dir, ModelTextFile)
	}
	b, err := readAll(ctx, fsys, name)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	sm := &smpb.SavedModel{}
	if binary {
		err = proto.Unmarshal(b, sm)
	} else {
		err = prototext.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, sm)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", name, err)
	}
	if len(sm.GetMetaGraphs()) == 0 {
		return nil, fmt.Errorf("%s holds no MetaGraphDef", name)
	}
	return sm, nil
}

func readAll(ctx context.Context, fsys dataset.FS, name string) ([]byte, error) {
	rc, err := fsys.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// TagSets returns each MetaGraphDef's tags, in file order, each joined with
// commas as saved_model_cli's --tag_set takes them.
func (m *Model) TagSets() []string {
	var out []string
	for _, mg := range m.Proto.GetMetaGraphs() {
		out = append(out, strings.Join(mg.GetMetaInfoDef().GetTags(), ","))
	}
	return out
}

// MetaGraph returns the MetaGraphDef whose tag set is tags, a
// comma-separated set in any order ("serve", "serve,gpu"); "" means
// DefaultTags.
func (m *Model) MetaGraph(tags string) (*smpb.MetaGraphDef, error) {
	if tags == "" {
		tags = DefaultTags
	}
	want := tagSet(tags)
	for _, mg := range m.Proto.GetMetaGraphs() {
		if slices.Equal(tagSet(strings.Join(mg.GetMetaInfoDef().GetTags(), ",")), want) {
			return mg, nil
		}
	}
	return nil, fmt.Errorf("%s: no MetaGraphDef with tags %q (the model has %q)", join(m.Dir, ModelFile), tags, m.TagSets())
}

func tagSet(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Signatures returns the signatures of the MetaGraphDef tagged tags (see
// MetaGraph), sorted by key.
func (m *Model) Signatures(tags string) ([]Signature, error) {
	mg, err := m.MetaGraph(tags)
	if err != nil {
		return nil, err
	}
	return ListSignatures(mg), nil
}

// Bundle opens the model's variables. A model without a variables
// directory (one whose graph holds only constants) has an empty bundle.
func (m *Model) Bundle(ctx context.Context) (*Bundle, error) {
	if !m.files[VariablesPrefix+".index"] {
		return &Bundle{prefix: join(m.Dir, VariablesPrefix), entries: map[string]*entry{}}, nil
	}
	return OpenBundle(ctx, m.fsys, join(m.Dir, VariablesPrefix))
}
