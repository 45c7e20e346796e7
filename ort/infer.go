package ort

import (
	"slices"

	"github.com/kiln-ml/kiln/onnx"
	ortgo "github.com/yalue/onnxruntime_go"
)

// A session knows an output's shape from its earlier runs (see outputs.go),
// so its first run over new input shapes leaves the outputs to ONNX
// Runtime, which allocates them in its arena; the binding then copies them
// into Go memory. For a model that fetches gigabytes of activations that is
// twice the memory of the outputs, and an arena that keeps the first set
// for the life of the session. With SessionOptions.InferOutputShapes the
// session asks ONNX Runtime, once when it opens, for the shapes it infers
// for every output (which the model itself often does not record: Augment's
// extra outputs carry no shape), and the first run pre-allocates every
// output whose shape follows from them: fixed dimensions, and a free first
// dimension that every input shares (the batch), taken from the inputs.
// Where the guess is wrong ONNX Runtime refuses the buffer and the run is
// repeated as without it (see Session.run).

// inferShapes records ONNX Runtime's view of the outputs of the model in
// data (or at path when data is nil), by output index.
func (s *Session) inferShapes(data []byte, path string) error {
	var outs []ortgo.InputOutputInfo
	var err error
	if data != nil {
		_, outs, err = ortgo.GetInputOutputInfoWithONNXData(data)
	} else {
		_, outs, err = ortgo.GetInputOutputInfo(path)
	}
	if err != nil {
		return err
	}
	s.inferred = make([]outShape, len(s.outputs))
	for _, o := range outs {
		i, ok := s.outIdx[o.Name]
		if !ok || o.OrtValueType != ortgo.ONNXTypeTensor {
			continue
		}
		dt := onnx.DataType(int(o.DataType))
		if !preallocatable(dt) || len(o.Dimensions) == 0 || dt == onnx.Float16 || dt == onnx.BFloat16 || isFloat8(dt) {
			continue
		}
		s.inferred[i] = outShape{state: shapeFixed, typ: dt, dims: slices.Clone([]int64(o.Dimensions))}
	}
	return nil
}

// guessPlan is the plan of a first run over inputs from the inferred
// shapes (see inferShapes), or nil when there are none: an output whose
// dimensions are all fixed but a first one the inputs' batch fills is
// pre-allocated, any other is left to ONNX Runtime.
func (s *Session) guessPlan(inputs map[string]*onnx.Tensor) []outShape {
	if s.inferred == nil {
		return nil
	}
	batch := int64(-1)
	for _, in := range s.inputs {
		t := inputs[in.Name]
		if t == nil || len(t.Dims) == 0 || batch >= 0 && t.Dims[0] != batch {
			batch = -1
			break
		}
		batch = t.Dims[0]
	}
	plan := make([]outShape, len(s.fetches))
	for i, f := range s.fetches {
		g := s.inferred[f.out]
		if g.state != shapeFixed || f.widened || f.input {
			continue
		}
		dims := slices.Clone(g.dims)
		ok := true
		for k, d := range dims {
			switch {
			case d >= 0:
			case k == 0 && batch >= 0:
				dims[k] = batch
			default:
				ok = false
			}
		}
		if ok {
			plan[i] = outShape{state: shapeFixed, typ: g.typ, dims: dims}
		}
	}
	return plan
}

// OutputBytes estimates the memory of the outputs a run over inputs
// fetches, from the shapes ONNX Runtime inferred when the session opened
// (SessionOptions.InferOutputShapes), before anything runs: the outputs a
// first run pre-allocates (see guessPlan), each counted once; outputs whose
// shape does not follow from the inputs count nothing. Without
// InferOutputShapes it is 0.
func (s *Session) OutputBytes(inputs map[string]*onnx.Tensor) int64 {
	total := int64(0)
	for _, p := range s.guessPlan(inputs) {
		if p.state != shapeFixed {
			continue
		}
		if n, err := onnx.NumElements(p.dims); err == nil {
			total += int64(n) * int64(p.typ.Size())
		}
	}
	return total
}
