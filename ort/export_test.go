package ort

import "github.com/kiln-ml/kiln/onnx"

// The tests are in package ort_test, so that they share internal/ortest's
// helpers (which import ort); what they check inside ort is exported here.

// FindLibraryIn is findLibrary, which takes the system directories to search.
var FindLibraryIn = findLibrary

// SystemDirs are the directories FindLibrary searches last.
var SystemDirs = systemDirs

// ErrScalarCustom is the error for rank-0 tensors the binding cannot pass.
var ErrScalarCustom = errScalarCustom

// IsFile and IsDir let the conformance tests find the corpus's test
// directories as the library search finds files.
var IsFile, IsDir = isFile, isDir

// OutShape is what a session knows of one fetched output.
type OutShape = outShape

// ShapeFixed and ShapeVaries are the states of an output a run has shown.
const (
	ShapeFixed  = shapeFixed
	ShapeVaries = shapeVaries
)

// Known returns what s has learnt of its outputs for the shapes of inputs.
func Known(s *Session, inputs map[string]*onnx.Tensor) []OutShape {
	return s.shapes.get(s.shapeKey(inputs))
}

// FixedShape is what a session knows of an output seen as dt with dims.
func FixedShape(dt onnx.DataType, dims ...int64) OutShape {
	return outShape{state: shapeFixed, typ: dt, dims: dims}
}

// State is the state of what is known.
func (o outShape) State() shapeState { return o.state }

// Dims is the shape an output was seen with.
func (o outShape) Dims() []int64 { return o.dims }
