//go:build !(goexperiment.simd && amd64)

package calibrate

// useSIMD is false without Go's SIMD experiment (see histsimd.go): the
// scalar kernels do all the work.
const useSIMD = false

const simdMin = 16

func minMaxSIMD(values []float32) (float32, float32, bool) { return minMaxScalar(values) }

func countMinMaxSIMD(counts []uint64, values []float32, inv float64, d uint64) (float32, float32, bool) {
	return countMinMaxScalar(counts, values, inv, d)
}

func countSIMD(counts []uint64, values []float32, inv float64) { countScalar(counts, values, inv) }

func countReluSIMD(hc, rc []uint64, values []float32, inv, rinv float64) {
	countReluScalar(hc, rc, values, inv, rinv)
}
