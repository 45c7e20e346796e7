package pbtxt

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// LintOptions tune repository and file linting.
type LintOptions struct {
	// GPUs is the number of GPUs on the serving machine (0: unknown).
	GPUs int
	// Plans gives the signature of TensorRT plans by model name (kiln's
	// manifest records them when engines are built, with the trtexec
	// command whose shapes give the optimization profiles); plans without
	// one are not checked against their config. LintPath and
	// LintRepository read them from the repository's kiln.json when Plans
	// is nil (see PlanSignatures).
	Plans map[string]Signature
	// DefaultMaxBatchSize is Triton's default-max-batch-size for auto-complete
	// (0 means Triton's default, 4).
	DefaultMaxBatchSize int
	// Progress hears of every model linted (nil: nothing is reported).
	Progress progress.Reporter
}

// LintFile checks one config file on its own (no model files): syntax and
// every rule of Validate. Auto-complete is assumed, as in tritonserver's
// default mode, so partial configs are not errors.
func LintFile(path string, opts LintOptions) (Problems, error) {
	c, err := ParseFile(path)
	if err != nil {
		var se *SyntaxError
		if errors.As(err, &se) {
			return Problems{syntaxProblem(path, se)}, nil
		}
		return nil, err
	}
	dir := ""
	if filepath.Base(path) == ConfigFile {
		dir = filepath.Base(filepath.Dir(filepath.Clean(path)))
	}
	ps := Validate(c, ValidateOptions{DirName: dir, GPUs: opts.GPUs, Autofill: true})
	return ps.WithFile(path), nil
}

func syntaxProblem(path string, se *SyntaxError) Problem {
	return Problem{File: path, Message: fmt.Sprintf("syntax error at line %d, column %d: %s", se.Line, se.Col, se.Msg), Severity: SeverityError}
}

// LintPath lints a config file, a model directory (one holding config.pbtxt
// or version directories) or a whole repository, TensorRT plans against the
// signatures kiln.json records when opts.Plans is nil.
func LintPath(path string, opts LintOptions) (Problems, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("linting: %w", err)
	}
	if opts.Plans == nil {
		if opts.Plans, err = PlanSignatures(path); err != nil {
			return nil, err
		}
	}
	if !st.IsDir() {
		return LintFile(path, opts)
	}
	if isModelDir(path) {
		r, m, err := readWithDeps(path)
		if err != nil {
			return nil, err
		}
		return lintModels(r, []*Model{m}, opts), nil
	}
	return LintRepository(path, opts)
}

// readWithDeps reads one model directory and, when it is an ensemble, the
// sibling directories of the models its steps use (recursively), so that a
// single model can be linted without reading a whole repository.
func readWithDeps(dir string) (*Repository, *Model, error) {
	dir = filepath.Clean(dir)
	m, err := ReadModel(dir)
	if err != nil {
		return nil, nil, err
	}
	r := &Repository{Dir: filepath.Dir(dir), Models: []*Model{m}}
	queue := []*Model{m}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, s := range cur.Config.GetEnsembleScheduling().GetStep() {
			n := s.GetModelName()
			if n == "" || r.Model(n) != nil || strings.ContainsAny(n, `/\`) || n == "." || n == ".." {
				continue
			}
			if st, err := os.Stat(filepath.Join(r.Dir, n)); err != nil || !st.IsDir() {
				continue
			}
			dep, err := ReadModel(filepath.Join(r.Dir, n))
			if err != nil {
				return nil, nil, err
			}
			r.Models = append(r.Models, dep)
			queue = append(queue, dep)
		}
	}
	return r, m, nil
}

// isModelDir reports whether dir looks like one model rather than a
// repository: it has a config.pbtxt or a numeric version directory.
func isModelDir(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, ConfigFile)); err == nil {
		return true
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, ok := ParseVersion(e.Name()); ok && e.IsDir() {
			return true
		}
	}
	return false
}

// LintRepository checks every model of a repository: its config, its
// version directories and model files, the config against the model's
// inputs and outputs (ONNX files are read; plans use opts.Plans, or the
// signatures and optimization profiles the repository's kiln.json records
// when opts.Plans is nil), label, warmup and initial state files, and
// ensembles against the models they use.
func LintRepository(dir string, opts LintOptions) (Problems, error) {
	r, err := ReadRepository(dir)
	if err != nil {
		return nil, err
	}
	if opts.Plans == nil {
		if opts.Plans, err = PlanSignatures(dir); err != nil {
			return nil, err
		}
	}
	if len(r.Models) == 0 {
		return Problems{{File: dir, Message: "the repository holds no model directories", Severity: SeverityError}}, nil
	}
	return lintModels(r, r.Models, opts), nil
}

// lintState is what linting learned about each model: the config as
// Triton would complete it, which the ensemble checks need.
type lintState struct {
	effective map[string]*configpb.ModelConfig
}

func lintModels(r *Repository, targets []*Model, opts LintOptions) Problems {
	st := &lintState{effective: map[string]*configpb.ModelConfig{}}
	perModel := map[string]Problems{}
	task := progress.Start(opts.Progress, "lint "+r.Dir, int64(len(r.Models)), "models")
	for _, m := range r.Models {
		perModel[m.Name] = lintModel(m, st, opts)
		task.Add(1)
	}
	task.Finish(nil)
	var out Problems
	for _, m := range targets {
		ps := perModel[m.Name]
		if c := st.effective[m.Name]; c != nil && isEnsemble(c) && m.ConfigErr == nil {
			ps = append(ps, checkEnsembleRepo(m.Name, r, st)...)
		}
		out = append(out, ps.WithFile(m.Dir)...)
	}
	return out
}

func lintModel(m *Model, st *lintState, opts LintOptions) Problems {
	var col collector
	if m.ConfigErr != nil {
		var se *SyntaxError
		if errors.As(m.ConfigErr, &se) {
			return Problems{syntaxProblem(filepath.Join(m.Dir, ConfigFile), se)}
		}
		col.errorf("", "%v", m.ConfigErr)
		return col.ps
	}
	c := Clone(m.Config)
	var files []string
	for _, v := range m.Loaded {
		files = append(files, m.Files[v]...)
	}
	if !InferBackend(c, m.Name, files) {
		col.errorf("backend", "could not determine backend for model '%s' with no backend in model configuration: no version directory holds a model file kiln recognises (model.onnx, model.plan, model.pt, model.savedmodel, model.graphdef, model.py) and the name is not of the form 'model.<backend_name>'; set backend or platform", m.Name)
	} else if m.Config.GetPlatform() == "" && m.Config.GetBackend() == "" {
		what := "platform: \"" + c.GetPlatform() + "\""
		if c.GetPlatform() == "" {
			what = "backend: \"" + c.GetBackend() + "\""
		}
		col.warnf("platform", "neither platform nor backend is set; Triton infers %s from the model files, so write it in the config", what)
	}
	if !m.HasConfig {
		col.warnf("", "no %s: Triton auto-completes a config for ONNX, TensorRT and TensorFlow models only; write one with `kiln pbtxt gen`", ConfigFile)
	}
	ps := Validate(c, ValidateOptions{DirName: m.Name, GPUs: opts.GPUs, Autofill: true})
	for _, p := range ps {
		if p.Path == "platform" && strings.Contains(p.Message, "neither 'platform' nor 'backend'") {
			continue
		}
		col.ps = append(col.ps, p)
	}
	lintVersions(&col, m, c)
	lintFiles(&col, m, c)
	st.effective[m.Name] = lintSignature(&col, m, c, opts)
	return col.ps
}

func lintVersions(col *collector, m *Model, c *configpb.ModelConfig) {
	names := make([]string, 0, len(m.Ignored))
	for n := range m.Ignored {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, ok := reserved[n]; ok {
			continue
		}
		msg := fmt.Sprintf("directory %q is ignored by Triton: %s", n, m.Ignored[n])
		if t := strings.TrimLeft(n, "0"); strings.HasPrefix(n, "0") && t != "" {
			if _, ok := ParseVersion(t); ok {
				msg += fmt.Sprintf("; rename it to %q", t)
			}
		}
		col.warnf("", "%s", msg)
	}
	switch {
	case len(m.Versions) == 0:
		col.errorf("", "model %q has no version directory, so Triton loads nothing; put the model in %s", m.Name, filepath.Join(m.Dir, "1"))
		return
	case len(m.Loaded) == 0:
		col.errorf("version_policy", "the version policy selects none of the versions present (%s)", versionList(m.Versions))
	}
	have := map[int64]bool{}
	for _, v := range m.Versions {
		have[v] = true
	}
	for i, v := range c.GetVersionPolicy().GetSpecific().GetVersions() {
		if !have[v] {
			col.errorf(at("version_policy.specific.versions", i), "version %d is requested but there is no directory %s", v, filepath.Join(m.Dir, fmt.Sprint(v)))
		}
	}
}

func versionList(vs []int64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ", ")
}

// lintFiles checks the model files of loaded versions, labels and warmup data.
func lintFiles(col *collector, m *Model, c *configpb.ModelConfig) {
	file := DefaultModelFilename(c)
	for _, v := range m.Loaded {
		if isEnsemble(c) {
			continue
		}
		have := map[string]bool{}
		for _, f := range m.Files[v] {
			have[f] = true
		}
		if file != "" && !have[file] {
			hint := "rename the model file"
			if len(m.Files[v]) > 0 {
				hint = fmt.Sprintf("the directory holds %s; rename the model file or set default_model_filename", strings.Join(m.Files[v], ", "))
			}
			col.errorf("default_model_filename", "version %d has no %s, the file Triton loads for %s; %s", v, file, firstNonEmpty(c.GetPlatform(), c.GetBackend()), hint)
		}
		for _, k := range slices.Sorted(maps.Keys(c.GetCcModelFilenames())) {
			if f := c.GetCcModelFilenames()[k]; !have[f] {
				col.errorf(key("cc_model_filenames", k), "version %d has no %s for compute capability %s", v, f, k)
			}
		}
	}
	for i, out := range c.GetOutput() {
		if lf := out.GetLabelFilename(); lf != "" {
			if _, err := os.Stat(filepath.Join(m.Dir, lf)); err != nil {
				col.errorf(at("output", i)+".label_filename", "label file %s does not exist in %s", lf, m.Dir)
			}
		}
	}
	for i, w := range c.GetModelWarmup() {
		for _, n := range sortedWarmup(w) {
			if f := w.GetInputs()[n].GetInputDataFile(); f != "" {
				if _, err := os.Stat(filepath.Join(m.Dir, "warmup", f)); err != nil {
					col.errorf(key(at("model_warmup", i)+".inputs", n)+".input_data_file", "warmup data file %s does not exist in %s", f, filepath.Join(m.Dir, "warmup"))
				}
			}
		}
	}
	for i, s := range c.GetSequenceBatching().GetState() {
		for j, is := range s.GetInitialState() {
			f := is.GetDataFile()
			if f == "" {
				continue
			}
			p := at(at("sequence_batching.state", i)+".initial_state", j) + ".data_file"
			st, err := os.Stat(filepath.Join(m.Dir, "initial_state", f))
			if err != nil {
				col.errorf(p, "initial state file %s does not exist in %s", f, filepath.Join(m.Dir, "initial_state"))
			} else if want := initialStateBytes(is); want >= 0 && st.Size() < want {
				col.errorf(p, "initial_state setting expects %d bytes (%s %s), but the data provided from %s only has %d bytes", want, is.GetDataType(), dimsString(is.GetDims()), f, st.Size())
			}
		}
	}
}

func sortedWarmup(w *configpb.ModelWarmup) []string {
	keys := make([]string, 0, len(w.GetInputs()))
	for k := range w.GetInputs() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// lintSignature checks the config against the model file of the newest
// loaded version and returns the config as Triton would complete it.
func lintSignature(col *collector, m *Model, c *configpb.ModelConfig, opts LintOptions) *configpb.ModelConfig {
	var sig Signature
	var have bool
	switch BackendOf(c) {
	case BackendONNX:
		if len(m.Loaded) == 0 {
			break
		}
		v := m.Loaded[len(m.Loaded)-1]
		p := filepath.Join(m.Dir, fmt.Sprint(v), DefaultModelFilename(c))
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			p = filepath.Join(p, "model.onnx")
		} else if err != nil {
			break
		}
		s, err := LoadSignature(p)
		if err != nil {
			col.errorf("", "version %d: %v", v, err)
			break
		}
		sig, have = s, true
	case BackendTensorRT:
		sig, have = opts.Plans[m.Name]
	}
	if !have {
		return c
	}
	eff := Clone(c)
	if BackendOf(c) == BackendTensorRT {
		planAutofillMaxBatch(eff, sig)
	}
	dmbs := opts.DefaultMaxBatchSize
	if dmbs == 0 {
		dmbs = DefaultMaxBatchSize
	}
	autofillFailed := false
	if len(c.GetInput()) == 0 || len(c.GetOutput()) == 0 {
		if err := Autofill(eff, m.Name, sig, AutofillOptions{DefaultMaxBatchSize: dmbs}); err != nil {
			col.errorf("max_batch_size", "%v", err)
			autofillFailed = true
			eff = Clone(c)
		}
	}
	for _, p := range CheckSignature(eff, sig) {
		if autofillFailed && p.Path == "max_batch_size" {
			continue
		}
		col.ps = append(col.ps, p)
	}
	return eff
}
