package savedmodel

import (
	"cmp"
	"slices"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// Signature is one SignatureDef of a MetaGraphDef, flattened for printing
// and for choosing a converter's inputs and outputs.
type Signature struct {
	// Key is the signature's name in the map ("serving_default").
	Key string `json:"key"`
	// Method is the method name ("tensorflow/serving/predict").
	Method  string       `json:"method_name"`
	Inputs  []TensorSpec `json:"inputs"`
	Outputs []TensorSpec `json:"outputs"`
	// Def is the SignatureDef itself.
	Def *smpb.SignatureDef `json:"-"`
}

// TensorSpec is one input or output of a signature.
type TensorSpec struct {
	// Key is the argument's name in the signature ("x", "input_1").
	Key string `json:"key"`
	// Name is the graph tensor ("x:0", "serving_default_input_1:0"); a
	// sparse or composite tensor has none.
	Name  string `json:"name"`
	DType string `json:"dtype"`
	// Shape has -1 for an unknown dimension; it is nil when UnknownRank.
	Shape       []int64 `json:"shape"`
	UnknownRank bool    `json:"unknown_rank,omitempty"`
	// Encoding is "coo_sparse" or "composite_tensor" for a tensor that is
	// not a single dense tensor; empty otherwise.
	Encoding string `json:"encoding,omitempty"`
}

// ListSignatures returns mg's signatures sorted by key, each with its inputs
// and outputs sorted by key.
func ListSignatures(mg *smpb.MetaGraphDef) []Signature {
	var out []Signature
	for key, sd := range mg.GetSignatureDef() {
		out = append(out, Signature{
			Key: key, Method: sd.GetMethodName(), Def: sd,
			Inputs: specs(sd.GetInputs()), Outputs: specs(sd.GetOutputs()),
		})
	}
	slices.SortFunc(out, func(a, b Signature) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

func specs(m map[string]*smpb.TensorInfo) []TensorSpec {
	out := []TensorSpec{}
	for key, ti := range m {
		s := TensorSpec{Key: key, Name: ti.GetName(), DType: ti.GetDtype().String()}
		switch {
		case ti.GetCooSparse() != nil:
			s.Encoding = "coo_sparse"
		case ti.GetCompositeTensor() != nil:
			s.Encoding = "composite_tensor"
		}
		s.Shape, s.UnknownRank = Shape(ti.GetTensorShape())
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b TensorSpec) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// Shape returns a TensorShapeProto's dimensions (-1 unknown) and whether
// its rank is unknown. A nil shape is a scalar's.
func Shape(s *smpb.TensorShapeProto) (dims []int64, unknownRank bool) {
	if s.GetUnknownRank() {
		return nil, true
	}
	dims = make([]int64, 0, len(s.GetDim()))
	for _, d := range s.GetDim() {
		dims = append(dims, d.GetSize())
	}
	return dims, false
}
