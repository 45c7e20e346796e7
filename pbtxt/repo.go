package pbtxt

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// Model is one model directory of a repository as Triton would see it.
type Model struct {
	Name string // directory name, which is the model name
	Dir  string
	// Config is the parsed config.pbtxt; an empty config when the file is
	// missing (Triton then auto-completes one) or unreadable (see ConfigErr).
	Config    *configpb.ModelConfig
	HasConfig bool
	ConfigErr error
	// Versions are the version directories Triton recognises, ascending;
	// Loaded are the ones its version policy selects.
	Versions []int64
	Loaded   []int64
	// Ignored are subdirectories Triton skips, with the reason.
	Ignored map[string]string
	// Files lists the entries of each version directory.
	Files map[int64][]string
}

// Repository is a Triton model repository: one directory per model.
type Repository struct {
	Dir    string
	Models []*Model // sorted by name
}

// Model returns the model with the given name, or nil.
func (r *Repository) Model(name string) *Model {
	for _, m := range r.Models {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// reserved are model subdirectories with a meaning other than a version.
var reserved = map[string]string{
	"configs":       "custom configurations",
	"warmup":        "warmup data",
	"initial_state": "initial sequence state",
}

// ReadRepository reads every model directory of a repository without
// changing anything. Hidden directories (kiln's temporary ones among them)
// are skipped, except that a model directory an interrupted WriteModel left
// moved aside is read in place of the missing one.
func ReadRepository(dir string) (*Repository, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading model repository: %w", err)
	}
	present := map[string]bool{}
	for _, e := range entries {
		present[e.Name()] = true
	}
	r := &Repository{Dir: dir}
	for _, e := range entries {
		name := e.Name()
		if model, ok := atomicfile.MovedAside(name); ok && !present[model] {
			name = model
		} else if strings.HasPrefix(name, ".") {
			continue
		}
		if !isDir(filepath.Join(dir, e.Name()), e) {
			continue
		}
		m, err := ReadModel(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		m.Name = name
		r.Models = append(r.Models, m)
	}
	sort.Slice(r.Models, func(i, j int) bool { return r.Models[i].Name < r.Models[j].Name })
	return r, nil
}

func isDir(path string, e fs.DirEntry) bool {
	if e.IsDir() {
		return true
	}
	if e.Type()&fs.ModeSymlink != 0 {
		st, err := os.Stat(path)
		return err == nil && st.IsDir()
	}
	return false
}

// ReadModel reads one model directory: its config, version directories and
// the files in them. A config with a syntax error is reported in ConfigErr,
// not as an error: the rest of the directory is still read.
func ReadModel(dir string) (*Model, error) {
	m := &Model{Name: filepath.Base(dir), Dir: dir, Config: &configpb.ModelConfig{}, Ignored: map[string]string{}, Files: map[int64][]string{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading model directory: %w", err)
	}
	cfgPath := filepath.Join(dir, ConfigFile)
	if c, err := ParseFile(cfgPath); err == nil {
		m.Config, m.HasConfig = c, true
	} else if !errors.Is(err, fs.ErrNotExist) {
		m.ConfigErr, m.HasConfig = err, true
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isDir(filepath.Join(dir, name), e) {
			continue
		}
		if why, ok := reserved[name]; ok {
			m.Ignored[name] = why
			continue
		}
		v, ok := ParseVersion(name)
		if !ok {
			if name[0] >= '0' && name[0] <= '9' {
				m.Ignored[name] = "version directory names must not have leading zeros"
			} else {
				m.Ignored[name] = "not a version directory (version directories are named 1, 2, ...)"
			}
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("reading version directory: %w", err)
		}
		var names []string
		for _, f := range files {
			names = append(names, f.Name())
		}
		m.Versions = append(m.Versions, v)
		m.Files[v] = names
	}
	sort.Slice(m.Versions, func(i, j int) bool { return m.Versions[i] < m.Versions[j] })
	m.Loaded = VersionsToLoad(m.Config.GetVersionPolicy(), m.Versions)
	return m, nil
}

// WriteSpec is one model to lay out in a repository.
type WriteSpec struct {
	Config *configpb.ModelConfig // its name is the directory name
	// Version is the version directory to write (default 1). Other versions
	// already in the repository are kept.
	Version int64
	// ModelPath is the model file (or directory, for a SavedModel or an ONNX
	// model with external data) to copy into the version directory, under
	// DefaultModelFilename(Config). Empty for an ensemble.
	ModelPath string
	// Labels maps label file names (as in label_filename) to their content.
	Labels map[string][]byte
	// VersionFiles are more files to copy into the version directory next to
	// the model file (name -> source path), such as a TensorRT build log.
	// Triton's backends read only their model file and ignore them.
	VersionFiles map[string]string
}

// WriteModel writes <repo>/<model>/config.pbtxt, <repo>/<model>/<version>/
// <file> and the label files. The new model directory is built next to the
// old one and swapped in with renames, so an interrupted write leaves the
// previous model directory in place (if the interruption fell between the
// two renames, ReadRepository reads the moved-aside copy and the next
// WriteModel puts it back). A repository has one writer at a time.
func WriteModel(repo string, s WriteSpec) error {
	c := s.Config
	if c == nil || c.GetName() == "" {
		return errors.New("writing model: the config must have a name")
	}
	name := c.GetName()
	if name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return fmt.Errorf("writing model: %q is not a usable model directory name", name)
	}
	version := s.Version
	if version == 0 {
		version = 1
	}
	if version < 0 {
		return fmt.Errorf("writing model %s: version %d must be positive", name, version)
	}
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return fmt.Errorf("writing model %s: %w", name, err)
	}
	if _, err := atomicfile.Recover(repo); err != nil {
		return fmt.Errorf("writing model %s: cleaning up an interrupted write: %w", name, err)
	}
	final := filepath.Join(repo, name)
	err := atomicfile.ReplaceDir(final, func(tmp string) error { return fillModel(tmp, final, version, s) })
	if err != nil {
		return fmt.Errorf("writing model %s: %w", name, err)
	}
	return nil
}

// fillModel lays out the new model directory in tmp: the versions of final
// other than version, the config, the labels and the version directory.
func fillModel(tmp, final string, version int64, s WriteSpec) error {
	c := s.Config
	vname := fmt.Sprint(version)
	// Keep the versions that are already there.
	if old, rerr := os.ReadDir(final); rerr == nil {
		for _, e := range old {
			if e.Name() == vname || e.Name() == ConfigFile || s.Labels[e.Name()] != nil {
				continue
			}
			if err := copyTree(filepath.Join(final, e.Name()), filepath.Join(tmp, e.Name())); err != nil {
				return fmt.Errorf("keeping %s: %w", e.Name(), err)
			}
		}
	}
	if err := writeFile(filepath.Join(tmp, ConfigFile), Print(c)); err != nil {
		return err
	}
	for fname, data := range s.Labels {
		if filepath.Base(fname) != fname {
			return fmt.Errorf("label file name %q must not contain '/'", fname)
		}
		if err := writeFile(filepath.Join(tmp, fname), data); err != nil {
			return err
		}
	}
	vdir := filepath.Join(tmp, vname)
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	if s.ModelPath != "" {
		file := DefaultModelFilename(c)
		if file == "" {
			file = filepath.Base(s.ModelPath)
		}
		if err := copyTree(s.ModelPath, filepath.Join(vdir, file)); err != nil {
			return fmt.Errorf("copying %s: %w", s.ModelPath, err)
		}
	}
	for fname, src := range s.VersionFiles {
		if filepath.Base(fname) != fname || fname == DefaultModelFilename(c) {
			return fmt.Errorf("extra file name %q must be a plain name other than the model file", fname)
		}
		if err := copyTree(src, filepath.Join(vdir, fname)); err != nil {
			return fmt.Errorf("copying %s: %w", src, err)
		}
	}
	return nil
}

func writeFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// copyTree copies a file or directory; files are hard-linked when possible
// so that re-laying out large models costs no space or time.
func copyTree(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		if err := os.Link(src, dst); err == nil {
			return nil
		}
		return copyFile(src, dst, st.Mode().Perm())
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm|0o200)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
