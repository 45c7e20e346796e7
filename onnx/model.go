// Package onnx reads, edits and writes ONNX models.
//
// It follows the ONNX IR specification (github.com/onnx/onnx docs/IR.md):
// the wire types are generated from kiln's own schema in onnxpb, and this
// package adds what every stage needs on top: loading with external data,
// atomic saving, graph queries (inputs that are not initializers, producers
// and consumers, topological order, opsets) and a codec between TensorProto
// and Go slices.
package onnx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Model is a loaded ONNX model. Proto may be edited in place; Save writes it back.
type Model struct {
	Proto *onnxpb.ModelProto
	// Path is the file the model was loaded from; empty for models parsed from bytes.
	Path string
}

// LoadOptions controls how a model file is read.
type LoadOptions struct {
	// SkipExternalData leaves tensors whose data is stored in external files
	// untouched instead of reading the files. Decoding such a tensor then
	// returns ErrExternalData.
	SkipExternalData bool
}

// Load reads an ONNX model file and the external data files it refers to.
func Load(path string) (*Model, error) {
	return LoadWith(path, LoadOptions{})
}

// LoadWith reads an ONNX model file with options.
func LoadWith(path string, opts LoadOptions) (*Model, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loading ONNX model: %w", err)
	}
	dir := filepath.Dir(path)
	if opts.SkipExternalData {
		dir = ""
	}
	m, err := parse(data, dir, opts.SkipExternalData)
	if err != nil {
		return nil, fmt.Errorf("loading ONNX model %s: %w", path, err)
	}
	m.Path = path
	return m, nil
}

// Parse decodes a serialized model. External data is resolved relative to
// dir; with dir empty a model that uses external data is refused. Big
// initializer blocks alias data, so data must not be modified afterwards.
func Parse(data []byte, dir string) (*Model, error) {
	return parse(data, dir, false)
}

func parse(data []byte, dir string, skipExternal bool) (*Model, error) {
	if len(data) == 0 {
		return nil, errors.New("file is empty")
	}
	mp, err := unmarshalModel(data)
	if err != nil {
		return nil, fmt.Errorf("not a valid ONNX protobuf (truncated or not a model): %w", err)
	}
	if mp.Graph == nil {
		return nil, errors.New("not an ONNX model: no graph")
	}
	if mp.IrVersion == nil || mp.GetIrVersion() <= 0 {
		return nil, errors.New("not an ONNX model: ir_version is missing")
	}
	m := &Model{Proto: mp}
	if !skipExternal {
		if err := m.resolveExternal(dir); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Marshal serializes the model deterministically.
func (m *Model) Marshal() ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m.Proto)
}

// Save writes the model to path atomically: the bytes go to a temporary file
// in the same directory, which is synced and renamed over path, so a reader
// never sees a half-written model and a failed save leaves the old file.
// External data that was loaded is written inline. Big weights are streamed
// to the file rather than copied into one buffer; Save must not run
// concurrently with other use of the model.
func (m *Model) Save(path string) error {
	if err := saveStream(path, m.Proto); err != nil {
		return fmt.Errorf("saving ONNX model %s: %w", path, err)
	}
	return nil
}

// Tensors calls fn for every TensorProto stored in the model: initializers,
// sparse initializer parts and tensor attributes, in the main graph, in
// subgraphs, in functions and in training graphs.
func (m *Model) Tensors(fn func(t *onnxpb.TensorProto) error) error {
	if err := walkGraphTensors(m.Proto.GetGraph(), fn); err != nil {
		return err
	}
	for _, f := range m.Proto.GetFunctions() {
		for _, n := range f.GetNode() {
			if err := walkNodeTensors(n, fn); err != nil {
				return err
			}
		}
	}
	for _, ti := range m.Proto.GetTrainingInfo() {
		if err := walkGraphTensors(ti.GetInitialization(), fn); err != nil {
			return err
		}
		if err := walkGraphTensors(ti.GetAlgorithm(), fn); err != nil {
			return err
		}
	}
	return nil
}

func walkGraphTensors(g *onnxpb.GraphProto, fn func(*onnxpb.TensorProto) error) error {
	if g == nil {
		return nil
	}
	for _, t := range g.GetInitializer() {
		if err := fn(t); err != nil {
			return err
		}
	}
	for _, s := range g.GetSparseInitializer() {
		if err := walkSparse(s, fn); err != nil {
			return err
		}
	}
	for _, n := range g.GetNode() {
		if err := walkNodeTensors(n, fn); err != nil {
			return err
		}
	}
	return nil
}

func walkSparse(s *onnxpb.SparseTensorProto, fn func(*onnxpb.TensorProto) error) error {
	for _, t := range []*onnxpb.TensorProto{s.GetValues(), s.GetIndices()} {
		if t != nil {
			if err := fn(t); err != nil {
				return err
			}
		}
	}
	return nil
}

func walkNodeTensors(n *onnxpb.NodeProto, fn func(*onnxpb.TensorProto) error) error {
	for _, a := range n.GetAttribute() {
		if a.T != nil {
			if err := fn(a.T); err != nil {
				return err
			}
		}
		for _, t := range a.GetTensors() {
			if err := fn(t); err != nil {
				return err
			}
		}
		if a.SparseTensor != nil {
			if err := walkSparse(a.SparseTensor, fn); err != nil {
				return err
			}
		}
		for _, s := range a.GetSparseTensors() {
			if err := walkSparse(s, fn); err != nil {
				return err
			}
		}
		if err := walkGraphTensors(a.G, fn); err != nil {
			return err
		}
		for _, g := range a.GetGraphs() {
			if err := walkGraphTensors(g, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// HasExternalData reports whether any tensor still refers to an external file.
func (m *Model) HasExternalData() bool {
	found := false
	m.Tensors(func(t *onnxpb.TensorProto) error {
		if t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL && t.RawData == nil {
			found = true
		}
		return nil
	})
	return found
}

// resolveExternal reads every external tensor into raw_data and clears its
// external reference, so the model is self-contained in memory.
func (m *Model) resolveExternal(dir string) error {
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	return m.Tensors(func(t *onnxpb.TensorProto) error {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			return nil
		}
		if dir == "" {
			return fmt.Errorf("tensor %q: data is stored in an external file, which cannot be read when the model is given as bytes", t.GetName())
		}
		ext, err := parseExternal(t)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.GetName(), err)
		}
		full, err := externalPath(dir, ext.location)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.GetName(), err)
		}
		f, ok := files[full]
		if !ok {
			f, err = os.Open(full)
			if err != nil {
				return fmt.Errorf("tensor %q: external data: %w", t.GetName(), err)
			}
			files[full] = f
		}
		st, err := f.Stat()
		if err != nil {
			return err
		}
		length := ext.length
		if length < 0 {
			length = st.Size() - ext.offset
		}
		if ext.offset < 0 || length < 0 || ext.offset+length > st.Size() {
			return fmt.Errorf("tensor %q: external data range offset %d length %d is outside %s (%d bytes)",
				t.GetName(), ext.offset, length, ext.location, st.Size())
		}
		buf := make([]byte, length)
		if _, err := f.ReadAt(buf, ext.offset); err != nil {
			return fmt.Errorf("tensor %q: reading %s: %w", t.GetName(), ext.location, err)
		}
		t.RawData = buf
		t.ExternalData = nil
		t.DataLocation = nil
		return nil
	})
}

type externalRef struct {
	location       string
	offset, length int64
}

func parseExternal(t *onnxpb.TensorProto) (externalRef, error) {
	ref := externalRef{length: -1}
	for _, kv := range t.GetExternalData() {
		switch kv.GetKey() {
		case "location":
			ref.location = kv.GetValue()
		case "offset", "length":
			v, err := strconv.ParseInt(kv.GetValue(), 10, 64)
			if err != nil || v < 0 {
				return ref, fmt.Errorf("external_data %s %q is not a non-negative integer", kv.GetKey(), kv.GetValue())
			}
			if kv.GetKey() == "offset" {
				ref.offset = v
			} else {
				ref.length = v
			}
		}
	}
	if ref.location == "" {
		return ref, errors.New("external_data has no location")
	}
	return ref, nil
}

// externalPath joins a location to the model directory and refuses anything
// that would leave it: absolute paths, "..", and symbolic links that point outside.
func externalPath(dir, location string) (string, error) {
	loc := filepath.FromSlash(location)
	if filepath.IsAbs(loc) || !filepath.IsLocal(loc) || strings.ContainsRune(location, 0) {
		return "", fmt.Errorf("external data location %q escapes the model directory", location)
	}
	full := filepath.Join(dir, loc)
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	realFull, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", fmt.Errorf("external data: %w", err)
	}
	rel, err := filepath.Rel(realDir, realFull)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("external data location %q resolves outside the model directory", location)
	}
	return full, nil
}
