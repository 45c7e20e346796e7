package normalize

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// upgAdapter rewrites node n of graph g (in the form of the opset before
// the step) into the form of the step's opset. It returns the nodes that
// replace n, in order (nil: n stays as it is), and a label for the
// summary ("" when the rewrite is not worth naming, like dropping an
// attribute the new version no longer has).
type upgAdapter func(u *upgrader, g *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error)

type upgKey struct {
	op string
	v  int64 // the opset that introduced the change
}

// upgAdapters lists every default-domain operator whose signature or
// meaning changed between opset 1 and 17 (ONNX's Changelog.md, checked
// against the ONNX version converter's adapter list). An operator whose
// new version only widened its types or clarified its text (Gemm 9/11/13,
// MatMul 9/13, Add 13/14, Cast 9/13, Concat 11/13, Gather 11/13, Reduce*
// 11/13, ArgMax 11/12/13, Resize 13, ...) has no entry: its nodes carry
// over as they are.
var upgAdapters = upgTable()

func upgTable() map[upgKey]upgAdapter {
	t := map[upgKey]upgAdapter{
		{"Pad", 2}:                       upgPad2,
		{"Split", 2}:                     upgSplit2,
		{"LpPool", 2}:                    upgLpPool2,
		{"GlobalLpPool", 2}:              upgLpPool2,
		{"Concat", 4}:                    upgConcat4,
		{"Reshape", 5}:                   upgReshape5,
		{"Cast", 6}:                      upgCast6,
		{"Tile", 6}:                      upgRefuse("Tile-1 took tiles and axis inputs; Tile-6 takes repeats"),
		{"Gemm", 7}:                      upgDropAttr("broadcast"),
		{"PRelu", 7}:                     upgPRelu7,
		{"GRU", 7}:                       upgDropAttr("output_sequence"),
		{"LSTM", 7}:                      upgDropAttr("output_sequence"),
		{"RNN", 7}:                       upgDropAttr("output_sequence"),
		{"BatchNormalization", 7}:        upgIsTest7,
		{"Dropout", 7}:                   upgIsTest7,
		{"Upsample", 7}:                  upgRefuse("Upsample before opset 7 was experimental (width_scale/height_scale)"),
		{"BatchNormalization", 9}:        upgBatchNorm9,
		{"Upsample", 9}:                  upgUpsample9,
		{"Scan", 9}:                      upgScan9,
		{"MeanVarianceNormalization", 9}: upgRefuse("the experimental MeanVarianceNormalization (across_channels, normalize_variance) differs from MeanVarianceNormalization-9 (axes)"),
		{"Slice", 10}:                    upgSlice10,
		{"TopK", 10}:                     upgTopK10,
		{"Upsample", 10}:                 upgUpsample10,
		{"Dropout", 10}:                  upgDropout10,
		{"Clip", 11}:                     upgClip11,
		{"Pad", 11}:                      upgPad11,
		{"Resize", 11}:                   upgResize11,
		{"Scatter", 11}:                  upgScatter11,
		{"Dropout", 12}:                  upgDropout12,
		{"Softmax", 13}:                  upgSoftmax13,
		{"LogSoftmax", 13}:               upgSoftmax13,
		{"Hardmax", 13}:                  upgSoftmax13,
		{"Squeeze", 13}:                  upgAxesToInput(true),
		{"Unsqueeze", 13}:                upgAxesToInput(false),
		{"ReduceSum", 13}:                upgAxesToInput(true),
		{"Split", 13}:                    upgSplit13,
		{"BatchNormalization", 14}:       upgBatchNorm14,
		{"RoiAlign", 16}:                 upgRoiAlign16,
	}
	for _, op := range []string{"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"} {
		t[upgKey{op, 7}] = upgBroadcast7
	}
	// Experimental operators were removed from the standard at opset 10.
	for _, op := range []string{"ATen", "Affine", "ConstantFill", "Crop", "DynamicSlice", "GRUUnit",
		"GivenTensorFill", "ImageScaler", "ParametricSoftplus", "Scale", "ScaledTanh"} {
		t[upgKey{op, 10}] = upgRefuse("the experimental operator was removed from ONNX at opset 10")
	}
	return t
}

// upgConsumedInputs drops the consumed_inputs attribute that opset 6
// removed from every operator that had it (it only described in-place
// buffer reuse).
func upgConsumedInputs(n *onnxpb.NodeProto) bool {
	return upgTake(n, "consumed_inputs") != nil
}

func upgRefuse(why string) upgAdapter {
	return func(*upgrader, *onnxpb.GraphProto, *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
		return nil, "", errors.New(why)
	}
}

func upgDropAttr(name string) upgAdapter {
	return func(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
		if upgTake(n, name) == nil {
			return nil, "", nil
		}
		return []*onnxpb.NodeProto{n}, "", nil
	}
}

func upgPad2(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgAttr(n, "paddings")
	if a == nil {
		return nil, "", nil
	}
	a.Name = proto.String("pads")
	return []*onnxpb.NodeProto{n}, "Pad", nil
}

// upgSplit2 moves Split-1's optional second input into the split attribute.
func upgSplit2(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	s := upgInput(n, 1)
	if s == "" {
		return nil, "", nil
	}
	v, err := u.constInts(s)
	if err != nil {
		return nil, "", fmt.Errorf("its split input: %w", err)
	}
	n.Input = n.Input[:1]
	n.Attribute = append(n.Attribute, upgIntsAttrProto("split", v))
	return []*onnxpb.NodeProto{n}, "Split", nil
}

// upgLpPool2 turns the float p of LpPool-1 into the int of LpPool-2.
func upgLpPool2(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgTake(n, "p")
	if a == nil {
		return nil, "", nil
	}
	p := a.GetF()
	if p != float32(int64(p)) {
		return nil, "", fmt.Errorf("p=%g is not an integer, which LpPool-2 requires", p)
	}
	upgSetInt(n, "p", int64(p))
	return []*onnxpb.NodeProto{n}, "LpPool", nil
}

// upgConcat4 makes Concat-1's default axis 1 explicit (Concat-4 requires it).
func upgConcat4(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	if upgAttr(n, "axis") != nil {
		return nil, "", nil
	}
	upgSetInt(n, "axis", 1)
	return []*onnxpb.NodeProto{n}, "Concat", nil
}

func upgReshape5(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	upgConsumedInputs(n)
	a := upgTake(n, "shape")
	if a == nil {
		return nil, "", errors.New("it has no shape attribute")
	}
	s, err := u.ints(upgInput(n, 0)+"_shape", a.GetInts())
	if err != nil {
		return nil, "", err
	}
	n.Input = []string{upgInput(n, 0), s}
	return []*onnxpb.NodeProto{n}, "Reshape", nil
}

// upgCast6 turns Cast-1's type name ("FLOAT") into Cast-6's enum.
func upgCast6(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgAttr(n, "to")
	if a == nil || len(a.GetS()) == 0 {
		return nil, "", nil
	}
	dt, err := onnx.ParseDataType(strings.ToUpper(string(a.GetS())))
	if err != nil {
		return nil, "", fmt.Errorf("its to=%q: %w", a.GetS(), err)
	}
	upgSetInt(n, "to", int64(dt))
	return []*onnxpb.NodeProto{n}, "Cast", nil
}

// upgIsTest7 drops is_test, which opset 7 removed from BatchNormalization
// and Dropout: the new versions always compute the inference form, so a
// node in training mode (is_test=0) has no equivalent.
func upgIsTest7(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgTake(n, "is_test")
	if a == nil {
		return nil, "", nil
	}
	if a.GetI() == 0 {
		return nil, "", errors.New("is_test=0 is training mode, which has no inference equivalent after opset 7")
	}
	return []*onnxpb.NodeProto{n}, "", nil
}

// upgBroadcast7 maps opset 6's broadcast/axis attributes onto numpy-style
// broadcasting. With an axis, B's dimensions line up with A's from axis
// on, so B gains trailing 1s until they line up from the right.
func upgBroadcast7(u *upgrader, g *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	b, ax := upgTake(n, "broadcast"), upgTake(n, "axis")
	if b == nil && ax == nil {
		return nil, "", nil
	}
	keep := []*onnxpb.NodeProto{n}
	if b == nil || b.GetI() == 0 || ax == nil {
		return keep, "", nil
	}
	a, bn := upgInput(n, 0), upgInput(n, 1)
	ra, rb := u.types.rankOf(a), u.types.rankOf(bn)
	if ra < 0 || rb < 0 {
		return nil, "", fmt.Errorf("broadcasting %s along axis %d needs the ranks of %s and %s, which the model does not record", bn, ax.GetI(), a, bn)
	}
	axis := int(ax.GetI())
	if axis < 0 {
		axis += ra
	}
	k := ra - axis - rb
	if k < 0 {
		return nil, "", fmt.Errorf("%s (rank %d) does not fit into %s (rank %d) from axis %d", bn, rb, a, ra, axis)
	}
	if k == 0 {
		return keep, "", nil
	}
	return u.trailingOnes(n, rb, k), n.GetOpType() + "(broadcast)", nil
}

// trailingOnes gives n's second input (of rank r) k trailing dimensions
// of size 1: a reshaped copy of an initializer, else an Unsqueeze (in
// its opset-7 form) before n. It returns the nodes that replace n.
func (u *upgrader) trailingOnes(n *onnxpb.NodeProto, r, k int) []*onnxpb.NodeProto {
	bn := n.Input[1]
	if t := u.types.init[bn]; t != nil {
		c := proto.Clone(t).(*onnxpb.TensorProto)
		c.Name = proto.String(u.names.Fresh(bn + "_aligned"))
		for range k {
			c.Dims = append(c.Dims, 1)
		}
		u.m.Graph().Initializer = append(u.m.Graph().Initializer, c)
		u.types.init[c.GetName()] = c
		n.Input[1] = c.GetName()
		return []*onnxpb.NodeProto{n}
	}
	axes := make([]int64, k)
	for i := range axes {
		axes[i] = int64(r + i)
	}
	out := u.value(bn + "_aligned")
	un := u.node("Unsqueeze", upgNodeName(n)+"_align", []string{bn}, []string{out}, upgIntsAttrProto("axes", axes))
	n.Input[1] = out
	return []*onnxpb.NodeProto{un, n}
}

// upgPRelu7 keeps PRelu-6's per-channel slope: a slope of rank 1 (size
// C) applied along axis 1, where PRelu-7 broadcasts it numpy-style from
// the last axis. The slope gains trailing 1s to line up with axis 1.
func upgPRelu7(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	x, s := upgInput(n, 0), upgInput(n, 1)
	if u.types.rankOf(s) != 1 {
		return nil, "", nil
	}
	r := u.types.rankOf(x)
	if r < 0 {
		return nil, "", fmt.Errorf("its per-channel slope %s needs the rank of %s, which the model does not record", s, x)
	}
	if r <= 2 {
		return nil, "", nil
	}
	return u.trailingOnes(n, 1, r-2), "PRelu", nil
}

// upgBatchNorm9 drops spatial, which opset 9 removed (keeping spatial=1).
func upgBatchNorm9(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgTake(n, "spatial")
	if a == nil {
		return nil, "", nil
	}
	if a.GetI() != 1 {
		return nil, "", errors.New("spatial=0 (per-activation statistics) has no equivalent after opset 9")
	}
	return []*onnxpb.NodeProto{n}, "", nil
}

// upgUpsample9 moves Upsample-7's scales attribute to an input.
func upgUpsample9(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgTake(n, "scales")
	if a == nil {
		return nil, "", nil
	}
	s, err := u.constant(upgNodeName(n)+"_scales", &onnx.Tensor{Type: onnx.Float, Dims: []int64{int64(len(a.GetFloats()))}, Data: append([]float32(nil), a.GetFloats()...)})
	if err != nil {
		return nil, "", err
	}
	n.Input = []string{upgInput(n, 0), s}
	return []*onnxpb.NodeProto{n}, "Upsample", nil
}

// upgUpsample10 replaces the deprecated Upsample by Resize-10, which has
// the same inputs and modes.
func upgUpsample10(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	n.OpType = proto.String("Resize")
	u.upscale[n] = true
	return []*onnxpb.NodeProto{n}, "Upsample→Resize", nil
}

// upgSlice10 moves starts, ends and axes to inputs.
func upgSlice10(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	starts, ends, axes := upgTake(n, "starts"), upgTake(n, "ends"), upgTake(n, "axes")
	if starts == nil || ends == nil {
		return nil, "", errors.New("it lacks its starts or ends attribute")
	}
	base := upgNodeName(n)
	in := []string{upgInput(n, 0)}
	for _, a := range []*onnxpb.AttributeProto{starts, ends, axes} {
		if a == nil {
			break
		}
		s, err := u.ints(base+"_"+a.GetName(), a.GetInts())
		if err != nil {
			return nil, "", err
		}
		in = append(in, s)
	}
	n.Input = in
	return []*onnxpb.NodeProto{n}, "Slice", nil
}

// upgTopK10 moves k to a 1-element input.
func upgTopK10(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	k := upgTake(n, "k")
	if k == nil {
		return nil, "", errors.New("it has no k attribute")
	}
	s, err := u.ints(upgNodeName(n)+"_k", []int64{k.GetI()})
	if err != nil {
		return nil, "", err
	}
	n.Input = []string{upgInput(n, 0), s}
	return []*onnxpb.NodeProto{n}, "TopK", nil
}

// upgDropout10 drops the mask output, whose type became bool at opset 10;
// a model that reads the mask is refused.
func upgDropout10(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	mask := upgOutput(n, 1)
	if mask == "" {
		return nil, "", nil
	}
	if u.used(mask) {
		return nil, "", fmt.Errorf("its mask output %s is used, and its type changed from the data's to bool at opset 10", mask)
	}
	n.Output = n.Output[:1]
	u.dropValueInfo(mask)
	return []*onnxpb.NodeProto{n}, "Dropout", nil
}

func upgOutput(n *onnxpb.NodeProto, i int) string {
	if i < len(n.GetOutput()) {
		return n.GetOutput()[i]
	}
	return ""
}

// used reports whether any node of any graph reads the value, or a graph
// returns it.
func (u *upgrader) used(name string) bool {
	found := false
	onnx.WalkGraphs(u.m.Graph(), func(g *onnxpb.GraphProto) {
		for _, o := range g.GetOutput() {
			found = found || o.GetName() == name
		}
		for _, n := range g.GetNode() {
			for _, in := range n.GetInput() {
				found = found || in == name
			}
		}
	})
	return found
}

// dropValueInfo removes what value_info records about a value that no
// longer exists.
func (u *upgrader) dropValueInfo(name string) {
	onnx.WalkGraphs(u.m.Graph(), func(g *onnxpb.GraphProto) {
		vi := g.ValueInfo[:0]
		for _, v := range g.GetValueInfo() {
			if v.GetName() != name {
				vi = append(vi, v)
			}
		}
		g.ValueInfo = vi
	})
}

// constFloats returns the values of a float initializer.
func (u *upgrader) constFloats(name string) ([]float32, error) {
	t := u.types.init[name]
	if t == nil {
		return nil, fmt.Errorf("%s is not an initializer", name)
	}
	d, err := onnx.Decode(t)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", name, err)
	}
	v, ok := d.Data.([]float32)
	if !ok {
		return nil, fmt.Errorf("%s holds %s, not float32", name, d.Type)
	}
	return v, nil
}

// constInts returns the values of an int64 or int32 initializer.
func (u *upgrader) constInts(name string) ([]int64, error) { return u.types.constInts(name) }

// constInts returns the values of an int64 or int32 initializer.
func (u *upgTypes) constInts(name string) ([]int64, error) {
	t := u.init[name]
	if t == nil {
		return nil, fmt.Errorf("%s is not an initializer", name)
	}
	d, err := onnx.Decode(t)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", name, err)
	}
	switch v := d.Data.(type) {
	case []int64:
		return v, nil
	case []int32:
		out := make([]int64, len(v))
		for i, x := range v {
			out[i] = int64(x)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s holds %s, not integers", name, d.Type)
}
