package pbtxt

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// TensorSig is one input or output of a model file as the model itself
// declares it: the full shape including any batch dimension, -1 for a
// dimension that is not fixed.
type TensorSig struct {
	Name     string            `json:"name"`
	DataType configpb.DataType `json:"data_type"`
	Shape    []int64           `json:"shape"`
	Unranked bool              `json:"unranked,omitempty"` // the rank itself is unknown; Shape is ignored
	Optional bool              `json:"optional,omitempty"` // an input the model can do without
}

// Signature describes a model file's inputs and outputs. kiln reads it from
// ONNX files (SignatureFromONNX); for TensorRT plans kiln's manifest records
// it when the engine is built.
type Signature struct {
	Inputs  []TensorSig `json:"inputs"`
	Outputs []TensorSig `json:"outputs"`
	// Profiles are the optimization profiles of a TensorRT plan, when
	// known (PlanProfiles); nil for other models.
	Profiles []Profile `json:"profiles,omitempty"`
}

// onnxToTriton maps ONNX element types to Triton data types (the ONNX
// Runtime backend's ConvertFromOnnxDataType).
var onnxToTriton = map[onnx.DataType]configpb.DataType{
	onnx.Float:    configpb.DataType_TYPE_FP32,
	onnx.Uint8:    configpb.DataType_TYPE_UINT8,
	onnx.Int8:     configpb.DataType_TYPE_INT8,
	onnx.Uint16:   configpb.DataType_TYPE_UINT16,
	onnx.Int16:    configpb.DataType_TYPE_INT16,
	onnx.Int32:    configpb.DataType_TYPE_INT32,
	onnx.Int64:    configpb.DataType_TYPE_INT64,
	onnx.String:   configpb.DataType_TYPE_STRING,
	onnx.Bool:     configpb.DataType_TYPE_BOOL,
	onnx.Float16:  configpb.DataType_TYPE_FP16,
	onnx.Double:   configpb.DataType_TYPE_FP64,
	onnx.Uint32:   configpb.DataType_TYPE_UINT32,
	onnx.Uint64:   configpb.DataType_TYPE_UINT64,
	onnx.BFloat16: configpb.DataType_TYPE_BF16,
}

// DataTypeOf returns the Triton data type of an ONNX element type, or
// TYPE_INVALID when Triton cannot carry it.
func DataTypeOf(dt onnx.DataType) configpb.DataType { return onnxToTriton[dt] }

// SignatureFromONNX reads the inputs and outputs of an ONNX model. Inputs
// that have an initializer are not listed (onnx.Model.Inputs leaves them
// out), as ONNX Runtime treats them as optional overrides.
func SignatureFromONNX(m *onnx.Model) (Signature, error) {
	var sig Signature
	conv := func(kind string, vs []onnx.ValueInfo) ([]TensorSig, error) {
		out := make([]TensorSig, 0, len(vs))
		for _, v := range vs {
			if v.Kind != "tensor" {
				what := v.Kind
				if what == "" {
					what = "value without a type"
				}
				return nil, fmt.Errorf("%s %q is a %s; Triton serves only tensors", kind, v.Name, what)
			}
			dt := DataTypeOf(v.Type)
			if dt == configpb.DataType_TYPE_INVALID {
				return nil, fmt.Errorf("%s %q has element type %s, which Triton cannot carry", kind, v.Name, v.Type)
			}
			ts := TensorSig{Name: v.Name, DataType: dt, Unranked: !v.Shape.Ranked}
			if v.Shape.Ranked {
				ts.Shape = v.Shape.Static()
			}
			out = append(out, ts)
		}
		return out, nil
	}
	var err error
	if sig.Inputs, err = conv("input", m.Inputs()); err != nil {
		return Signature{}, err
	}
	if sig.Outputs, err = conv("output", m.Outputs()); err != nil {
		return Signature{}, err
	}
	return sig, nil
}

// LoadSignature reads the signature of an ONNX model file.
func LoadSignature(path string) (Signature, error) {
	m, err := onnx.LoadWith(path, onnx.LoadOptions{SkipExternalData: true})
	if err != nil {
		return Signature{}, err
	}
	sig, err := SignatureFromONNX(m)
	if err != nil {
		return Signature{}, fmt.Errorf("reading the signature of %s: %w", path, err)
	}
	return sig, nil
}

// Batchable applies the ONNX Runtime backend's auto-complete rule: a model
// can batch when every input and output has rank >= 1 and a dynamic first
// dimension. The reason names the first tensor that prevents it.
func (s Signature) Batchable() (bool, string) {
	all := append(append([]TensorSig{}, s.Inputs...), s.Outputs...)
	if len(all) == 0 {
		return false, "the model has no inputs or outputs"
	}
	for _, t := range all {
		switch {
		case t.Unranked:
			return false, fmt.Sprintf("%q has no known rank", t.Name)
		case len(t.Shape) == 0:
			return false, fmt.Sprintf("%q is a scalar", t.Name)
		case t.Shape[0] != WildcardDim:
			return false, fmt.Sprintf("%q has shape %s with a fixed first dimension", t.Name, dimsString(t.Shape))
		}
	}
	return true, "every input and output has a dynamic first dimension"
}

// CheckSignature checks a config against the model file's signature, as the
// backend does when it loads the model (ONNX Runtime's ValidateInputs and
// ValidateOutputs, CompareDimsSupported): every listed input and output must
// exist with the same data type and a compatible shape, every required model
// input must be listed, and max_batch_size needs a dynamic first dimension.
// Sequence control inputs and state tensors count as listed, and are checked
// too: a control is an input of shape [1] and of its values' type, a state
// an input and an output of its type and shape. When the signature carries
// the optimization profiles of a TensorRT plan, max_batch_size must be
// within the largest batch they take and every fixed dimension within their
// min..max shapes.
func CheckSignature(c *configpb.ModelConfig, sig Signature) Problems {
	var col collector
	mbs := c.GetMaxBatchSize()
	batchErr := checkBatching(&col, c, sig)
	if n, m := len(c.GetInput()), len(sig.Inputs); n > m {
		col.errorf("input", "configuration expects %d inputs, model provides %d (%s)", n, m, sigNames(sig.Inputs))
	}
	// ONNX Runtime compares only ranked tensors with dims, and takes a
	// scalar model tensor for any dims of ones.
	scalarOK := BackendOf(c) == BackendONNX
	for i, in := range c.GetInput() {
		checkTensor(&col, at("input", i), "input", in.GetName(), in.GetDataType(), in.GetDims(), in.GetReshape(), mbs, sig.Inputs, batchErr, scalarOK)
	}
	for i, out := range c.GetOutput() {
		checkTensor(&col, at("output", i), "output", out.GetName(), out.GetDataType(), out.GetDims(), out.GetReshape(), mbs, sig.Outputs, batchErr, scalarOK)
	}
	checkSequenceSignature(&col, c, sig, batchErr)
	checkMissingInputs(&col, c, sig)
	checkProfiles(&col, c, sig, batchErr)
	return col.ps
}

// checkBatching reports a batching config for a model whose tensors have a
// fixed first dimension (ONNX Runtime's AutoCompleteMaxBatch): the listed
// inputs and outputs, the controls and the states.
func checkBatching(col *collector, c *configpb.ModelConfig, sig Signature) bool {
	if c.GetMaxBatchSize() <= 0 {
		return false
	}
	var fixed []string
	seen := map[string]bool{}
	note := func(name string, ts []TensorSig) {
		for _, t := range ts {
			if t.Name == name && !seen[name] && !t.Unranked && (len(t.Shape) == 0 || t.Shape[0] != WildcardDim) {
				seen[name] = true
				fixed = append(fixed, fmt.Sprintf("%s %s", name, dimsString(t.Shape)))
			}
		}
	}
	for _, in := range c.GetInput() {
		note(in.GetName(), sig.Inputs)
	}
	for _, out := range c.GetOutput() {
		note(out.GetName(), sig.Outputs)
	}
	for _, ci := range c.GetSequenceBatching().GetControlInput() {
		note(ci.GetName(), sig.Inputs)
	}
	for _, st := range c.GetSequenceBatching().GetState() {
		note(st.GetInputName(), sig.Inputs)
		note(st.GetOutputName(), sig.Outputs)
	}
	if len(fixed) == 0 {
		return false
	}
	col.errorf("max_batch_size", "model does not support batching while non-zero max_batch_size is specified: %s %s no dynamic first dimension; set max_batch_size: 0 and list the full shapes in dims, or re-export the model with a dynamic batch axis",
		strings.Join(fixed, ", "), map[bool]string{true: "has", false: "have"}[len(fixed) == 1])
	return true
}

// checkMissingInputs reports required model inputs the config does not
// feed: not listed, not a control, a state or a batch input.
func checkMissingInputs(col *collector, c *configpb.ModelConfig, sig Signature) {
	if len(c.GetInput()) == 0 && len(c.GetSequenceBatching().GetControlInput()) == 0 {
		return
	}
	listed := map[string]bool{}
	for _, in := range c.GetInput() {
		listed[in.GetName()] = true
	}
	for _, ci := range c.GetSequenceBatching().GetControlInput() {
		listed[ci.GetName()] = true
	}
	for _, st := range c.GetSequenceBatching().GetState() {
		listed[st.GetInputName()] = true
	}
	for _, bi := range c.GetBatchInput() {
		for _, tn := range bi.GetTargetName() {
			listed[tn] = true
		}
	}
	for _, t := range sig.Inputs {
		if !listed[t.Name] && !t.Optional {
			col.errorf("input", "model input %q (%s %s) is missing from the config; add it, or Triton cannot feed it", t.Name, t.DataType, shapeString(t))
		}
	}
}

// controlType is the data type a sequence control sends.
func controlType(ctl *configpb.ModelSequenceBatching_Control) configpb.DataType {
	switch {
	case len(ctl.GetInt32FalseTrue()) > 0:
		return configpb.DataType_TYPE_INT32
	case len(ctl.GetFp32FalseTrue()) > 0:
		return configpb.DataType_TYPE_FP32
	case len(ctl.GetBoolFalseTrue()) > 0:
		return configpb.DataType_TYPE_BOOL
	}
	return ctl.GetDataType()
}

func shapeString(t TensorSig) string {
	if t.Unranked {
		return "of unknown rank"
	}
	return dimsString(t.Shape)
}

func sigNames(ts []TensorSig) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func checkTensor(col *collector, p, kind, name string, dt configpb.DataType, dims []int64, reshape *configpb.ModelTensorReshape, mbs int32, sig []TensorSig, batchErr, scalarOK bool) {
	var t *TensorSig
	for i := range sig {
		if sig[i].Name == name {
			t = &sig[i]
		}
	}
	if t == nil {
		col.errorf(p+".name", "unexpected inference %s '%s', allowed %ss are: %s", kind, name, kind, sigNames(sig))
		return
	}
	if dt != configpb.DataType_TYPE_INVALID && dt != t.DataType {
		col.errorf(p+".data_type", "unexpected datatype %s for inference %s '%s', expecting %s", dt, kind, name, t.DataType)
	}
	if t.Unranked || len(dims) == 0 {
		return
	}
	// The backend sees the reshaped tensor when a reshape is given.
	shape, field := dims, ".dims"
	if reshape != nil {
		shape, field = reshape.GetShape(), ".reshape.shape"
	}
	if scalarOK && len(t.Shape) == 0 {
		for _, d := range shape {
			if d != 1 {
				col.errorf(p+field, "scalar tensor '%s' should only provide 1 in the model configuration when the model doesn't support batching; the configuration gives %s", name, dimsString(shape))
				break
			}
		}
		return
	}
	full := shape
	if mbs > 0 {
		if batchErr && (len(t.Shape) == 0 || t.Shape[0] != WildcardDim) {
			return
		}
		full = append([]int64{WildcardDim}, shape...)
	}
	ok := len(full) == len(t.Shape)
	for i := 0; ok && i < len(full); i++ {
		if t.Shape[i] != WildcardDim && t.Shape[i] != full[i] {
			ok = false
		}
	}
	if ok {
		return
	}
	want := t.Shape
	if mbs > 0 && len(want) > 0 {
		want = want[1:]
	}
	if mbs > 0 {
		col.errorf(p+field, "%s '%s': the model expects %d dimensions (shape %s) but the model configuration specifies %d dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making complete shape %s); set %s: %s",
			kind, name, len(t.Shape), dimsString(t.Shape), len(full), dimsString(full), strings.TrimPrefix(field, "."), dimsString(want))
		return
	}
	col.errorf(p+field, "%s '%s': the model expects %d dimensions (shape %s) but the model configuration specifies %d dimensions (shape %s); set %s: %s",
		kind, name, len(t.Shape), dimsString(t.Shape), len(full), dimsString(full), strings.TrimPrefix(field, "."), dimsString(want))
}
