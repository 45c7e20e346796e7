// Package manifest is the vocabulary that flows between kiln's stages: the
// source model, the variants built from it, the artifacts (files with
// digests) and the repository manifest kiln.json that records them. It uses
// the standard library only, so every stage can depend on it.
package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// FileName is the manifest's name inside a model repository. Triton ignores it.
const FileName = "kiln.json"

// SchemaVersion is the version of the kiln.json layout written by this code.
const SchemaVersion = 1

// Digest is a content digest written "sha256:<64 hex digits>".
type Digest string

// Hex returns the hex part of the digest.
func (d Digest) Hex() string { return strings.TrimPrefix(string(d), "sha256:") }

// Validate checks the digest's form.
func (d Digest) Validate() error {
	h, ok := strings.CutPrefix(string(d), "sha256:")
	if !ok || len(h) != 64 {
		return fmt.Errorf("digest %q is not sha256:<64 hex digits>", string(d))
	}
	if _, err := hex.DecodeString(h); err != nil {
		return fmt.Errorf("digest %q is not sha256:<64 hex digits>", string(d))
	}
	return nil
}

// NewHash returns the hash a Digest is made with (SHA-256), for content
// that is hashed in pieces; HashDigest turns what it has seen into a Digest.
func NewHash() hash.Hash { return sha256.New() }

// HashDigest returns the digest of everything written to h, a hash from NewHash.
func HashDigest(h hash.Hash) Digest {
	return Digest("sha256:" + hex.EncodeToString(h.Sum(nil)))
}

// DigestBytes hashes b.
func DigestBytes(b []byte) Digest {
	s := sha256.Sum256(b)
	return Digest("sha256:" + hex.EncodeToString(s[:]))
}

// DigestReader hashes everything r yields and returns the digest and byte count.
func DigestReader(r io.Reader) (Digest, int64, error) {
	h := NewHash()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", n, err
	}
	return HashDigest(h), n, nil
}

// DigestFile hashes a file by streaming it.
func DigestFile(path string) (Digest, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	d, n, err := DigestReader(f)
	if err != nil {
		return "", 0, fmt.Errorf("hashing %s: %w", path, err)
	}
	return d, n, nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// ValidateName checks a Triton model name as kiln writes them: lower-case
// letters, digits, '_', '.', '-', starting with a letter or digit, no path
// separators, at most 128 characters.
func ValidateName(name string) error {
	switch {
	case name == "":
		return errors.New("model name is empty")
	case len(name) > 128:
		return fmt.Errorf("model name %q is longer than 128 characters", name)
	case name == "." || name == ".." || !nameRE.MatchString(name):
		return fmt.Errorf("model name %q must use only a-z, 0-9, '_', '.', '-' and start with a letter or digit", name)
	}
	return nil
}

// SanitizeName turns an arbitrary file stem into a valid model name
// ("ResNet-50 v2" -> "resnet-50_v2").
func SanitizeName(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('_')
		}
	}
	out := strings.Trim(b.String(), "_.-")
	if out == "" {
		return "model"
	}
	return out
}

// Source identifies the model a repository was built from.
type Source struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Format string `json:"format"` // "onnx" or "savedmodel"
	Digest Digest `json:"digest"`
	Size   int64  `json:"size"`
	// ModTime is the file's modification time when Digest was computed; a
	// rerun whose source has the same name, size and time reuses Digest
	// instead of hashing the file again (as make and ninja trust mtimes).
	ModTime time.Time `json:"mod_time"`
	// Precision is what the source really computes in: fp32, mixed (fp16
	// storage or fp16 compute between Casts), fp16 or int8.
	Precision string `json:"precision,omitempty"`
	// Normalized lists what kiln's normalizer changed before any variant
	// was made ("turned 38 Constant nodes into initializers").
	Normalized []string `json:"normalized,omitempty"`
	// Imported says where an ONNX source came from when kiln imported it
	// (a SavedModel): Path above is then the imported ONNX file.
	Imported *Import `json:"imported,omitempty"`
}

// Import records a source kiln converted to ONNX itself (kiln import, or
// convert and calibrate given a SavedModel): what it was, which signature,
// and how the signature's names map to the ONNX graph's, which are the
// names Triton's config.pbtxt and clients use.
type Import struct {
	From      string `json:"from"`   // the SavedModel directory or gs:// prefix
	Format    string `json:"format"` // "savedmodel"
	Version   int64  `json:"version,omitempty"`
	Tags      string `json:"tags"`
	Signature string `json:"signature"`
	Inputs    []Name `json:"inputs,omitempty"`
	Outputs   []Name `json:"outputs,omitempty"`
}

// Name maps one signature argument to its ONNX tensor.
type Name struct {
	Key    string `json:"key"`    // the signature's argument ("input_1")
	Tensor string `json:"tensor"` // the graph tensor TensorFlow binds it to ("serving_default_input_1:0")
	ONNX   string `json:"onnx"`   // the ONNX graph input or output
	// Shape is the shape the ONNX graph declares, -1 for a dynamic
	// dimension (nil with UnknownRank); ShapeFrom says where it came from:
	// "signature", "inferred" (from the graph) or "given" (--shape).
	Shape       []int64 `json:"shape,omitempty"`
	UnknownRank bool    `json:"unknown_rank,omitempty"`
	ShapeFrom   string  `json:"shape_from,omitempty"`
}

// File is one file of an artifact, relative to the model directory.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Digest Digest `json:"digest"`
}

// Model is the record of one Triton model in the repository.
type Model struct {
	Name    string  `json:"name"`
	Variant Variant `json:"variant"`
	Source  Digest  `json:"source"`
	Version int64   `json:"version"`
	Files   []File  `json:"files"`
	// Inputs and Outputs are the model's signature as the model file
	// declares it (full shapes, -1 for dynamic); for TensorRT plans this
	// record is the only readable copy.
	Inputs      []Tensor        `json:"inputs,omitempty"`
	Outputs     []Tensor        `json:"outputs,omitempty"`
	Calibration *Calibration    `json:"calibration,omitempty"`
	Build       *Build          `json:"build,omitempty"`
	Checks      json.RawMessage `json:"checks,omitempty"`
	Status      Status          `json:"status"`
	Note        string          `json:"note,omitempty"`
}

// Status is the state of a variant, one word per state, the same in
// kiln.json and in every stage's result.
type Status string

// The states of a variant.
const (
	// StatusOK: built, loaded and recorded.
	StatusOK Status = "ok"
	// StatusPerfOnly: built from placeholder int8 ranges (no calibration);
	// its speed means something, its outputs do not.
	StatusPerfOnly Status = "perf-only"
	// StatusNeedsGPU: needs a GPU or TensorRT that this machine lacks;
	// nothing was written for it.
	StatusNeedsGPU Status = "needs-gpu"
	// StatusFailed: building or checking it failed.
	StatusFailed Status = "failed"
)

// Validate checks that s is one of the states.
func (s Status) Validate() error {
	switch s {
	case StatusOK, StatusPerfOnly, StatusNeedsGPU, StatusFailed:
		return nil
	}
	return fmt.Errorf("status %q is not ok, perf-only, needs-gpu or failed", string(s))
}

// Tensor is one input or output of a model file.
type Tensor struct {
	Name  string  `json:"name"`
	Type  string  `json:"type"` // Triton data type name: TYPE_FP32, TYPE_INT64, ...
	Shape []int64 `json:"shape"`
}

// Calibration records how INT8 ranges were obtained.
type Calibration struct {
	Method        string  `json:"method"`
	Dataset       Digest  `json:"dataset,omitempty"`
	Samples       int     `json:"samples"`
	Top1Agreement float64 `json:"top1_agreement,omitempty"`
	Cosine        float64 `json:"cosine,omitempty"`
	RandomRanges  bool    `json:"random_ranges,omitempty"`
	// Scope is which tensors calibration observed: "qdq" (those the Q/DQ
	// model quantizes) or "all" (every tensor, as the TensorRT calibration
	// cache needs); empty for output written before scopes were recorded.
	Scope string `json:"scope,omitempty"`
	// Target is the accuracy target calibration was held to (calibrate's
	// --accuracy-target), empty when none; a calibration that missed it
	// writes nothing, so a recorded target was met. KeptFP32 names the
	// layers kept in fp32 to meet it and Int8Share the share of the
	// estimated multiply-accumulates still int8.
	Target    string   `json:"target,omitempty"`
	KeptFP32  []string `json:"kept_fp32,omitempty"`
	Int8Share float64  `json:"int8_compute_share,omitempty"`
}

// DataSplit names samples of a dataset by position, so another stage can
// read the same ones: the validation split a calibration set aside.
type DataSplit struct {
	// Path, Format and Preprocess open the dataset as calibrate opened it
	// (Preprocess in dataset.ParsePreprocess's form).
	Path       string `json:"path"`
	Format     string `json:"format,omitempty"`
	Preprocess string `json:"preprocess,omitempty"`
	// Indices are the samples' positions in the dataset's order.
	Indices []int `json:"indices"`
}

// CalibrationOutput is what `kiln calibrate` hands the int8 variants: where
// the files it wrote are, and how they were made. calibrate.ReadOutput reads
// it from calibrate's output directory; convert takes it as it is.
type CalibrationOutput struct {
	// Dir is the directory calibrate wrote.
	Dir string
	// QDQModel is the explicitly quantized ONNX model (model.int8.onnx) and
	// Cache the TensorRT calibration cache (calibration.cache), as paths;
	// each is empty when the directory does not hold it.
	QDQModel, Cache string
	// Model is the digest of the fp32 model that was calibrated.
	Model Digest
	// Calibration is what kiln.json records for every int8 variant made
	// from this output: method, dataset digest, calibration samples and the
	// Q/DQ model's agreement with fp32 (first output).
	Calibration Calibration
	// ValidationSamples is how many samples measured that agreement (0: none).
	ValidationSamples int
	// Validation is the validation split itself (nil when calibrate set
	// none aside, or for output written before splits were recorded).
	Validation *DataSplit
}

// Build records how an artifact was produced.
type Build struct {
	Tool              string        `json:"tool"`
	ToolVersion       string        `json:"tool_version,omitempty"`
	Command           []string      `json:"command,omitempty"`
	TensorRT          string        `json:"tensorrt,omitempty"`
	GPU               string        `json:"gpu,omitempty"`
	ComputeCapability string        `json:"compute_capability,omitempty"`
	Driver            string        `json:"driver,omitempty"`
	CUDA              string        `json:"cuda,omitempty"`
	Inputs            []Digest      `json:"inputs,omitempty"`
	Duration          time.Duration `json:"duration_ns"`
	CacheKey          Digest        `json:"cache_key,omitempty"`
}

// Manifest is kiln.json.
type Manifest struct {
	SchemaVersion int    `json:"schema_version"`
	Tool          string `json:"tool"`
	// Source is the single source record kiln wrote before a repository
	// could hold several; Read moves it into Sources.
	Source *Source `json:"source,omitempty"`
	// Sources are the source models of the repository's models, one per
	// base model name; each Model names its own by digest.
	Sources []*Source `json:"sources,omitempty"`
	Models  []*Model  `json:"models"`
	// Published are the destinations `kiln pack` wrote the repository to,
	// one record per destination, the latest last. What pack publishes
	// leaves them out, so a repository keeps its digest across pushes.
	Published []Publication `json:"published,omitempty"`
}

// SourceNamed returns the source record of the base model name, or nil.
func (m *Manifest) SourceNamed(name string) *Source {
	return named(m.Sources, name, func(s *Source) string { return s.Name })
}

// PutSource adds or replaces the source record of s.Name, keeping Sources
// sorted by name.
func (m *Manifest) PutSource(s *Source) {
	m.Sources = put(m.Sources, s, func(s *Source) string { return s.Name })
}

// named finds the record called name in list, or nil.
func named[T any](list []*T, name string, key func(*T) string) *T {
	for _, r := range list {
		if key(r) == name {
			return r
		}
	}
	return nil
}

// put replaces the record of r's name in list, or adds r keeping the list
// sorted by name.
func put[T any](list []*T, r *T, key func(*T) string) []*T {
	for i, old := range list {
		if key(old) == key(r) {
			list[i] = r
			return list
		}
	}
	list = append(list, r)
	sort.Slice(list, func(i, j int) bool { return key(list[i]) < key(list[j]) })
	return list
}

// New returns an empty manifest written by the given tool version.
func New(tool string) *Manifest {
	return &Manifest{SchemaVersion: SchemaVersion, Tool: tool, Models: []*Model{}}
}

// Model returns the record for name, or nil.
func (m *Manifest) Model(name string) *Model {
	return named(m.Models, name, func(r *Model) string { return r.Name })
}

// Put adds or replaces the record with the same name, keeping records sorted by name.
func (m *Manifest) Put(r *Model) {
	m.Models = put(m.Models, r, func(r *Model) string { return r.Name })
}

// Validate checks names, digests and file paths.
func (m *Manifest) Validate() error {
	if m.SchemaVersion != SchemaVersion {
		return fmt.Errorf("schema_version %d is not supported (this kiln reads %d)", m.SchemaVersion, SchemaVersion)
	}
	for i, p := range m.Published {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("published[%d]: %w", i, err)
		}
	}
	seen := map[string]bool{}
	for i, r := range m.Models {
		if err := ValidateName(r.Name); err != nil {
			return fmt.Errorf("models[%d]: %w", i, err)
		}
		if seen[r.Name] {
			return fmt.Errorf("models[%d]: model %q appears twice", i, r.Name)
		}
		seen[r.Name] = true
		for j, f := range r.Files {
			if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
				return fmt.Errorf("models[%d].files[%d]: path %q escapes the model directory", i, j, f.Path)
			}
			if err := f.Digest.Validate(); err != nil {
				return fmt.Errorf("models[%d].files[%d]: %w", i, j, err)
			}
		}
		if err := r.Status.Validate(); err != nil {
			return fmt.Errorf("models[%d]: %w", i, err)
		}
	}
	return nil
}

// Read loads a manifest from a repository directory or a kiln.json path.
func Read(path string) (*Manifest, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, FileName)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if m.Source != nil {
		if m.SourceNamed(m.Source.Name) == nil {
			m.PutSource(m.Source)
		}
		m.Source = nil
	}
	return m, nil
}

// Marshal validates the manifest and renders it as kiln.json: indented
// JSON with a final newline. Writers put it in the repository last, after
// every file it describes (see DESIGN.md, "The repository and its manifest").
func (m *Manifest) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
