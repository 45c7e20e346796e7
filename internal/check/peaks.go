package check

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// Peak describes an output that is a local-maximum map: x * (x ==
// MaxPool(x)), the peak extraction of CenterNet-style heads (MLSD's line
// centres, keypoint heatmaps). Such an output is zero except at the
// positions that are the largest of their pooling window, so a rounding
// that breaks a near-tie between neighbours moves a peak by a pixel and
// the elementwise metrics and cosine see a large error where a reader of
// the peaks sees none. KindPeaks outputs are judged by where their peaks
// are (peak agreement) and, at the positions that are peaks in both, by
// their values.
type Peak struct {
	// Kernel is the MaxPool's kernel_shape; a peak counts as kept when
	// the other side has one within Kernel/2 positions on every spatial
	// axis.
	Kernel []int64 `json:"kernel"`
	// PoolLayout says the output keeps the MaxPool input's layout
	// ([N,C,D1..Dk]: the spatial axes are the last len(Kernel)); false when
	// a Reshape or Transpose between them moved the axes, and the spatial
	// axes are then those of extent > 1.
	PoolLayout bool `json:"pool_layout,omitempty"`
}

// PeakOutputs finds the outputs of m's main graph computed as x *
// Cast(Equal(x, MaxPool(x))) (either operand order, shape-only ops such
// as Reshape, Transpose and Identity allowed between the parts), with
// unit strides, so that the check reads them as KindPeaks.
func PeakOutputs(m *onnx.Model) map[string]Peak {
	g := m.Graph()
	ix := onnx.NewIndex(g)
	out := map[string]Peak{}
	for _, o := range g.GetOutput() {
		if p, ok := peakOf(ix, o.GetName()); ok {
			out[o.GetName()] = p
		}
	}
	return out
}

func peakOf(ix *onnx.Index, out string) (Peak, bool) {
	mul := ix.Producer[out]
	if mul == nil || mul.GetOpType() != "Mul" || mul.GetDomain() != "" || len(mul.GetInput()) != 2 {
		return Peak{}, false
	}
	for i := range 2 {
		x, mask := mul.GetInput()[i], mul.GetInput()[1-i]
		c := ix.Producer[mask]
		if c == nil || c.GetOpType() != "Cast" || len(c.GetInput()) != 1 {
			continue
		}
		eq := ix.Producer[c.GetInput()[0]]
		if eq == nil || eq.GetOpType() != "Equal" || len(eq.GetInput()) != 2 {
			continue
		}
		root, moved := shapeRoot(ix, x)
		for j := range 2 {
			a, pooled := eq.GetInput()[j], eq.GetInput()[1-j]
			pr, _ := shapeRoot(ix, pooled)
			mp := ix.Producer[pr]
			if mp == nil || mp.GetOpType() != "MaxPool" || len(mp.GetInput()) != 1 {
				continue
			}
			if ar, _ := shapeRoot(ix, a); ar != root {
				continue
			}
			if mr, _ := shapeRoot(ix, mp.GetInput()[0]); mr != root {
				continue
			}
			if p, ok := poolPeak(mp); ok {
				p.PoolLayout = !moved
				return p, true
			}
		}
	}
	return Peak{}, false
}

// window names the kernel: "3x3".
func (p Peak) window() string {
	parts := make([]string, len(p.Kernel))
	for i, k := range p.Kernel {
		parts[i] = strconv.FormatInt(k, 10)
	}
	return strings.Join(parts, "x")
}

// shapeOps change how a tensor's values are laid out, not the values.
var shapeOps = map[string]bool{"Reshape": true, "Transpose": true, "Identity": true, "Squeeze": true,
	"Unsqueeze": true, "Flatten": true}

// shapeRoot follows name back through shape-only ops and returns the
// tensor they start from, and whether a layout op (anything but Identity)
// was passed.
func shapeRoot(ix *onnx.Index, name string) (string, bool) {
	moved := false
	for range 64 {
		n := ix.Producer[name]
		if n == nil || !shapeOps[n.GetOpType()] || n.GetDomain() != "" || len(n.GetInput()) == 0 {
			break
		}
		moved = moved || n.GetOpType() != "Identity"
		name = n.GetInput()[0]
	}
	return name, moved
}

// poolPeak reads a MaxPool's kernel; strides other than 1 or dilations
// would make its output smaller than its input, which Equal could not
// compare position by position.
func poolPeak(n *onnxpb.NodeProto) (Peak, bool) {
	var p Peak
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "kernel_shape":
			p.Kernel = slices.Clone(a.GetInts())
		case "strides", "dilations":
			for _, v := range a.GetInts() {
				if v != 1 {
					return Peak{}, false
				}
			}
		}
	}
	return p, len(p.Kernel) > 0
}

// peakView is how one sample of a KindPeaks output is read: as
// [outer, spatial..., inner], peaks matched within radius on each spatial
// axis.
type peakView struct {
	outer, inner int
	spatial      []int
	radius       []int
}

// viewOf places p's spatial axes in a sample of shape sample, or reports
// that they cannot be placed.
func (p Peak) viewOf(sample []int64) (peakView, bool) {
	k := len(p.Kernel)
	var axes []int
	if p.PoolLayout && len(sample) >= k {
		for i := len(sample) - k; i < len(sample); i++ {
			axes = append(axes, i)
		}
	} else {
		for i, d := range sample {
			if d > 1 {
				axes = append(axes, i)
			}
		}
	}
	if len(axes) != k || k == 0 || axes[k-1]-axes[0] != k-1 {
		return peakView{}, false
	}
	v := peakView{outer: 1, inner: 1}
	for i, d := range sample {
		switch {
		case i < axes[0]:
			v.outer *= int(d)
		case i > axes[k-1]:
			v.inner *= int(d)
		default:
			v.spatial = append(v.spatial, int(d))
			v.radius = append(v.radius, int(p.Kernel[i-axes[0]]/2))
		}
	}
	return v, true
}

// peakMass sums |v| over the non-zero finite values of one side and over
// those with a non-zero value of other within the view's radius.
func peakMass[T float32 | float64](side, other []T, v peakView) (mass, kept float64) {
	area := 1
	for _, d := range v.spatial {
		area *= d
	}
	coord := make([]int, len(v.spatial))
	for i, x := range side {
		f := math.Abs(float64(x))
		if x == 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			continue
		}
		mass += f
		inner, rest := i%v.inner, i/v.inner
		pos, outer := rest%area, rest/area
		for a := len(coord) - 1; a >= 0; a-- {
			coord[a], pos = pos%v.spatial[a], pos/v.spatial[a]
		}
		if nearPeak(other, v, coord, outer*area, inner) {
			kept += f
		}
	}
	return mass, kept
}

// nearPeak reports whether other has a non-zero value within the view's
// radius of coord (on the plane starting at base, column inner).
func nearPeak[T float32 | float64](other []T, v peakView, coord []int, base, inner int) bool {
	off := make([]int, len(coord))
	for a := range off {
		off[a] = -v.radius[a]
	}
	for {
		idx, ok := 0, true
		for a, c := range coord {
			q := c + off[a]
			if q < 0 || q >= v.spatial[a] {
				ok = false
				break
			}
			idx = idx*v.spatial[a] + q
		}
		if ok && other[(base+idx)*v.inner+inner] != 0 {
			return true
		}
		a := len(off) - 1
		for a >= 0 && off[a] == v.radius[a] {
			off[a] = -v.radius[a]
			a--
		}
		if a < 0 {
			return false
		}
		off[a]++
	}
}

// colocated copies the pairs that are peaks on both sides, or non-finite
// on either, into the buffers: the values the elementwise metrics and
// cosine of a KindPeaks output compare.
func colocated[T float32 | float64](dr, dg []float64, ref, got []T) ([]float64, []float64) {
	dr, dg = dr[:0], dg[:0]
	for i, r := range ref {
		g := got[i]
		rf, gf := float64(r), float64(g)
		if (r != 0 && g != 0) || (rf-rf)+(gf-gf) != 0 {
			dr, dg = append(dr, rf), append(dg, gf)
		}
	}
	return dr, dg
}
