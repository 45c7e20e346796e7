package savedmodel

import (
	"slices"
	"strings"
)

// The shape rules of the ops that change shapes. Each returns what it can
// know: an unknown rank when its inputs leave it unknown.

// ints is the constant integer value of input i of n.
func (si *shapeInfer) ints(n *tfNode, i int) ([]int64, bool) {
	if i < 0 || i >= len(n.inputs) {
		return nil, false
	}
	v, ok := si.values[n.inputs[i]]
	return v, ok
}

// maxRank bounds the ranks inference makes up from a shape's values, so a
// malformed graph cannot ask for a huge shape.
const maxRank = 64

// unknownDims is a shape of rank with every size unknown; no rank when
// rank is out of bounds.
func unknownDims(rank int) tshape {
	if rank < 0 || rank > maxRank {
		return tshape{}
	}
	d := make([]int64, rank)
	for i := range d {
		d[i] = -1
	}
	return ranked(d...)
}

func matMulShape(_ *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	a, b := in(0), in(1)
	m, k := a.dim(0), a.dim(1)
	if n.attr["transpose_a"].GetB() {
		m = k
	}
	nn := b.dim(1)
	if n.attr["transpose_b"].GetB() {
		nn = b.dim(0)
	}
	return ranked(m, nn)
}

func batchMatMulShape(_ *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	a, b := in(0), in(1)
	if a.rank() < 2 || b.rank() < 2 {
		return tshape{}
	}
	m, nn := a.dim(-2), b.dim(-1)
	if n.attr["adj_x"].GetB() {
		m = a.dim(-1)
	}
	if n.attr["adj_y"].GetB() {
		nn = b.dim(-2)
	}
	batch := broadcastShapes(ranked(a.dims[:len(a.dims)-2]...), ranked(b.dims[:len(b.dims)-2]...))
	return ranked(append(batch.dims, m, nn)...)
}

func reshapeShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	target, ok := si.ints(n, 1)
	if !ok {
		if s := in(1); s.rank() == 1 && s.dims[0] >= 0 {
			return unknownDims(int(s.dims[0]))
		}
		return tshape{}
	}
	out := slices.Clone(target)
	x := in(0)
	free, prod := -1, int64(1)
	for i, d := range out {
		if d < 0 {
			free = i
		} else {
			prod *= d
		}
	}
	if free >= 0 {
		out[free] = -1
		if total, ok := fullSize(x); ok && prod > 0 {
			out[free] = total / prod
		}
	}
	return ranked(out...)
}

func fullSize(s tshape) (int64, bool) {
	if !s.full() {
		return 0, false
	}
	total := int64(1)
	for _, d := range s.dims {
		total *= d
	}
	return total, true
}

func transposeShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	perm, ok := si.ints(n, 1)
	x := in(0)
	switch {
	case !ok:
		return sameRank(x)
	case x.rank() != len(perm):
		return unknownDims(len(perm))
	}
	out := make([]int64, len(perm))
	for i, p := range perm {
		out[i] = x.dim(int(p))
	}
	return ranked(out...)
}

// sameRank is a shape of x's rank with every size unknown.
func sameRank(x tshape) tshape {
	if !x.ranked {
		return x
	}
	return unknownDims(len(x.dims))
}

// axisOf normalizes a possibly negative axis for a rank.
func axisOf(a int64, rank int) int {
	if a < 0 {
		a += int64(rank)
	}
	return int(a)
}

func expandDimsShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	ax, ok := si.ints(n, 1)
	if !x.ranked || !ok || len(ax) != 1 {
		return tshape{}
	}
	a := axisOf(ax[0], len(x.dims)+1)
	if a < 0 || a > len(x.dims) {
		return tshape{}
	}
	return ranked(slices.Insert(slices.Clone(x.dims), a, 1)...)
}

func squeezeShape(_ *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	if !x.ranked {
		return x
	}
	axes := n.attr["squeeze_dims"].GetList().GetI()
	var out []int64
	for i, d := range x.dims {
		drop := d == 1 && len(axes) == 0
		if len(axes) == 0 && d < 0 {
			return tshape{} // squeezing every 1: an unknown size may be one
		}
		for _, a := range axes {
			drop = drop || axisOf(a, len(x.dims)) == i
		}
		if !drop {
			out = append(out, d)
		}
	}
	return ranked(out...)
}

func concatShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	k := len(n.inputs) - 1
	ax, ok := si.ints(n, k)
	if k < 1 || !ok || len(ax) != 1 {
		return tshape{}
	}
	var out tshape
	sum := int64(0)
	for i := range k {
		s := in(i)
		if !s.ranked {
			continue
		}
		a := axisOf(ax[0], len(s.dims))
		if a < 0 || a >= len(s.dims) {
			return tshape{}
		}
		if sum >= 0 && s.dims[a] >= 0 {
			sum += s.dims[a]
		} else {
			sum = -1
		}
		masked := slices.Clone(s.dims)
		masked[a] = -1
		out = merge(out, ranked(masked...))
	}
	if !out.ranked {
		return out
	}
	for i := range k {
		if !in(i).ranked {
			sum = -1
		}
	}
	out.dims[axisOf(ax[0], len(out.dims))] = sum
	return out
}

func packShape(_ *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	var s tshape
	for i := range n.inputs {
		s = merge(s, in(i))
	}
	if !s.ranked {
		return s
	}
	a := axisOf(n.attr["axis"].GetI(), len(s.dims)+1)
	if a < 0 || a > len(s.dims) {
		return tshape{}
	}
	return ranked(slices.Insert(slices.Clone(s.dims), a, int64(len(n.inputs)))...)
}

func shapeOfShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	if !x.ranked {
		return ranked(-1)
	}
	if x.full() {
		si.values[nodeOut(n)] = slices.Clone(x.dims)
	}
	return ranked(int64(len(x.dims)))
}

func reduceShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	axes, ok := si.ints(n, 1)
	keep := n.attr["keep_dims"].GetB()
	if !x.ranked || !ok {
		if keep {
			return sameRank(x)
		}
		return tshape{}
	}
	var out []int64
	for i, d := range x.dims {
		reduced := false
		for _, a := range axes {
			reduced = reduced || axisOf(a, len(x.dims)) == i
		}
		switch {
		case reduced && keep:
			out = append(out, 1)
		case !reduced:
			out = append(out, d)
		}
	}
	return ranked(out...)
}

func argShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	ax, ok := si.ints(n, 1)
	if !x.ranked || !ok || len(ax) != 1 {
		return tshape{}
	}
	a := axisOf(ax[0], len(x.dims))
	if a < 0 || a >= len(x.dims) {
		return tshape{}
	}
	return ranked(slices.Delete(slices.Clone(x.dims), a, a+1)...)
}

func fillShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	if v, ok := si.ints(n, 0); ok && len(v) <= maxRank {
		return ranked(slices.Clone(v)...)
	}
	if s := in(0); s.rank() == 1 && s.dims[0] >= 0 {
		return unknownDims(int(s.dims[0]))
	}
	return tshape{}
}

func tileShape(si *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	m, ok := si.ints(n, 1)
	if !x.ranked || !ok || len(m) != len(x.dims) {
		return sameRank(x)
	}
	out := make([]int64, len(m))
	for i, d := range x.dims {
		out[i] = -1
		if d >= 0 {
			out[i] = d * m[i]
		}
	}
	return ranked(out...)
}

// windowShape is the output of a 2-D convolution or pool: NHWC or NCHW,
// SAME or VALID padding, strides, dilations, the window from the filter
// (HWIO; HWIM for depthwise) or ksize.
func windowShape(_ *shapeInfer, n *tfNode, in func(int) tshape) tshape {
	x := in(0)
	if x.rank() != 4 {
		return unknownDims(4)
	}
	nchw := string(n.attr["data_format"].GetS()) == "NCHW"
	h, w, c := 1, 2, 3
	if nchw {
		c, h, w = 1, 2, 3
	}
	pick := func(name string) (int64, int64) {
		v := n.attr[name].GetList().GetI()
		if len(v) != 4 {
			return 1, 1
		}
		return v[h], v[w]
	}
	sh, sw := pick("strides")
	dh, dw := pick("dilations")
	kh, kw := pick("ksize")
	ch := x.dim(c)
	if strings.HasPrefix(n.op, "Conv") || strings.HasPrefix(n.op, "Depthwise") {
		f := in(1)
		kh, kw = f.dim(0), f.dim(1)
		ch = f.dim(3)
		if n.op == "DepthwiseConv2dNative" && ch >= 0 && f.dim(2) >= 0 {
			ch *= f.dim(2)
		} else if n.op == "DepthwiseConv2dNative" {
			ch = -1
		}
	}
	pad := string(n.attr["padding"].GetS())
	size := func(d, k, s, dil int64) int64 {
		switch {
		case d < 0 || s <= 0:
			return -1
		case pad == "SAME":
			return (d + s - 1) / s
		case pad == "VALID" && k >= 0:
			return (d-(k-1)*dil-1)/s + 1
		}
		return -1
	}
	out := make([]int64, 4)
	out[0], out[c] = x.dim(0), ch
	out[h], out[w] = size(x.dim(h), kh, sh, dh), size(x.dim(w), kw, sw, dw)
	return ranked(out...)
}
