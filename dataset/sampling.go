package dataset

import (
	"fmt"
	"math"
)

// Select picks n of the indices 0..total-1, at random but determined by
// seed alone, and returns them in increasing order (so files are read front
// to back). n <= 0 or n >= total selects everything. The generator is
// kiln's own (splitmix64 with Knuth's selection sampling), so picks do not
// change with the Go version.
func Select(n, total int, seed int64) []int {
	if total <= 0 {
		return nil
	}
	if n <= 0 || n >= total {
		n = total
	}
	out := make([]int, 0, n)
	if n == total {
		for i := range total {
			out = append(out, i)
		}
		return out
	}
	state := uint64(seed)
	for i := 0; i < total && len(out) < n; i++ {
		// Select i with probability (needed)/(remaining): Algorithm S.
		u := float64(splitmix64(&state)>>11) / (1 << 53)
		if float64(total-i)*u < float64(n-len(out)) {
			out = append(out, i)
		}
	}
	return out
}

func splitmix64(s *uint64) uint64 {
	*s += 0x9e3779b97f4a7c15
	z := *s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Split divides indices into disjoint calibration and validation sets.
// calib is a fraction of the indices when below 1 and a count otherwise.
// Calibration picks are spread evenly over indices, so a dataset sorted
// by class gives every class to both sets.
func Split(indices []int, calib float64) (calibration, validation []int, err error) {
	if calib < 0 || math.IsNaN(calib) || math.IsInf(calib, 0) {
		return nil, nil, fmt.Errorf("calibration share %v: want a fraction in [0,1) or a count", calib)
	}
	k := int(calib)
	if calib < 1 {
		k = int(math.Round(calib * float64(len(indices))))
	} else if calib != math.Trunc(calib) {
		return nil, nil, fmt.Errorf("calibration count %v is not a whole number", calib)
	}
	if k > len(indices) {
		return nil, nil, fmt.Errorf("calibration count %d is more than the %d samples", k, len(indices))
	}
	n := len(indices)
	next := 0 // position of the next calibration pick
	picked := 0
	for pos, idx := range indices {
		if picked < k && pos == next {
			calibration = append(calibration, idx)
			picked++
			next = picked * n / k
			continue
		}
		validation = append(validation, idx)
	}
	return calibration, validation, nil
}
