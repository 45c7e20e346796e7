package savedmodel

import (
	"fmt"
	"math"
)

// sliceSpec is StridedSlice lowered to ONNX: a Slice over some axes, then
// the shrunk axes squeezed and new axes inserted.
type sliceSpec struct {
	starts, ends, axes, steps []int64
	shrink, newAxes           []int64
}

// planStridedSlice applies TF's masks to constant begin/end/strides.
// Specs after an ellipsis address axes from the end (negative axes), so
// the input rank need not be known.
func planStridedSlice(begin, end, strides []int64, bm, em, ellm, nam, sam int64) (sliceSpec, error) {
	var p sliceSpec
	if len(end) != len(begin) || len(strides) != len(begin) {
		return p, fmt.Errorf("begin, end and strides differ in length (%d, %d, %d)", len(begin), len(end), len(strides))
	}
	if ellm != 0 && nam != 0 {
		return p, fmt.Errorf("ellipsis_mask together with new_axis_mask is not supported")
	}
	n := int64(len(begin))
	axis, outPos := int64(0), int64(0)
	afterEllipsis := false
	for i := range n {
		bit := int64(1) << i
		switch {
		case ellm&bit != 0:
			afterEllipsis = true
			continue
		case nam&bit != 0:
			p.newAxes = append(p.newAxes, outPos)
			outPos++
			continue
		}
		ax := axis
		if afterEllipsis {
			ax = i - n
		}
		axis++
		if sam&bit != 0 {
			e := begin[i] + 1
			if begin[i] == -1 {
				e = math.MaxInt64
			}
			p.add(begin[i], e, ax, 1)
			p.shrink = append(p.shrink, ax)
			continue
		}
		outPos++
		s := strides[i]
		if s == 0 {
			return p, fmt.Errorf("stride 0 at spec %d", i)
		}
		b, e := begin[i], end[i]
		if bm&bit != 0 {
			b = 0
			if s < 0 {
				b = math.MaxInt64
			}
		}
		if em&bit != 0 {
			e = math.MaxInt64
			if s < 0 {
				e = math.MinInt64
			}
		}
		if b == 0 && e == math.MaxInt64 && s == 1 {
			continue
		}
		p.add(b, e, ax, s)
	}
	return p, nil
}

func (p *sliceSpec) add(b, e, ax, s int64) {
	p.starts = append(p.starts, b)
	p.ends = append(p.ends, e)
	p.axes = append(p.axes, ax)
	p.steps = append(p.steps, s)
}

func stridedSlice(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	var v [3][]int64
	for i := range v {
		if v[i], err = c.constInts(i + 1); err != nil {
			return err
		}
	}
	p, err := planStridedSlice(v[0], v[1], v[2], c.intAttr("begin_mask"), c.intAttr("end_mask"),
		c.intAttr("ellipsis_mask"), c.intAttr("new_axis_mask"), c.intAttr("shrink_axis_mask"))
	if err != nil {
		return err
	}
	y := x
	if len(p.axes) > 0 {
		name := c.n.name
		y = c.tmp("Slice", []string{x, c.e.ints(name+"/starts", p.starts...), c.e.ints(name+"/ends", p.ends...),
			c.e.ints(name+"/axes", p.axes...), c.e.ints(name+"/steps", p.steps...)})
	}
	if len(p.shrink) > 0 {
		y = c.tmp("Squeeze", []string{y, c.e.ints(c.n.name+"/shrink", p.shrink...)})
	}
	if len(p.newAxes) > 0 {
		y = c.tmp("Unsqueeze", []string{y, c.e.ints(c.n.name+"/new", p.newAxes...)})
	}
	c.emit("Identity", []string{y})
	return nil
}
