package savedmodel

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/onnx"
)

var shapeOps = map[string]opFunc{
	"Reshape": reshape, "Transpose": transposeOp, "ConcatV2": concat, "Pack": pack, "Unpack": unpack,
	"Squeeze": squeeze, "ExpandDims": expandDims, "Pad": pad(""), "PadV2": pad(""), "MirrorPad": pad("mirror"),
	"Shape": shapeOp("Shape"), "Size": shapeOp("Size"), "StridedSlice": stridedSlice, "Slice": slice,
	"GatherV2": gather, "Gather": gather, "ResourceGather": gather, "Fill": fillOp, "Tile": tile,
	"Split": split, "SplitV": splitV, "ZerosLike": fillLike(0), "OnesLike": fillLike(1),
}

func reshape(c *opCtx) error {
	s, err := c.int64Input(1)
	if err != nil {
		return err
	}
	c.emit("Reshape", []string{c.in[0], s})
	return nil
}

func transposeOp(c *opCtx) error {
	perm, err := c.constInts(1)
	if err != nil {
		return err
	}
	if _, ok := c.constant(0); ok {
		c.emit("Identity", []string{c.transposeInput(0, perm)})
		return nil
	}
	c.emit("Transpose", c.in[:1], attrInts("perm", perm...))
	return nil
}

func concat(c *opCtx) error {
	if len(c.in) < 2 {
		return fmt.Errorf("has %d inputs, want values and an axis", len(c.in))
	}
	axis, err := c.constInts(len(c.in) - 1)
	if err != nil || len(axis) != 1 {
		return fmt.Errorf("axis must be a constant scalar")
	}
	c.emit("Concat", c.in[:len(c.in)-1], attrInt("axis", axis[0]))
	return nil
}

func pack(c *opCtx) error {
	axis := c.e.ints(c.n.name+"/axis", c.intAttr("axis"))
	var parts []string
	for _, x := range c.in {
		parts = append(parts, c.tmp("Unsqueeze", []string{x, axis}))
	}
	c.emit("Concat", parts, attrInt("axis", c.intAttr("axis")))
	return nil
}

func unpack(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	num, axis := c.intAttr("num"), c.intAttr("axis")
	parts := make([]string, num)
	for i := range parts {
		parts[i] = c.e.fresh(c.n.name + "/part")
	}
	c.e.node("Split", []string{x}, parts, attrInt("axis", axis))
	ax := c.e.ints(c.n.name+"/axis", axis)
	for i, p := range parts {
		c.e.node("Squeeze", []string{p, ax}, []string{c.out(i)})
	}
	return nil
}

func squeeze(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	dims := c.intsAttr("squeeze_dims")
	if len(dims) == 0 {
		c.emit("Squeeze", []string{x})
		return nil
	}
	c.emit("Squeeze", []string{x, c.e.ints(c.n.name+"/axes", dims...)})
	return nil
}

func expandDims(c *opCtx) error {
	axis, err := c.int64Input(1)
	if err != nil {
		return err
	}
	axis = c.tmp("Reshape", []string{axis, c.e.ints(c.n.name+"/flat", -1)})
	c.emit("Unsqueeze", []string{c.in[0], axis})
	return nil
}

// pad maps Pad, PadV2 and MirrorPad; TF's [rank, 2] paddings become
// ONNX's begins-then-ends list.
func pad(kind string) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		p, err := c.int64Input(1)
		if err != nil {
			return err
		}
		pads := c.tmp("Reshape", []string{c.tmp("Transpose", []string{p}, attrInts("perm", 1, 0)), c.e.ints(c.n.name+"/flat", -1)})
		ins := []string{x, pads}
		if len(c.in) > 2 {
			ins = append(ins, c.in[2])
		}
		if kind == "" {
			c.emit("Pad", ins)
			return nil
		}
		switch m := c.strAttr("mode"); m {
		case "REFLECT":
			c.emit("Pad", ins, attrString("mode", "reflect"))
		default:
			return fmt.Errorf("MirrorPad mode %q has no ONNX Pad mode", m)
		}
		return nil
	}
}

func shapeOp(op string) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		dt, err := c.dtype("out_type")
		if err != nil {
			dt = onnx.Int32
		}
		c.emit("Cast", []string{c.tmp(op, []string{x})}, attrInt("to", int64(dt)))
		return nil
	}
}

func gather(c *opCtx) error {
	if len(c.in) < 2 {
		return fmt.Errorf("has %d inputs, want at least 2", len(c.in))
	}
	if c.intAttr("batch_dims") != 0 {
		return fmt.Errorf("batch_dims %d is not supported", c.intAttr("batch_dims"))
	}
	axis := []int64{0}
	if len(c.in) > 2 {
		var err error
		if axis, err = c.constInts(2); err != nil || len(axis) != 1 {
			return fmt.Errorf("axis must be a constant scalar")
		}
	}
	c.emit("Gather", c.in[:2], attrInt("axis", axis[0]))
	return nil
}

func fillOp(c *opCtx) error {
	dims, err := c.int64Input(0)
	if err != nil {
		return err
	}
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	c.emit("Expand", []string{c.in[1], dims})
	return nil
}

func fillLike(v float64) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		dt, err := c.dtype("T")
		if err != nil {
			return err
		}
		s, err := c.e.scalar(c.n.name+"/value", dt, v)
		if err != nil {
			return err
		}
		c.emit("Expand", []string{s, c.tmp("Shape", []string{x})})
		return nil
	}
}

func tile(c *opCtx) error {
	m, err := c.int64Input(1)
	if err != nil {
		return err
	}
	c.emit("Tile", []string{c.in[0], m})
	return nil
}

func split(c *opCtx) error {
	axis, err := c.constInts(0)
	if err != nil || len(axis) != 1 || len(c.in) != 2 {
		return fmt.Errorf("axis must be a constant scalar")
	}
	outs := make([]string, c.intAttr("num_split"))
	for i := range outs {
		outs[i] = c.out(i)
	}
	c.e.node("Split", []string{c.in[1]}, outs, attrInt("axis", axis[0]))
	return nil
}

func splitV(c *opCtx) error {
	sizes, err := c.constInts(1)
	if err != nil {
		return err
	}
	axis, err := c.constInts(2)
	if err != nil || len(axis) != 1 {
		return fmt.Errorf("axis must be a constant scalar")
	}
	for _, s := range sizes {
		if s < 0 {
			return fmt.Errorf("size_splits %v: an inferred (-1) size is not supported", sizes)
		}
	}
	outs := make([]string, len(sizes))
	for i := range outs {
		outs[i] = c.out(i)
	}
	c.e.node("Split", []string{c.in[0], c.e.ints(c.n.name+"/sizes", sizes...)}, outs, attrInt("axis", axis[0]))
	return nil
}

// slice is Slice(x, begin, size) with size -1 meaning "to the end".
func slice(c *opCtx) error {
	if len(c.in) != 3 {
		return fmt.Errorf("has %d inputs, want 3", len(c.in))
	}
	b, err := c.int64Input(1)
	if err != nil {
		return err
	}
	s, err := c.int64Input(2)
	if err != nil {
		return err
	}
	zero, big := c.e.ints(c.n.name+"/zero", 0), c.e.ints(c.n.name+"/max", math.MaxInt64)
	ends := c.tmp("Where", []string{c.tmp("Less", []string{s, zero}), big, c.tmp("Add", []string{b, s})})
	c.emit("Slice", []string{c.in[0], b, ends})
	return nil
}
