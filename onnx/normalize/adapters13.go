package normalize

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// upgClip11 moves min and max to inputs of the data's own element type;
// an absent attribute becomes an absent input (no bound on that side).
func upgClip11(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	lo, hi := upgTake(n, "min"), upgTake(n, "max")
	x := upgInput(n, 0)
	in := []string{x, "", ""}
	for i, a := range []*onnxpb.AttributeProto{lo, hi} {
		if a == nil {
			continue
		}
		dt := u.types.typeOf(x)
		if dt == onnx.Undefined {
			return nil, "", fmt.Errorf("cannot tell the element type of its input %s, which its %s input must have", x, a.GetName())
		}
		s, err := u.scalarOf(upgNodeName(n)+"_"+a.GetName(), dt, float64(a.GetF()))
		if err != nil {
			return nil, "", fmt.Errorf("its %s: %w", a.GetName(), err)
		}
		in[i+1] = s
	}
	for len(in) > 1 && in[len(in)-1] == "" {
		in = in[:len(in)-1]
	}
	n.Input = in
	return []*onnxpb.NodeProto{n}, "Clip", nil
}

// upgPad11 moves pads and value to inputs; the mode names (constant,
// reflect, edge) did not change.
func upgPad11(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	pads, val := upgTake(n, "pads"), upgTake(n, "value")
	if pads == nil {
		return nil, "", errors.New("it has no pads attribute")
	}
	x := upgInput(n, 0)
	p, err := u.ints(upgNodeName(n)+"_pads", pads.GetInts())
	if err != nil {
		return nil, "", err
	}
	in := []string{x, p}
	if val != nil && val.GetF() != 0 && upgStringAttr(n, "mode", "constant") == "constant" {
		dt := u.types.typeOf(x)
		if dt == onnx.Undefined {
			return nil, "", fmt.Errorf("cannot tell the element type of its input %s, which its constant_value input must have", x)
		}
		c, err := u.scalarOf(upgNodeName(n)+"_value", dt, float64(val.GetF()))
		if err != nil {
			return nil, "", fmt.Errorf("its value: %w", err)
		}
		in = append(in, c)
	}
	n.Input = in
	return []*onnxpb.NodeProto{n}, "Pad", nil
}

// upgResize11 maps Resize-10 (and so Upsample) onto Resize-11: an empty
// roi input, and the coordinate mapping Resize-10 used, which is
// asymmetric (x_in = x_out / scale) with nearest rounding down.
func upgResize11(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	if len(n.GetInput()) != 2 {
		return nil, "", fmt.Errorf("it has %d inputs; Resize-10 takes X and scales", len(n.GetInput()))
	}
	roi, err := u.constant(upgNodeName(n)+"_roi", &onnx.Tensor{Type: onnx.Float, Dims: []int64{0}, Data: []float32{}})
	if err != nil {
		return nil, "", err
	}
	n.Input = []string{n.Input[0], roi, n.Input[1]}
	upgSetString(n, "coordinate_transformation_mode", "asymmetric")
	switch mode := upgStringAttr(n, "mode", "nearest"); mode {
	case "nearest":
		return u.resizeNearest11(n)
	case "linear", "bilinear":
		upgSetString(n, "mode", "linear")
	default:
		return nil, "", fmt.Errorf("mode %q is not one of Resize-10's (nearest, linear)", mode)
	}
	return []*onnxpb.NodeProto{n}, "Resize", nil
}

// resizeNearest11 picks the rounding of Resize-10's nearest mode, which
// rounds the source coordinate down along an axis that grows and up along
// one that shrinks (ONNX Runtime's and the reference's reading; Upsample
// only grows). Resize-11 has one nearest_mode per node, so when some axes
// grow and others shrink the node becomes two: the shrinking axes first
// (ceil), then the growing ones (floor). Nearest-neighbour resizing works
// on each axis alone, so the result is the same.
func (u *upgrader) resizeNearest11(n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	keep := []*onnxpb.NodeProto{n}
	if u.upscale[n] {
		upgSetString(n, "nearest_mode", "floor")
		return keep, "Resize", nil
	}
	scales, err := u.constFloats(n.Input[2])
	if err != nil {
		return nil, "", fmt.Errorf("its scales are not constant, and Resize-10 rounds differently where they are below 1: %w", err)
	}
	var up, down bool
	for _, s := range scales {
		up, down = up || s > 1, down || s < 1
	}
	switch {
	case !down:
		upgSetString(n, "nearest_mode", "floor")
		return keep, "Resize", nil
	case !up:
		upgSetString(n, "nearest_mode", "ceil")
		return keep, "Resize", nil
	}
	first, second := make([]float32, len(scales)), make([]float32, len(scales))
	for i, s := range scales {
		first[i], second[i] = min(s, 1), max(s, 1)
	}
	fs, err := u.constant(upgNodeName(n)+"_scales_down", &onnx.Tensor{Type: onnx.Float, Dims: []int64{int64(len(first))}, Data: first})
	if err != nil {
		return nil, "", err
	}
	ss, err := u.constant(upgNodeName(n)+"_scales_up", &onnx.Tensor{Type: onnx.Float, Dims: []int64{int64(len(second))}, Data: second})
	if err != nil {
		return nil, "", err
	}
	mid := u.value(n.Output[0] + "_shrunk")
	down1 := proto.Clone(n).(*onnxpb.NodeProto)
	u.created[down1] = true
	down1.Name = proto.String(u.names.Fresh(upgNodeName(n) + "_shrink"))
	down1.Input = []string{n.Input[0], n.Input[1], fs}
	down1.Output = []string{mid}
	upgSetString(down1, "nearest_mode", "ceil")
	n.Input = []string{mid, n.Input[1], ss}
	upgSetString(n, "nearest_mode", "floor")
	return []*onnxpb.NodeProto{down1, n}, "Resize", nil
}

// upgScatter11 replaces the deprecated Scatter by ScatterElements, the
// same operator under its new name.
func upgScatter11(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	n.OpType = proto.String("ScatterElements")
	return []*onnxpb.NodeProto{n}, "Scatter→ScatterElements", nil
}

// upgDropout12 moves ratio to a scalar float input (training_mode stays
// absent: inference).
func upgDropout12(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	r := upgTake(n, "ratio")
	if r == nil {
		return nil, "", nil
	}
	s, err := u.scalarOf(upgNodeName(n)+"_ratio", onnx.Float, float64(r.GetF()))
	if err != nil {
		return nil, "", err
	}
	n.Input = []string{upgInput(n, 0), s}
	return []*onnxpb.NodeProto{n}, "Dropout", nil
}

// upgSoftmax13 keeps the meaning of Softmax, LogSoftmax and Hardmax
// before 13, which flattened the input to 2-D at axis and normalized each
// row; from 13 they work along axis alone. When axis is the last
// dimension both are the same; otherwise the node runs on a Flatten of its
// input, along axis 1, and a Reshape to the input's shape follows.
func upgSoftmax13(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	x, y := upgInput(n, 0), upgOutput(n, 0)
	axis := upgIntAttr(n, "axis", 1)
	r := u.types.rankOf(x)
	if r < 0 {
		r = u.types.rankOf(y)
	}
	if axis == -1 || r >= 0 && axis == int64(r-1) {
		upgSetInt(n, "axis", -1)
		return []*onnxpb.NodeProto{n}, "", nil
	}
	base := upgNodeName(n)
	shape, flat, flatOut := u.value(x+"_shape"), u.value(x+"_2d"), u.value(y+"_2d")
	sh := u.node("Shape", base+"_shape", []string{x}, []string{shape})
	fl := u.node("Flatten", base+"_flatten", []string{x}, []string{flat}, upgIntAttrProto("axis", axis))
	rs := u.node("Reshape", base+"_reshape", []string{flatOut, shape}, []string{y})
	n.Input[0], n.Output[0] = flat, flatOut
	upgSetInt(n, "axis", 1)
	u.types.set(flat, u.types.typeOf(x), 2)
	u.types.set(flatOut, u.types.typeOf(x), 2)
	return []*onnxpb.NodeProto{sh, fl, n, rs}, n.GetOpType(), nil
}

// upgAxesToInput moves axes to an int64 input (Squeeze, Unsqueeze,
// ReduceSum at 13). Without axes Squeeze and ReduceSum keep their
// all-axes meaning (ReduceSum's noop_with_empty_axes defaults to 0).
func upgAxesToInput(optional bool) upgAdapter {
	return func(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
		a := upgTake(n, "axes")
		if a == nil {
			if !optional {
				return nil, "", errors.New("it has no axes attribute")
			}
			return nil, "", nil
		}
		s, err := u.ints(upgNodeName(n)+"_axes", a.GetInts())
		if err != nil {
			return nil, "", err
		}
		n.Input = []string{upgInput(n, 0), s}
		return []*onnxpb.NodeProto{n}, n.GetOpType(), nil
	}
}

// upgSplit13 moves split to an int64 input.
func upgSplit13(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	a := upgTake(n, "split")
	if a == nil {
		return nil, "", nil
	}
	s, err := u.ints(upgNodeName(n)+"_split", a.GetInts())
	if err != nil {
		return nil, "", err
	}
	n.Input = []string{upgInput(n, 0), s}
	return []*onnxpb.NodeProto{n}, "Split", nil
}

// upgBatchNorm14 drops the training outputs (mean, var, saved_mean,
// saved_var) that BatchNormalization-14 replaced by running statistics
// in training mode only; a model that reads them is refused.
func upgBatchNorm14(u *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	if len(n.GetOutput()) <= 1 {
		return nil, "", nil
	}
	for _, o := range n.GetOutput()[1:] {
		if o != "" && u.used(o) {
			return nil, "", fmt.Errorf("its training output %s is used; BatchNormalization-14 has no inference equivalent", o)
		}
	}
	for _, o := range n.GetOutput()[1:] {
		u.dropValueInfo(o)
	}
	n.Output = n.Output[:1]
	return []*onnxpb.NodeProto{n}, "BatchNormalization", nil
}

// upgRoiAlign16 makes RoiAlign-10's pixel mapping explicit: version 16
// added coordinate_transformation_mode with a half_pixel default.
func upgRoiAlign16(_ *upgrader, _ *onnxpb.GraphProto, n *onnxpb.NodeProto) ([]*onnxpb.NodeProto, string, error) {
	if upgAttr(n, "coordinate_transformation_mode") != nil {
		return nil, "", nil
	}
	upgSetString(n, "coordinate_transformation_mode", "output_half_pixel")
	return []*onnxpb.NodeProto{n}, "RoiAlign", nil
}
