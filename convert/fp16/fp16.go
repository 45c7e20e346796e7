package fp16

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Options configures Convert. The zero value is not what most callers
// want: set KeepIOTypes to true, as kiln's commands do by default, so that
// clients keep sending and receiving float32.
type Options struct {
	// KeepIOTypes keeps the graph inputs and outputs float32: Casts are
	// inserted after the inputs and before the outputs. Callers set it true
	// by default.
	KeepIOTypes bool
	// OpBlockList lists op types kept in float32; nil means
	// DefaultBlockList, an empty non-nil list blocks nothing (the
	// operators that cannot be float16 at all stay float32 regardless).
	OpBlockList []string
	// NodeBlockList lists node names kept in float32.
	NodeBlockList []string
	// Analysis, from Analyze on the same model, adds the nodes it keeps
	// (KeptNode.Node, labels of main-graph nodes) to NodeBlockList. Convert
	// refuses an analysis naming a node the model does not have.
	Analysis *Analysis
	// MinPositive is the smallest magnitude a non-zero value keeps; 0 means
	// 5.96e-08 (the smallest float16 subnormal).
	MinPositive float64
	// MaxFinite is the largest magnitude a finite value keeps; 0 means 65504
	// (the largest finite float16).
	MaxFinite float64
}

// DefaultBlockList is onnxruntime's float16.py DEFAULT_OP_BLOCK_LIST
// (onnxconverter-common's list without Resize, whose scales are kept
// float32 instead, and with TreeEnsemble), followed by the operators ONNX
// Runtime's CPU provider cannot run in float16 even through its own Casts
// (measured with 1.24.1 on ONNX's backend suite): random generators and
// EyeLike, which have no float16 kernel and no float16 input to cast from
// ("Could not find an implementation"; their seeded draws would differ
// anyway), MelWeightMatrix (whose float32 kernel the inserted Casts do not
// match) and MeanVarianceNormalization (whose float16 function body adds a
// float32 epsilon). A nil OpBlockList also applies the node rules of
// defaultNodeRule (ScatterND/ScatterElements reductions).
var DefaultBlockList = []string{
	"ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer",
	"FeatureVectorizer", "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor",
	"Normalizer", "OneHotEncoder", "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler",
	"TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble", "ZipMap",
	"NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum", "Min", "Max", "Upsample",
	// ONNX Runtime CPU gaps.
	"RandomNormal", "RandomUniform", "RandomNormalLike", "Bernoulli", "Multinomial", "EyeLike",
	"MelWeightMatrix", "MeanVarianceNormalization",
}

// Defaults of onnxruntime's float16.py.
const (
	defaultMinPositive = 5.96e-08
	defaultMaxFinite   = 65504
)

// Validate checks the clamping bounds against float16's range.
func (o Options) Validate() error {
	lo, hi := o.bounds()
	if lo < defaultMinPositive || hi > defaultMaxFinite || lo > hi {
		return fmt.Errorf("invalid fp16 options: need %g <= MinPositive (%g) <= MaxFinite (%g) <= %d",
			defaultMinPositive, lo, hi, defaultMaxFinite)
	}
	return nil
}

func (o Options) bounds() (lo, hi float64) {
	lo, hi = o.MinPositive, o.MaxFinite
	if lo == 0 {
		lo = defaultMinPositive
	}
	if hi == 0 {
		hi = defaultMaxFinite
	}
	return lo, hi
}

// Report says what Convert changed.
type Report struct {
	// ConvertedInitializers counts float32 initializers and constant
	// values (Constant, ConstantOfShape) rewritten as float16.
	ConvertedInitializers int
	// KeptInitializers counts float32 ones left float32 because only
	// blocked inputs use them.
	KeptInitializers int
	// CastsInserted counts the Cast nodes the rewrite added, CastsRemoved
	// those removed as redundant afterwards (added or original).
	CastsInserted, CastsRemoved int
	// Clamped lists the tensors with values outside float16's range;
	// each also has a warning.
	Clamped []ClampInfo
	// BlockedNodes names the nodes with float inputs or outputs kept in
	// float32 (unnamed nodes as "Op(output)").
	BlockedNodes []string
	// Warnings are things a user may want to know about the result.
	Warnings []string
}

// ClampInfo counts the values of one tensor moved into float16's range.
type ClampInfo struct {
	Tensor string
	// Clamped values had a magnitude above MaxFinite and became ±MaxFinite.
	Clamped int
	// Flushed values were non-zero with a magnitude below MinPositive and
	// became ±MinPositive.
	Flushed int
	// Largest is the largest magnitude clamped (0 when none was).
	Largest float32
}

// Convert returns a float16 copy of m (see the package documentation) and
// what it changed. m is not modified; float32 initializers kept as they are
// share their data with m.
func Convert(m *onnx.Model, opts Options) (*onnx.Model, *Report, error) {
	name := modelName(m)
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	if why := fp16Evidence(m); why != "" {
		return nil, nil, fmt.Errorf("converting %s to fp16: %w (%s; precision %s)",
			name, ErrAlreadyFloat16, why, onnx.Summarize(m).Precision.Kind)
	}
	opset := m.Opset()
	if opset < minOpset {
		return nil, nil, fmt.Errorf("converting %s to fp16: %w", name, &UnsupportedError{Reason: ReasonOldOpset,
			Detail: fmt.Sprintf("default-domain opset %d is not supported (need %d or later)", opset, minOpset)})
	}
	out := cloneModel(m)
	c := newConverter(out, opts, opset)
	if err := c.run(); err != nil {
		return nil, nil, fmt.Errorf("converting %s to fp16: %w", name, err)
	}
	if c.report.ConvertedInitializers == 0 && c.converted == 0 {
		c.report.Warnings = append(c.report.Warnings, "nothing was converted: no float32 value is computed by a float16 node")
	}
	return out, c.report, nil
}

// minOpset is the oldest default-domain opset Convert accepts. Before
// opset 6 Cast's "to" was a string (ONNX Runtime rejects the integer the
// rewrite writes) and many operators carried the legacy consumed_inputs
// attribute; the backend suite's opset-1 models are refused for it.
const minOpset = 6

func modelName(m *onnx.Model) string {
	if m.Path != "" {
		return m.Path
	}
	if n := m.Graph().GetName(); n != "" {
		return "model " + n
	}
	return "model"
}

// fp16Evidence returns why m counts as already float16 (any float16
// tensor, value type or Cast to FLOAT16, as float16.py checks), or "".
func fp16Evidence(m *onnx.Model) string {
	why := ""
	m.Tensors(func(t *onnxpb.TensorProto) error {
		if why == "" && onnx.DataType(t.GetDataType()) == onnx.Float16 {
			why = fmt.Sprintf("tensor %q is float16", t.GetName())
		}
		return nil
	})
	onnx.WalkGraphs(m.Graph(), func(g *onnxpb.GraphProto) {
		for _, list := range [][]*onnxpb.ValueInfoProto{g.GetInput(), g.GetOutput(), g.GetValueInfo()} {
			for _, v := range list {
				if why == "" && v.GetType().GetTensorType().GetElemType() == int32(onnx.Float16) {
					why = fmt.Sprintf("value %q is float16", v.GetName())
				}
			}
		}
		for _, n := range g.GetNode() {
			if why == "" && n.GetOpType() == "Cast" && attrInt(n, "to", 0) == int64(onnx.Float16) {
				why = fmt.Sprintf("node %s casts to float16", nodeLabel(n))
			}
		}
	})
	return why
}

func nodeLabel(n *onnxpb.NodeProto) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	return fmt.Sprintf("%s(%s)", n.GetOpType(), strings.Join(n.GetOutput(), ","))
}

// cloneModel deep-copies m except the raw data of the main graph's
// initializers, which the copy shares (they are only ever replaced, never
// written to), so a 100 MB model is not copied before it is converted.
func cloneModel(m *onnx.Model) *onnx.Model {
	mp := cloneExcept(m.Proto, "graph").(*onnxpb.ModelProto)
	g := m.Graph()
	ng := cloneExcept(g, "initializer").(*onnxpb.GraphProto)
	ng.Initializer = make([]*onnxpb.TensorProto, len(g.GetInitializer()))
	for i, t := range g.GetInitializer() {
		c := cloneExcept(t, "raw_data").(*onnxpb.TensorProto)
		c.RawData = t.RawData
		ng.Initializer[i] = c
	}
	mp.Graph = ng
	return &onnx.Model{Proto: mp, Path: m.Path}
}

// cloneExcept deep-copies msg without the named fields.
func cloneExcept(msg proto.Message, skip ...string) proto.Message {
	src := msg.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		for _, s := range skip {
			if string(fd.Name()) == s {
				return true
			}
		}
		switch {
		case fd.IsList():
			dl, sl := dst.Mutable(fd).List(), v.List()
			for i := 0; i < sl.Len(); i++ {
				dl.Append(cloneValue(fd, sl.Get(i)))
			}
		case fd.IsMap():
			dm := dst.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				dm.Set(k, cloneValue(fd.MapValue(), mv))
				return true
			})
		default:
			dst.Set(fd, cloneValue(fd, v))
		}
		return true
	})
	if u := src.GetUnknown(); len(u) > 0 {
		dst.SetUnknown(append(protoreflect.RawFields(nil), u...))
	}
	return dst.Interface()
}

func cloneValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch {
	case fd.Message() != nil:
		return protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect())
	case fd.Kind() == protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(append([]byte(nil), v.Bytes()...))
	}
	return v
}
