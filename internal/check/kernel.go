package check

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/internal/le"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// family groups the element types that compare with each other.
type family int

const (
	unsupported family = iota
	floats
	integers // and bool, read as 0 and 1
)

func isFloatType(dt onnx.DataType) bool {
	switch dt {
	case onnx.Float, onnx.Double, onnx.Float16, onnx.BFloat16:
		return true
	}
	return false
}

func typeFamily(dt onnx.DataType) family {
	switch dt {
	case onnx.Float, onnx.Double, onnx.Float16, onnx.BFloat16:
		return floats
	case onnx.Int8, onnx.Int16, onnx.Int32, onnx.Int64, onnx.Uint8, onnx.Uint16, onnx.Uint32, onnx.Uint64,
		onnx.Int4, onnx.Uint4, onnx.Bool:
		return integers
	}
	return unsupported
}

func dataFamily(data any) family {
	switch data.(type) {
	case []float32, []float64, []float16.Float16, []onnx.BF16:
		return floats
	case []int8, []int16, []int32, []int64, []uint8, []uint16, []uint32, []uint64, []bool:
		return integers
	}
	return unsupported
}

// families checks that both tensors hold real numbers of one family, their
// Go data agreeing with their element type.
func families(ref, got *onnx.Tensor) (family, error) {
	for _, t := range []struct {
		role string
		t    *onnx.Tensor
	}{{"reference", ref}, {"candidate", got}} {
		f := typeFamily(t.t.Type)
		if f == unsupported {
			return unsupported, fmt.Errorf("%s element type %s cannot be compared", t.role, t.t.Type)
		}
		if dataFamily(t.t.Data) != f {
			return unsupported, fmt.Errorf("%s element type %s holds %T data", t.role, t.t.Type, t.t.Data)
		}
	}
	if typeFamily(ref.Type) != typeFamily(got.Type) {
		return unsupported, fmt.Errorf("candidate element type %s (shape %v) cannot be compared with reference type %s (shape %v)",
			got.Type, got.Dims, ref.Type, ref.Dims)
	}
	return typeFamily(ref.Type), nil
}

// widen appends data's values as float64 to dst; data is one of the slices
// dataFamily accepts.
func widen(dst []float64, data any) []float64 {
	switch d := data.(type) {
	case []float32:
		return widenReal(dst, d)
	case []float64:
		return append(dst, d...)
	case []float16.Float16:
		dst = slices.Grow(dst, len(d))
		for _, v := range d {
			dst = append(dst, float64(v.Float32()))
		}
	case []onnx.BF16:
		dst = slices.Grow(dst, len(d))
		for _, v := range d {
			dst = append(dst, float64(v.Float32()))
		}
	case []int8:
		return widenReal(dst, d)
	case []int16:
		return widenReal(dst, d)
	case []int32:
		return widenReal(dst, d)
	case []int64:
		return widenReal(dst, d)
	case []uint8:
		return widenReal(dst, d)
	case []uint16:
		return widenReal(dst, d)
	case []uint32:
		return widenReal(dst, d)
	case []uint64:
		return widenReal(dst, d)
	case []bool:
		dst = slices.Grow(dst, len(d))
		for _, v := range d {
			dst = append(dst, float64(b2i(v)))
		}
	}
	return dst
}

func widenReal[T le.Real](dst []float64, src []T) []float64 {
	dst = slices.Grow(dst, len(src))
	for _, v := range src {
		dst = append(dst, float64(v))
	}
	return dst
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// elemStats are the elementwise statistics of one sample, or of all of
// them once merged. dot, rr and gg are the cosine's sums, per sample only.
type elemStats struct {
	finite, outside          int64
	nan, inf, refNaN, refInf int64
	sumAbs, maxAbs, maxRel   float64
	needATol, needRTol       float64
	unbounded                bool
	dot, rr, gg              float64
}

func (s *elemStats) merge(o elemStats) {
	s.finite += o.finite
	s.outside += o.outside
	s.nan += o.nan
	s.inf += o.inf
	s.refNaN += o.refNaN
	s.refInf += o.refInf
	s.sumAbs += o.sumAbs
	s.maxAbs = max(s.maxAbs, o.maxAbs)
	s.maxRel = max(s.maxRel, o.maxRel)
	s.needATol = max(s.needATol, o.needATol)
	s.needRTol = max(s.needRTol, o.needRTol)
	s.unbounded = s.unbounded || o.unbounded
	s.dot += o.dot
	s.rr += o.rr
	s.gg += o.gg
}

func (s *elemStats) countNonFinite(r, g float64) {
	switch {
	case math.IsNaN(g):
		s.nan++
	case math.IsInf(g, 0):
		s.inf++
	}
	switch {
	case math.IsNaN(r):
		s.refNaN++
	case math.IsInf(r, 0):
		s.refInf++
	}
}

// compareElems is the hot loop: one pass over a sample, in float64,
// without allocating. The running values are locals so that they stay in
// registers; divisions happen only when a maximum moves.
func compareElems[T float32 | float64](ref, got []T, atol, rtol float64) elemStats {
	var s elemStats // the non-finite counts, off the fast path
	var (
		sumAbs, maxAbs, maxRel, needATol, needRTol float64
		dot, rr, gg                                float64
		outside, skipped                           int64
		unbounded                                  bool
	)
	got = got[:len(ref)]
	for i, rv := range ref {
		r, g := float64(rv), float64(got[i])
		if (r-r)+(g-g) != 0 { // NaN or ±Inf on either side
			s.countNonFinite(r, g)
			skipped++
			continue
		}
		d, ar := math.Abs(g-r), math.Abs(r)
		sumAbs += d
		dot += r * g
		rr += r * r
		gg += g * g
		if d > maxAbs {
			maxAbs = d
		}
		e := d - rtol*ar
		if e > needATol {
			needATol = e
		}
		if e > atol {
			outside++
		}
		if ar > 0 {
			if d > maxRel*ar {
				maxRel = d / ar
			}
			if e := d - atol; e > needRTol*ar {
				needRTol = e / ar
			}
		} else if d > atol {
			unbounded = true
		}
	}
	s.finite, s.outside = int64(len(ref))-skipped, outside
	s.sumAbs, s.maxAbs, s.maxRel = sumAbs, maxAbs, maxRel
	s.needATol, s.needRTol, s.unbounded = needATol, needRTol, unbounded
	s.dot, s.rr, s.gg = dot, rr, gg
	return s
}

// cosine is the sample's cosine similarity from its sums; when they
// overflowed or underflowed (float64 data far from 1) it takes a second,
// scaled pass.
func cosine[T float32 | float64](ref, got []T, s elemStats) float64 {
	den := math.Sqrt(s.rr * s.gg)
	if den > 1e-290 && den <= math.MaxFloat64 && math.Abs(s.dot) <= math.MaxFloat64 {
		return math.Max(-1, math.Min(1, s.dot/den))
	}
	return cosineScaled(ref, got)
}

// cosineScaled scales ref and got, each by its own power of two, so that
// their largest finite magnitude is in [0.5, 1) before summing; cosine does
// not change when a side is scaled.
func cosineScaled[T float32 | float64](ref, got []T) float64 {
	var mr, mg float64
	for i, rv := range ref {
		r, g := float64(rv), float64(got[i])
		if (r-r)+(g-g) == 0 {
			mr, mg = max(mr, math.Abs(r)), max(mg, math.Abs(g))
		}
	}
	switch {
	case mr == 0 && mg == 0:
		return 1
	case mr == 0 || mg == 0:
		return 0
	}
	_, er := math.Frexp(mr)
	_, eg := math.Frexp(mg)
	var dot, rr, gg float64
	for i, rv := range ref {
		r, g := float64(rv), float64(got[i])
		if (r-r)+(g-g) != 0 {
			continue
		}
		r, g = math.Ldexp(r, -er), math.Ldexp(g, -eg)
		dot += r * g
		rr += r * r
		gg += g * g
	}
	return math.Max(-1, math.Min(1, dot/math.Sqrt(rr*gg)))
}

// compareBatch compares each sample of a batch whose shapes and ids
// layoutOf has checked.
func compareBatch[T float32 | float64](a *Accumulator, ref, got []T, ids []string, l layout) {
	for i, id := range ids {
		r, g := ref[i*l.size:(i+1)*l.size], got[i*l.size:(i+1)*l.size]
		if a.kind == KindPeaks {
			comparePeaks(a, r, g, id)
			continue
		}
		s := compareElems(r, g, a.th.ATol, a.th.RTol)
		a.addSample(id, l.size, s, cosine(r, g, s))
		switch {
		case a.kind == KindClassifier:
			n := rank(g, argmax(r))
			a.top1 += b2i(n == 0)
			a.top5 += b2i(n < 5)
		case a.kind == KindDense && a.mode == "argmax":
			p := l.size / l.channels
			a.agree += argmaxAgree(r, g, l.channels, p)
			a.pos += int64(p)
		case a.kind == KindDense:
			a.agree += maskAgree(r, g)
			a.pos += int64(l.size)
		}
	}
}

// comparePeaks compares one sample of a KindPeaks output: where the
// peaks are on each side, then the values where both have one.
func comparePeaks[T float32 | float64](a *Accumulator, r, g []T, id string) {
	m, k := peakMass(r, g, a.view)
	a.refMass, a.refKept = a.refMass+m, a.refKept+k
	m, k = peakMass(g, r, a.view)
	a.gotMass, a.gotKept = a.gotMass+m, a.gotKept+k
	a.peakRef, a.peakGot = colocated(a.peakRef, a.peakGot, r, g)
	s := compareElems(a.peakRef, a.peakGot, a.th.ATol, a.th.RTol)
	a.addSample(id, len(a.peakRef), s, cosine(a.peakRef, a.peakGot, s))
}

// argmax is the first index of v's largest value, NaN ranking last.
func argmax[T float32 | float64](v []T) int {
	best := -1
	for i, x := range v {
		if x == x && (best < 0 || x > v[best]) {
			best = i
		}
	}
	return max(best, 0)
}

// rank is v[k]'s place in v sorted from largest to smallest, ties broken
// by index and NaN last: 0 when k is v's argmax.
func rank[T float32 | float64](v []T, k int) int {
	if k >= len(v) {
		return len(v)
	}
	x := v[k]
	if x != x {
		return len(v)
	}
	n := 0
	for j, y := range v {
		if y > x || (y == x && j < k) {
			n++
		}
	}
	return n
}

// argmaxAgree counts the positions of a [c, p] sample where ref and got
// have the same argmax over c.
func argmaxAgree[T float32 | float64](ref, got []T, c, p int) int64 {
	var n int64
	for q := range p {
		if argmaxAt(ref, q, c, p) == argmaxAt(got, q, c, p) {
			n++
		}
	}
	return n
}

func argmaxAt[T float32 | float64](v []T, q, c, p int) int {
	best := -1
	var bv T
	for ch := range c {
		if x := v[ch*p+q]; x == x && (best < 0 || x > bv) {
			best, bv = ch, x
		}
	}
	return best
}

// maskAgree counts the elements on the same side of maskThreshold in ref
// and got; NaN is unset.
func maskAgree[T float32 | float64](ref, got []T) int64 {
	var n int64
	got = got[:len(ref)]
	for i, r := range ref {
		n += int64(b2i((r > maskThreshold) == (got[i] > maskThreshold)))
	}
	return n
}
