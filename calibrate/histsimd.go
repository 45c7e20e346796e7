//go:build goexperiment.simd && amd64

package calibrate

import "simd/archsimd"

// useSIMD says the histogram kernels may take their vector paths: this
// build has Go's SIMD experiment (GOEXPERIMENT=simd, as the Makefile
// builds) and the CPU has AVX. The vector paths compute each bin in float64
// exactly as the scalar ones do, four values at a time, so the counts are
// the same.
var useSIMD = archsimd.X86.AVX()

// simdMin is the shortest batch worth a vector path.
const simdMin = 16

// minMaxSIMD is minMaxScalar eight values at a time.
func minMaxSIMD(values []float32) (lo, hi float32, finite bool) {
	vlo := archsimd.LoadFloat32x8Slice(values)
	vhi, bad := vlo, archsimd.BroadcastFloat32x8(0)
	i := 0
	for ; i+8 <= len(values); i += 8 {
		v := archsimd.LoadFloat32x8Slice(values[i : i+8])
		bad = bad.Add(v.Sub(v)) // stays 0 while every value is finite
		vlo, vhi = vlo.Min(v), vhi.Max(v)
	}
	var l, h, b [8]float32
	vlo.Store(&l)
	vhi.Store(&h)
	bad.Store(&b)
	lo, hi, finite = reduceLanes(l[:], h[:], b[:])
	if i < len(values) {
		tlo, thi, tfinite := minMaxScalar(values[i:])
		lo, hi, finite = min(lo, tlo), max(hi, thi), finite && tfinite
	}
	lo, hi = zeroSigns(values, lo, hi)
	return lo, hi, finite
}

// reduceLanes combines the lanes of a vector scan: the min of l, the max
// of h, and whether every lane of bad is 0 (see minMaxSIMD).
func reduceLanes(l, h, bad []float32) (lo, hi float32, finite bool) {
	lo, hi, finite = l[0], h[0], true
	for j := range l {
		lo, hi = min(lo, l[j]), max(hi, h[j])
		finite = finite && bad[j] == 0
	}
	return lo, hi, finite
}

// countMinMaxSIMD is countMinMaxScalar four values at a time: the bins as
// countSIMD finds them (a NaN or infinity converts to the int32 minimum,
// which the cap puts in the last bin) and the min and max as minMaxSIMD
// finds them.
func countMinMaxSIMD(counts []uint64, values []float32, inv float64, d uint64) (lo, hi float32, finite bool) {
	invs := archsimd.BroadcastFloat64x4(inv)
	last := archsimd.BroadcastUint32x4(uint32(min(len(counts)-1, 1<<31-1)))
	zero := archsimd.BroadcastFloat32x4(0)
	vlo := archsimd.LoadFloat32x4Slice(values)
	vhi, bad := vlo, zero
	var k [4]uint32
	i := 0
	for ; i+4 <= len(values); i += 4 {
		v := archsimd.LoadFloat32x4Slice(values[i : i+4])
		bad = bad.Add(v.Sub(v)) // stays 0 while every value is finite
		vlo, vhi = vlo.Min(v), vhi.Max(v)
		v.Max(zero.Sub(v)).ConvertToFloat64().Mul(invs).ConvertToInt32().AsUint32x4().Min(last).Store(&k)
		counts[k[0]] += d
		counts[k[1]] += d
		counts[k[2]] += d
		counts[k[3]] += d
	}
	var l, h, b [4]float32
	vlo.Store(&l)
	vhi.Store(&h)
	bad.Store(&b)
	lo, hi, finite = reduceLanes(l[:], h[:], b[:])
	if i < len(values) {
		tlo, thi, tfinite := countMinMaxScalar(counts, values[i:], inv, d)
		lo, hi, finite = min(lo, tlo), max(hi, thi), finite && tfinite
	}
	lo, hi = zeroSigns(values, lo, hi)
	return lo, hi, finite
}

// countSIMD is countScalar four values at a time: |v| (the larger of v and
// -v) widened to float64, times inv, truncated to int32 and capped at the
// last bin.
func countSIMD(counts []uint64, values []float32, inv float64) {
	invs := archsimd.BroadcastFloat64x4(inv)
	last := archsimd.BroadcastUint32x4(uint32(min(len(counts)-1, 1<<31-1)))
	zero := archsimd.BroadcastFloat32x4(0)
	var k [4]uint32
	i := 0
	for ; i+4 <= len(values); i += 4 {
		v := archsimd.LoadFloat32x4Slice(values[i : i+4])
		v.Max(zero.Sub(v)).ConvertToFloat64().Mul(invs).ConvertToInt32().AsUint32x4().Min(last).Store(&k)
		counts[k[0]]++
		counts[k[1]]++
		counts[k[2]]++
		counts[k[3]]++
	}
	countScalar(counts, values[i:], inv)
}

// countReluSIMD is countReluScalar four values at a time (see countSIMD);
// ReLU's bin is that of max(v, 0), bin 0 for a negative v as in the scalar
// truncation toward zero.
func countReluSIMD(hc, rc []uint64, values []float32, inv, rinv float64) {
	invs, rinvs := archsimd.BroadcastFloat64x4(inv), archsimd.BroadcastFloat64x4(rinv)
	last := archsimd.BroadcastUint32x4(uint32(min(len(hc)-1, 1<<31-1)))
	rlast := archsimd.BroadcastUint32x4(uint32(min(len(rc)-1, 1<<31-1)))
	zero := archsimd.BroadcastFloat32x4(0)
	var k, kr [4]uint32
	i := 0
	for ; i+4 <= len(values); i += 4 {
		v := archsimd.LoadFloat32x4Slice(values[i : i+4])
		v.Max(zero.Sub(v)).ConvertToFloat64().Mul(invs).ConvertToInt32().AsUint32x4().Min(last).Store(&k)
		v.Max(zero).ConvertToFloat64().Mul(rinvs).ConvertToInt32().AsUint32x4().Min(rlast).Store(&kr)
		hc[k[0]]++
		hc[k[1]]++
		hc[k[2]]++
		hc[k[3]]++
		rc[kr[0]]++
		rc[kr[1]]++
		rc[kr[2]]++
		rc[kr[3]]++
	}
	countReluScalar(hc, rc, values[i:], inv, rinv)
}

// zeroSigns gives a min or max of zero the sign a first-of-equals scan
// gives it: that of the first zero of the batch. Vector min and max do not
// keep track of which zero they kept.
func zeroSigns(values []float32, lo, hi float32) (float32, float32) {
	if lo != 0 && hi != 0 {
		return lo, hi
	}
	for _, v := range values {
		if v == 0 {
			if lo == 0 {
				lo = v
			}
			if hi == 0 {
				hi = v
			}
			break
		}
	}
	return lo, hi
}
