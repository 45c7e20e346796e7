package check

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Feed is one run's inputs: a tensor per model input and the samples they
// hold (one per row of dimension 0 when Batched, else one).
type Feed struct {
	IDs     []string
	Batched bool
	Tensors map[string]*onnx.Tensor
}

// DataKind says where the inputs of a check came from.
type DataKind string

// Kinds of check data. Only real data can judge int8 (see Judgeable).
const (
	DataDataset    DataKind = "dataset"          // samples of a dataset the user gave
	DataValidation DataKind = "validation-split" // the samples a calibration set aside
	DataInputs     DataKind = "inputs"           // tensors given by name (--input)
	DataRandom     DataKind = "random"           // seeded random data from the signature
)

// Data describes the inputs of a check, for every report.
type Data struct {
	Kind    DataKind `json:"kind"`
	Path    string   `json:"path,omitempty"`
	Samples int      `json:"samples"`
	Seed    uint64   `json:"seed,omitempty"`
	// Random lists the inputs filled with random data when others came
	// from files or a dataset.
	Random []string `json:"random_inputs,omitempty"`
}

// Real reports whether the data can judge an int8 model: a dataset or a
// validation split, with no input left random. Random inputs never judge
// int8 accuracy: quantization error depends on the real distribution.
func (d Data) Real() bool {
	return (d.Kind == DataDataset || d.Kind == DataValidation) && len(d.Random) == 0
}

// FeedSpec says how to build the inputs of a check.
type FeedSpec struct {
	// Inputs is the model signature (the reference's inputs).
	Inputs []onnx.ValueInfo
	// Dataset, when set, supplies samples; Indices picks some of them (a
	// recorded validation split; Kind is then DataValidation).
	Dataset *dataset.Spec
	FS      dataset.FS
	Indices []int
	// Named binds inputs to a file (.npy or TensorProto .pb) or to a
	// number for scalar and one-element inputs ("sr=16000"). A named tensor
	// is a whole model input and is the same in every feed.
	Named map[string]string
	// Shapes fixes the dimensions of inputs filled with random data.
	Shapes map[string][]int64
	// Samples is how many samples to use (0: 8 random ones, or up to 32 of
	// a dataset).
	Samples int
	// Batch is the number of samples per feed of a batched model (0: 1).
	Batch int
	Seed  uint64
}

// ShapeError says that random data cannot be made for an input whose
// dimensions are not fixed: the caller should ask for --shape.
type ShapeError struct {
	Input string
	Dims  []onnx.Dim
	// Unranked says the input has no rank at all (a SavedModel input
	// TensorFlow left unranked).
	Unranked bool
}

func (e *ShapeError) Error() string {
	if e.Unranked {
		return fmt.Sprintf("input %q has no known rank (its shape is unknown), so random data cannot be made for it; give its shape (--shape %s=DIMS, e.g. --shape %s=16)", e.Input, e.Input, e.Input)
	}
	return fmt.Sprintf("input %q has dimensions %s that are not fixed; give its shape (--shape %s=...)", e.Input, dimsText(e.Dims), e.Input)
}

// Feeds builds the feeds of spec and says what they are made of.
func Feeds(ctx context.Context, spec FeedSpec) ([]Feed, Data, error) {
	named, err := NamedTensors(spec.Inputs, spec.Named)
	if err != nil {
		return nil, Data{}, err
	}
	batch := max(spec.Batch, 1)
	batched := dataset.Batched(spec.Inputs) && len(named) == 0
	if !batched {
		batch = 1
	}
	if spec.Dataset != nil {
		return datasetFeeds(ctx, spec, named, batch)
	}
	n := spec.Samples
	if n <= 0 {
		n = 8
	}
	var rnd []string
	for _, in := range spec.Inputs {
		if named[in.Name] == nil {
			rnd = append(rnd, in.Name)
		}
	}
	data := Data{Kind: DataRandom, Samples: n, Seed: spec.Seed, Random: rnd}
	if len(rnd) < len(spec.Inputs) {
		data.Kind = DataInputs
		data.Random = rnd
	}
	var feeds []Feed
	for first := 0; first < n; first += batch {
		b := min(batch, n-first)
		f := Feed{Batched: batched, Tensors: map[string]*onnx.Tensor{}}
		for i := range b {
			f.IDs = append(f.IDs, fmt.Sprintf("random#%d", first+i))
		}
		if len(rnd) == 0 {
			f.IDs = []string{"inputs"}
		}
		for _, in := range spec.Inputs {
			if t := named[in.Name]; t != nil {
				f.Tensors[in.Name] = t
				continue
			}
			t, err := randomTensor(in, spec.Shapes[in.Name], b, batched, spec.Seed+uint64(first))
			if err != nil {
				return nil, Data{}, err
			}
			f.Tensors[in.Name] = t
		}
		feeds = append(feeds, f)
		if len(rnd) == 0 {
			break // the same named tensors every time: one feed says it all
		}
	}
	return feeds, data, nil
}

// datasetFeeds reads samples of spec.Dataset into feeds of batch samples.
func datasetFeeds(ctx context.Context, spec FeedSpec, named map[string]*onnx.Tensor, batch int) ([]Feed, Data, error) {
	ds := *spec.Dataset
	var sig []onnx.ValueInfo
	for _, in := range spec.Inputs {
		if named[in.Name] == nil {
			sig = append(sig, in)
		}
	}
	ds.Inputs = sig
	src, err := dataset.Open(ctx, ds, spec.FS)
	if err != nil {
		return nil, Data{}, err
	}
	data := Data{Kind: DataDataset, Path: ds.Path}
	order := spec.Indices
	if order != nil {
		data.Kind = DataValidation
	} else {
		n := spec.Samples
		if n <= 0 {
			n = 32
		}
		order = dataset.Select(min(n, src.Len()), src.Len(), int64(spec.Seed))
	}
	if spec.Samples > 0 && len(order) > spec.Samples {
		order = order[:spec.Samples]
	}
	var feeds []Feed
	for b, err := range dataset.Batches(ctx, src, order, dataset.BatchOptions{Size: batch, Inputs: sig}) {
		if err != nil {
			return nil, Data{}, err
		}
		f := Feed{IDs: b.IDs, Batched: dataset.Batched(spec.Inputs) && len(named) == 0, Tensors: b.Tensors}
		for name, t := range named {
			f.Tensors[name] = t
		}
		feeds = append(feeds, f)
		data.Samples += len(b.IDs)
	}
	if data.Samples == 0 {
		return nil, Data{}, fmt.Errorf("dataset %s: %w", ds.Path, dataset.ErrNoSamples)
	}
	return feeds, data, nil
}

// NamedTensors reads the tensors bound by name (a .npy or TensorProto .pb
// file, or a number for an input of one element), checking each name
// against the signature: what --input feeds and --fix folds.
func NamedTensors(sig []onnx.ValueInfo, named map[string]string) (map[string]*onnx.Tensor, error) {
	out := map[string]*onnx.Tensor{}
	for _, name := range slices.Sorted(maps.Keys(named)) {
		i := slices.IndexFunc(sig, func(v onnx.ValueInfo) bool { return v.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("the model has no input %q (inputs: %s)", name, names(sig))
		}
		t, err := loadTensor(sig[i], named[name])
		if err != nil {
			return nil, fmt.Errorf("input %s=%s: %w", name, named[name], err)
		}
		out[name] = t
	}
	return out, nil
}

// loadTensor reads one named input: a .npy or .pb file, or a number.
func loadTensor(in onnx.ValueInfo, value string) (*onnx.Tensor, error) {
	switch strings.ToLower(filepath.Ext(value)) {
	case ".npy":
		f, err := os.Open(value)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		t, err := dataset.ReadNpy(f, in.Name)
		if err != nil {
			return nil, err
		}
		return t, nil
	case ".pb":
		b, err := os.ReadFile(value)
		if err != nil {
			return nil, err
		}
		var p onnxpb.TensorProto
		if err := proto.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("not a TensorProto: %w", err)
		}
		t, err := onnx.Decode(&p)
		if err != nil {
			return nil, err
		}
		t.Name = in.Name
		return t, nil
	}
	return scalarTensor(in, value)
}

// scalarTensor makes a tensor of the input's type holding one number, with
// the input's rank (all dimensions 1).
func scalarTensor(in onnx.ValueInfo, value string) (*onnx.Tensor, error) {
	f, err := strconv.ParseFloat(value, 64)
	if err != nil {
		return nil, errors.New("not a .npy or .pb file, nor a number")
	}
	dims := make([]int64, len(in.Shape.Dims))
	for i, d := range in.Shape.Dims {
		if !d.Fixed() || d.Value > 1 {
			return nil, fmt.Errorf("input %q has shape %s; a number fills only inputs with one element", in.Name, dimsText(in.Shape.Dims))
		}
		dims[i] = 1
	}
	t, err := onnx.NewTensor(in.Name, dims, []float64{f})
	if err != nil {
		return nil, err
	}
	return convertTo(t, in.Type)
}

// randomTensor fills one input with seeded random data: floats uniform in
// [0,1), integers and booleans zero (a safe index), of the given shape or
// the signature's with the batch dimension set to batch. A -1 in the
// given shape takes the signature's size there.
func randomTensor(in onnx.ValueInfo, shape []int64, batch int, batched bool, seed uint64) (*onnx.Tensor, error) {
	if !in.Shape.Ranked && (shape == nil || slices.Contains(shape, -1)) {
		return nil, &ShapeError{Input: in.Name, Unranked: true}
	}
	if shape != nil && !slices.Contains(shape, -1) {
		return onnx.Random(in.Name, in.Type, shape, seed)
	}
	model := in.Shape.Dims
	if shape != nil && len(shape) != len(model) {
		return nil, fmt.Errorf("input %q has shape %s; --shape %s=%s has %d dimensions", in.Name, dimsText(model), in.Name, FormatDims(shape), len(shape))
	}
	dims := make([]int64, len(model))
	for i, d := range model {
		switch {
		case shape != nil && shape[i] >= 0:
			dims[i] = shape[i]
		case i == 0 && batched:
			dims[i] = int64(batch)
		case d.Fixed():
			dims[i] = d.Value
		default:
			return nil, &ShapeError{Input: in.Name, Dims: model}
		}
	}
	return onnx.Random(in.Name, in.Type, dims, seed)
}

// names lists the input names of sig for messages.
func names(sig []onnx.ValueInfo) string {
	out := make([]string, len(sig))
	for i, v := range sig {
		out[i] = v.Name
	}
	return strings.Join(out, ", ")
}

// dimsText prints dimensions as [?,3,640,640].
func dimsText(dims []onnx.Dim) string {
	return onnx.Shape{Dims: dims, Ranked: true}.String()
}

// convertTo converts a float64 tensor to another numeric element type.
func convertTo(t *onnx.Tensor, to onnx.DataType) (*onnx.Tensor, error) {
	src := t.Data.([]float64)
	var data any
	switch to {
	case onnx.Double:
		data = src
	case onnx.Float:
		data = cast(src, func(v float64) float32 { return float32(v) })
	case onnx.Float16:
		data = cast(src, func(v float64) float16.Float16 { return float16.Fromfloat32(float32(v)) })
	case onnx.BFloat16:
		data = cast(src, func(v float64) onnx.BF16 { return onnx.BF16From(float32(v)) })
	case onnx.Int8:
		data = cast(src, func(v float64) int8 { return int8(v) })
	case onnx.Int16:
		data = cast(src, func(v float64) int16 { return int16(v) })
	case onnx.Int32:
		data = cast(src, func(v float64) int32 { return int32(v) })
	case onnx.Int64:
		data = cast(src, func(v float64) int64 { return int64(v) })
	case onnx.Uint8:
		data = cast(src, func(v float64) uint8 { return uint8(v) })
	case onnx.Uint16:
		data = cast(src, func(v float64) uint16 { return uint16(v) })
	case onnx.Uint32:
		data = cast(src, func(v float64) uint32 { return uint32(v) })
	case onnx.Uint64:
		data = cast(src, func(v float64) uint64 { return uint64(v) })
	case onnx.Bool:
		data = cast(src, func(v float64) bool { return v != 0 })
	default:
		return nil, fmt.Errorf("element type %s is not numeric", to)
	}
	return &onnx.Tensor{Name: t.Name, Type: to, Dims: t.Dims, Data: data}, nil
}

func cast[T any](src []float64, f func(float64) T) []T {
	out := make([]T, len(src))
	for i, v := range src {
		out[i] = f(v)
	}
	return out
}
