package savedmodel

import (
	"fmt"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// TensorLists are ONNX sequences of tensors, except where the import knows
// better: a list made from a tensor reads and stacks as that tensor, and a
// list a loop fills one item per iteration is a Loop scan output.

func listReserve(c *opCtx) error {
	dt, err := c.dtype("element_dtype")
	if err != nil {
		return err
	}
	c.emit("SequenceEmpty", nil, attrInt("dtype", int64(dt)))
	c.e.setList(c.out(0), seqInfo{elem: dt, reserved: true})
	return nil
}

func listFromTensor(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	dt, err := c.dtype("element_dtype")
	if err != nil {
		return err
	}
	c.emit("SplitToSequence", []string{x}, attrInt("axis", 0), attrInt("keepdims", 0))
	c.e.setList(c.out(0), seqInfo{elem: dt, from: x})
	return nil
}

// list returns input 0, which must be a TensorList, and its element type.
func (c *opCtx) list() (string, onnx.DataType, error) {
	h, err := c.input(0)
	if err != nil {
		return "", 0, err
	}
	dt, ok := c.e.seq(h)
	if !ok {
		return "", 0, fmt.Errorf("input %s is not a TensorList this import made", h)
	}
	return h, dt, nil
}

func listGetItem(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	i, err := c.input(1)
	if err != nil {
		return err
	}
	if from := c.e.seqs[h].from; from != "" {
		c.emit("Gather", []string{from, i}, attrInt("axis", 0))
		return nil
	}
	c.emit("SequenceAt", []string{h, i})
	return nil
}

// listSetItem replaces item i, or appends it when i is the list's length:
// TensorListReserve makes an empty sequence, which the usual writes
// (item 0, 1, 2, … as a loop runs) then fill in order.
func listSetItem(c *opCtx) error {
	h, dt, err := c.list()
	if err != nil {
		return err
	}
	if len(c.in) != 3 {
		return fmt.Errorf("has %d inputs, want 3", len(c.in))
	}
	if c.e.seqs[h].scan {
		c.emit("Identity", c.in[2:3])
		return nil
	}
	i := c.tmp("Cast", c.in[1:2], attrInt("to", int64(onnx.Int64)))
	inside := c.tmp("Less", []string{i, c.tmp("SequenceLength", []string{h})})
	branch := func(tag string, replace bool) *onnxpb.GraphProto {
		b := c.e.child(c.n.name + "/" + tag)
		out := b.fresh(c.n.name + "/" + tag)
		if replace {
			b.node("SequenceInsert", []string{b.tmp(c.n.name+"/erase", "SequenceErase", []string{h, i}), c.in[2], i}, []string{out})
		} else {
			b.node("SequenceInsert", []string{h, c.in[2]}, []string{out})
		}
		b.g.Output = append(b.g.Output, seqType(out, dt))
		c.e.adopt(b)
		return b.g
	}
	c.emit("If", []string{inside}, attrGraph("then_branch", branch("replace", true)), attrGraph("else_branch", branch("append", false)))
	c.e.setSeq(c.out(0), dt)
	return nil
}

// listStack stacks the items; a list known to hold a tensor's rows is
// that tensor.
func listStack(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	if from := c.e.seqs[h].from; from != "" {
		c.emit("Identity", []string{from})
		return nil
	}
	c.emit("ConcatFromSequence", []string{h}, attrInt("axis", 0), attrInt("new_axis", 1))
	return nil
}

func listLength(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	c.emit("Cast", []string{c.tmp("SequenceLength", []string{h})}, attrInt("to", int64(onnx.Int32)))
	return nil
}

// listElementShape is the shape of item 0 (a list of no items has none).
func listElementShape(c *opCtx) error {
	h, _, err := c.list()
	if err != nil {
		return err
	}
	dt, err := c.dtype("shape_type")
	if err != nil {
		dt = onnx.Int32
	}
	item := c.tmp("SequenceAt", []string{h, c.e.ints(c.n.name+"/first", 0)})
	c.emit("Cast", []string{c.tmp("Shape", []string{item})}, attrInt("to", int64(dt)))
	return nil
}

func listPushBack(c *opCtx) error {
	h, dt, err := c.list()
	if err != nil {
		return err
	}
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	c.emit("SequenceInsert", []string{h, c.in[1]})
	c.e.setSeq(c.out(0), dt)
	return nil
}
