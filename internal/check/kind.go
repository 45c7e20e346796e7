package check

// KindOf classifies an output from its dims, -1 standing for a dynamic one;
// batched says dim 0 is the batch dim. A sample (the dims after the batch
// dim, or all of them when unbatched) shaped [C] or [C,1,1] with C > 1 is a
// classifier; a batched sample of rank 3 or more ([N,C,H,W]), a batched
// [N,1,L] mask or an unbatched sample of rank 3 or more is dense; anything
// else, [N,T,C] sequences included, is other.
//
// KindOf reads only the shape: either the signature's or the first batch's
// concrete dims will do. The signature cannot tell a dynamic class dim from
// C == 1, so [N,-1] is KindOther; serve classifies with the first batch's
// concrete dims for that reason. The element type is not part of the shape:
// the Accumulator treats integer and bool outputs as KindOther whatever kind
// it was given.
func KindOf(shape []int64, batched bool) Kind {
	sample := shape
	if batched {
		if len(shape) == 0 {
			return KindOther
		}
		sample = shape[1:]
	}
	switch {
	case classes(sample) > 1:
		return KindClassifier
	case channelsLast(sample, batched):
		// [N,H,W,C] with a few channels last (TensorFlow's layout): the
		// argmax and mask agreement read the channels on dimension 1, so
		// they would compare rows of pixels; the elementwise metrics judge it.
		return KindOther
	case batched && len(sample) == 2 && sample[0] != 1:
		// [N,A,B] is as often a sequence ([N,T,classes] of a CTC
		// recognizer, [N,L,D] hidden states) as a mask; only [N,1,L] is
		// read as a mask, the rest by the elementwise metrics.
		return KindOther
	case batched && len(sample) >= 2, !batched && len(sample) >= 3:
		return KindDense
	}
	return KindOther
}

// classes returns C for a sample shaped [C] or [C,1,1], and 0 for any other
// sample shape.
func classes(sample []int64) int64 {
	switch {
	case len(sample) == 1:
		return sample[0]
	case len(sample) == 3 && sample[1] == 1 && sample[2] == 1:
		return sample[0]
	}
	return 0
}

// channelsLast reports whether a rank-3 sample looks like H,W,C: its last
// dimension known and smaller than the two before it, which are larger
// than 1 ([160,160,4], [160,160,1]).
func channelsLast(sample []int64, batched bool) bool {
	if !batched || len(sample) != 3 {
		return false
	}
	h, w, c := sample[0], sample[1], sample[2]
	return c > 0 && h > 1 && w > 1 && c < h && c < w
}
