package calibrate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// RangesVersion is the version of the ranges file format written by WriteRanges.
const RangesVersion = 1

// Ranges is kiln's ranges file: the calibration result of one model on one
// dataset, from which the TensorRT cache, the ONNX Runtime table and the Q/DQ
// model are derived. It is JSON, with tensors sorted by name so that the same
// calibration always gives the same bytes.
type Ranges struct {
	Version       int             `json:"version"`
	ModelDigest   manifest.Digest `json:"model_digest"`   // of the fp32 ONNX model
	DatasetDigest manifest.Digest `json:"dataset_digest"` // of the calibration samples as they ran
	Method        Method          `json:"method"`         // the method asked for
	Samples       int             `json:"samples"`        // calibration samples run
	Tensors       []TensorRange   `json:"tensors"`
}

// TensorRange is the range of one tensor in a ranges file.
type TensorRange struct {
	Tensor  string  `json:"tensor"`
	Method  Method  `json:"method"`
	Amax    float64 `json:"amax"`
	Scale   float64 `json:"scale"`
	Min     float64 `json:"min"`     // smallest value seen
	Max     float64 `json:"max"`     // largest value seen
	Samples int     `json:"samples"` // samples in which the tensor was seen
	Detail  string  `json:"detail,omitempty"`
}

// NewTensorRange records the range r chosen for tensor from histogram h.
func NewTensorRange(tensor string, samples int, h *Histogram, r Range) TensorRange {
	t := TensorRange{Tensor: tensor, Method: r.Method, Amax: r.Amax, Scale: r.Scale, Samples: samples, Detail: r.Detail}
	if h != nil && h.n > 0 {
		t.Min, t.Max = h.min, h.max
	}
	return t
}

// Validate checks what the writers downstream rely on: a known version and
// method, unique non-empty tensor names, finite values and positive scales.
func (r Ranges) Validate() error {
	if r.Version != RangesVersion {
		return fmt.Errorf("ranges version %d is not supported (want %d)", r.Version, RangesVersion)
	}
	if r.Method != "" && !r.Method.valid() {
		return fmt.Errorf("unknown calibration method %q", string(r.Method))
	}
	if r.Samples < 0 {
		return fmt.Errorf("samples %d is negative", r.Samples)
	}
	seen := make(map[string]bool, len(r.Tensors))
	for i, t := range r.Tensors {
		if t.Tensor == "" {
			return fmt.Errorf("tensor %d has no name", i)
		}
		if seen[t.Tensor] {
			return fmt.Errorf("tensor %q appears twice", t.Tensor)
		}
		seen[t.Tensor] = true
		switch {
		case !t.Method.valid():
			return fmt.Errorf("tensor %q: unknown calibration method %q", t.Tensor, string(t.Method))
		case !finite(t.Amax) || t.Amax <= 0:
			return fmt.Errorf("tensor %q: amax %v is not a positive number", t.Tensor, t.Amax)
		case !finite(t.Scale) || float32(t.Scale) <= 0:
			return fmt.Errorf("tensor %q: scale %v is not a positive float32", t.Tensor, t.Scale)
		case !finite(t.Min) || !finite(t.Max):
			return fmt.Errorf("tensor %q: min %v / max %v are not finite", t.Tensor, t.Min, t.Max)
		case t.Samples < 0:
			return fmt.Errorf("tensor %q: samples %d is negative", t.Tensor, t.Samples)
		}
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Marshal validates r and renders it as indented JSON with the tensors sorted
// by name and a final newline.
func (r Ranges) Marshal() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r.Tensors = append([]TensorRange(nil), r.Tensors...)
	sort.Slice(r.Tensors, func(i, j int) bool { return r.Tensors[i].Tensor < r.Tensors[j].Tensor })
	if r.Tensors == nil {
		r.Tensors = []TensorRange{}
	}
	return indentJSON(r)
}

// ParseRanges parses and validates a ranges file.
func ParseRanges(data []byte) (Ranges, error) {
	var r Ranges
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Ranges{}, err
	}
	if dec.More() {
		return Ranges{}, fmt.Errorf("data after the ranges document")
	}
	if err := r.Validate(); err != nil {
		return Ranges{}, err
	}
	return r, nil
}

// WriteRanges writes a ranges file atomically (temporary file and rename in
// the same directory).
func WriteRanges(path string, r Ranges) error {
	data, err := r.Marshal()
	if err != nil {
		return fmt.Errorf("writing ranges %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing ranges: %w", err)
	}
	return nil
}

// ReadRanges reads and validates a ranges file.
func ReadRanges(path string) (Ranges, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Ranges{}, fmt.Errorf("reading ranges: %w", err)
	}
	r, err := ParseRanges(data)
	if err != nil {
		return Ranges{}, fmt.Errorf("reading ranges %s: %w", path, err)
	}
	return r, nil
}

// Cache is the TensorRT calibration cache for these ranges, for TensorRT
// release v. Scales are rounded to float32.
func (r Ranges) Cache(v manifest.TRTVersion) Cache {
	scales := make(map[string]float32, len(r.Tensors))
	for _, t := range r.Tensors {
		scales[t.Tensor] = float32(t.Scale)
	}
	return NewCache(v, scales)
}

// ORTTable is the tensor -> dynamic range (amax) map that WriteORTTable writes.
func (r Ranges) ORTTable() map[string]float64 {
	m := make(map[string]float64, len(r.Tensors))
	for _, t := range r.Tensors {
		m[t.Tensor] = t.Amax
	}
	return m
}
