package savedmodel

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/onnx"
)

// sliceSpec is StridedSlice lowered to ONNX: a Slice over some axes, then
// the shrunk axes squeezed and new axes inserted.
type sliceSpec struct {
	starts, ends, axes, steps []int64
	shrink, newAxes           []int64
}

// sliceLayout is where each of StridedSlice's n specs lands: spec[k] is
// the spec that slices axes[k] (shrunk ones included). Specs after an
// ellipsis address axes from the end (negative axes), so the input rank
// need not be known.
type sliceLayout struct {
	spec, axes      []int64
	shrink, newAxes []int64
}

func layoutStridedSlice(n, ellm, nam, sam int64) (sliceLayout, error) {
	var l sliceLayout
	if ellm != 0 && nam != 0 {
		return l, fmt.Errorf("ellipsis_mask together with new_axis_mask is not supported")
	}
	if ellm&(ellm-1) != 0 {
		return l, fmt.Errorf("ellipsis_mask %#x has more than one bit set", ellm)
	}
	axis, outPos := int64(0), int64(0)
	afterEllipsis := false
	for i := range n {
		bit := int64(1) << i
		switch {
		case ellm&bit != 0:
			afterEllipsis = true
			continue
		case nam&bit != 0:
			l.newAxes = append(l.newAxes, outPos)
			outPos++
			continue
		}
		ax := axis
		if afterEllipsis {
			ax = i - n
		}
		axis++
		l.spec = append(l.spec, i)
		l.axes = append(l.axes, ax)
		if sam&bit != 0 {
			l.shrink = append(l.shrink, ax)
			continue
		}
		outPos++
	}
	return l, nil
}

// planStridedSlice applies TF's masks to constant begin/end/strides.
func planStridedSlice(begin, end, strides []int64, bm, em, ellm, nam, sam int64) (sliceSpec, error) {
	var p sliceSpec
	if len(end) != len(begin) || len(strides) != len(begin) {
		return p, fmt.Errorf("begin, end and strides differ in length (%d, %d, %d)", len(begin), len(end), len(strides))
	}
	l, err := layoutStridedSlice(int64(len(begin)), ellm, nam, sam)
	if err != nil {
		return p, err
	}
	p.shrink, p.newAxes = l.shrink, l.newAxes
	for k, i := range l.spec {
		bit, ax := int64(1)<<i, l.axes[k]
		if sam&bit != 0 {
			e := begin[i] + 1
			if begin[i] == -1 {
				e = math.MaxInt64
			}
			p.add(begin[i], e, ax, 1)
			continue
		}
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

func (c *opCtx) sliceMasks() (bm, em, ellm, nam, sam int64) {
	return c.intAttr("begin_mask"), c.intAttr("end_mask"), c.intAttr("ellipsis_mask"), c.intAttr("new_axis_mask"), c.intAttr("shrink_axis_mask")
}

func stridedSlice(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	var v [3][]int64
	for i := range v {
		if v[i], err = c.constInts(i + 1); err != nil {
			return dynamicStridedSlice(c, x)
		}
	}
	bm, em, ellm, nam, sam := c.sliceMasks()
	p, err := planStridedSlice(v[0], v[1], v[2], bm, em, ellm, nam, sam)
	if err != nil {
		return err
	}
	y := x
	if len(p.axes) > 0 {
		name := c.n.name
		y = c.tmp("Slice", []string{x, c.e.ints(name+"/starts", p.starts...), c.e.ints(name+"/ends", p.ends...),
			c.e.ints(name+"/axes", p.axes...), c.e.ints(name+"/steps", p.steps...)})
	}
	c.finishSlice(y, p.shrink, p.newAxes)
	return nil
}

func (c *opCtx) finishSlice(y string, shrink, newAxes []int64) {
	if len(shrink) > 0 {
		y = c.tmp("Squeeze", []string{y, c.e.ints(c.n.name+"/shrink", shrink...)})
	}
	if len(newAxes) > 0 {
		y = c.tmp("Unsqueeze", []string{y, c.e.ints(c.n.name+"/new", newAxes...)})
	}
	c.emit("Identity", []string{y})
}

// specCount is the length of StridedSlice's begin/end/strides: from
// whichever is a constant or has a recorded shape.
func (c *opCtx) specCount() (int64, bool) {
	for i := 1; i <= 3; i++ {
		if d, ok := c.dims(i); ok && len(d) == 1 && d[0] >= 0 {
			return d[0], true
		}
	}
	return 0, false
}

// dynamicStridedSlice computes Slice's starts, ends and steps in the graph
// when begin, end or strides is not a constant: the masks, fixed per spec,
// pick between the given values and the full-range ones with Where.
func dynamicStridedSlice(c *opCtx, x string) error {
	if len(c.in) != 4 {
		return fmt.Errorf("has %d inputs, want 4", len(c.in))
	}
	n, ok := c.specCount()
	if !ok {
		return fmt.Errorf("begin, end and strides are computed and none has a known length, so the masks cannot be applied")
	}
	bm, em, ellm, nam, sam := c.sliceMasks()
	l, err := layoutStridedSlice(n, ellm, nam, sam)
	if err != nil {
		return err
	}
	var v [3]string
	for i := range v {
		if v[i], err = c.int64Input(i + 1); err != nil {
			return err
		}
	}
	if len(l.spec) == 0 {
		c.finishSlice(x, nil, l.newAxes)
		return nil
	}
	name := c.n.name
	mask := func(tag string, m int64) string {
		b := make([]bool, n)
		for i := range b {
			b[i] = m&(1<<i) != 0
		}
		t, _ := c.e.constant(c.e.fresh(name+"/"+tag), &onnx.Tensor{Type: onnx.Bool, Dims: []int64{n}, Data: b})
		return t
	}
	where := func(cond, a, b string) string { return c.tmp("Where", []string{cond, a, b}) }
	lo, hi := c.e.ints(name+"/min", math.MinInt64), c.e.ints(name+"/max", math.MaxInt64)
	zero, one, minus1 := c.e.ints(name+"/zero", 0), c.e.ints(name+"/one", 1), c.e.ints(name+"/minus1", -1)
	begin, end, steps := v[0], v[1], v[2]
	neg := c.tmp("Less", []string{steps, zero})
	starts := where(mask("begin_mask", bm), where(neg, hi, zero), begin)
	ends := where(mask("end_mask", em), where(neg, lo, hi), end)
	shrunk := mask("shrink_axis_mask", sam)
	ends = where(shrunk, where(c.tmp("Equal", []string{begin, minus1}), hi, c.tmp("Add", []string{begin, one})), ends)
	steps = where(shrunk, one, steps)
	pick := c.e.ints(name+"/specs", l.spec...)
	gather := func(t string) string { return c.tmp("Gather", []string{t, pick}, attrInt("axis", 0)) }
	y := c.tmp("Slice", []string{x, gather(starts), gather(ends), c.e.ints(name+"/axes", l.axes...), gather(steps)})
	c.finishSlice(y, l.shrink, l.newAxes)
	return nil
}

// sliceOps are the slicing ops beyond shapeOps' StridedSlice and Slice.
var sliceOps = map[string]opFunc{"ReverseV2": reverseV2}

// reverseV2 (Keras's go_backwards) is a Slice stepping -1 from the end
// of every reversed axis.
func reverseV2(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	axes, err := c.constInts(1)
	if err != nil {
		return err
	}
	if len(axes) == 0 {
		c.emit("Identity", []string{x})
		return nil
	}
	n, name := len(axes), c.n.name
	fill := func(v int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	c.emit("Slice", []string{x, c.e.ints(name+"/starts", fill(-1)...), c.e.ints(name+"/ends", fill(math.MinInt64)...),
		c.e.ints(name+"/axes", axes...), c.e.ints(name+"/steps", fill(-1)...)})
	return nil
}
