package check

import (
	"fmt"
	"testing"
)

func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		shape   []int64
		batched bool
		want    Kind
	}{
		{[]int64{8, 1000}, true, KindClassifier},
		{[]int64{-1, 1000}, true, KindClassifier},
		{[]int64{8, 1000, 1, 1}, true, KindClassifier},
		{[]int64{1000}, false, KindClassifier},
		{[]int64{1000, 1, 1}, false, KindClassifier},
		{[]int64{8, 1}, true, KindOther},  // one score: regression
		{[]int64{8, -1}, true, KindOther}, // class dim unknown in the signature
		{[]int64{1}, false, KindOther},
		{[]int64{8}, true, KindOther},
		{[]int64{}, true, KindOther},
		{[]int64{}, false, KindOther},
		{[]int64{1, 1, 640, 640}, true, KindDense},
		{[]int64{-1, 1, -1, -1}, true, KindDense},
		{[]int64{8, 19, 64, 64}, true, KindDense},
		{[]int64{8, 4, 100}, true, KindOther},    // [N,T,C] of a sequence model, or [N,L,D]
		{[]int64{8, 64, 64}, true, KindOther},    // a mask without a channel reads as a sequence
		{[]int64{8, 1, 100}, true, KindDense},    // [N,1,L] mask
		{[]int64{-1, -1, 6625}, true, KindOther}, // PP-OCR's recognizer: [N,T,6625] softmax
		{[]int64{1000, 1, 2}, false, KindDense},
		{[]int64{8, 1000, 1, 2}, true, KindDense},
		{[]int64{1, 160, 160, 4}, true, KindOther}, // NHWC regression map (MLSD's offsets)
		{[]int64{1, 160, 160, 1}, true, KindOther}, // NHWC mask: dimension 1 is not its channel
		{[]int64{1, 3, 160, 160}, true, KindDense},
		{[]int64{64, 64}, false, KindOther}, // unbatched rank 2: a matrix, not a map
	} {
		t.Run(fmt.Sprint(tc.shape, tc.batched), func(t *testing.T) {
			if got := KindOf(tc.shape, tc.batched); got != tc.want {
				t.Errorf("KindOf(%v, %v) = %s, want %s", tc.shape, tc.batched, got, tc.want)
			}
		})
	}
}
