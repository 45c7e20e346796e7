package calibrate

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// TestAddRelu: adding a batch to a histogram and its ReLU to another in
// one pass leaves both exactly as Add leaves them given the batch and
// ONNX Runtime's ReLU of it, through first widths, growth, signed zeros and
// non-finite values.
func TestAddRelu(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	nz := float32(math.Copysign(0, -1))
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(n int, mean, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + rng.NormFloat64()*scale)
		}
		return v
	}
	tests := []struct {
		name    string
		batches [][]float32
	}{
		{"random", [][]float32{random(5000, 0, 1), random(5000, 0, 1), random(5000, 0.5, 3), random(5000, -1, 1)}},
		{"negatives dominate", [][]float32{{-8, 1, 0.5}, {-2, 2, 0.25}, {-100, 0.1}}},
		{"all negative first", [][]float32{{-1, -2}, {-3, nz}, {1, -5}, {2, 0.5}}},
		{"all negative later", [][]float32{{1, -1}, {-1, -2}, {-2, nz}, {nz, -2}, {0, -1}, {-1, 0, nz}}},
		{"all zero", [][]float32{{0, nz}, {nz, 0}, {0}}},
		{"signed zeros", [][]float32{{1, -1}, {nz, 0, 0.5}, {-1, nz, 2}, {0.5, nz, -3, 0}, {nz, -1}}},
		{"top edge", [][]float32{{-4, 4, 2}, {4, -4, 4, 0.5}}},
		{"positive only", [][]float32{{1, 2}, {3, 0.5}, {2.5}}},
		{"nan", [][]float32{{1, -2}, {0.5, nan, 1}, {0.25}}},
		{"inf", [][]float32{{1, -2}, {0.5, -inf}, {inf, 1}, {2}}},
		{"empty", [][]float32{{}, {1, -1}, {}}},
	}
	for _, tc := range tests {
		tc.name, tc.batches = tc.name+" x37", tile(tc.batches)
		tests = append(tests, tc)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantH, wantR := NewHistogram(), NewHistogram()
			gotH, gotR := NewHistogram(), NewHistogram()
			for i, v := range tc.batches {
				rv := make([]float32, len(v))
				for j, x := range v {
					if rv[j] = x; x < 0 {
						rv[j] = 0 // ONNX Runtime's ReLU keeps -0
					}
				}
				errWant := addReference(wantH, v)
				if errWant == nil {
					errWant = addReference(wantR, rv)
				}
				errGot := addRelu(gotH, gotR, v)
				var nfWant, nfGot *NonFiniteError
				if errors.As(errWant, &nfWant) != errors.As(errGot, &nfGot) || nfWant != nil && nfWant.Index != nfGot.Index {
					t.Fatalf("batch %d: addRelu = %v, want %v", i, errGot, errWant)
				}
			}
			if d := sameHist(wantH, gotH); d != "" {
				t.Errorf("input histogram: %s differs", d)
			}
			if d := sameHist(wantR, gotR); d != "" {
				t.Errorf("ReLU histogram: %s differs (min %v max %v, want %v %v)", d, gotR.Min(), gotR.Max(), wantR.Min(), wantR.Max())
			}
		})
	}
}

// aliasModel hands a convolution's output on through every operator
// derive copies statistics for, with ReLUs of the original and of a copy.
func aliasModel() *onnxpb.ModelProto {
	b := testmodels.NewBuilder("aliases", 1)
	x := b.Input("images", onnx.Float, "N", 3, 8, 8)
	c := b.Node("Conv", []string{x, b.He("w", 27, 4, 3, 3, 3), b.RandNormal("b", 0.1, 4)}, testmodels.Ints("kernel_shape", 3, 3), testmodels.Ints("pads", 1, 1, 1, 1))
	a := b.Node("Identity", []string{c})
	a = b.Node("Flatten", []string{a}, testmodels.Int("axis", 1))
	r := b.Node("Relu", []string{a})
	a = b.Node("Dropout", []string{r})
	a = b.Node("Reshape", []string{a, b.Init("shape", []int64{4}, []int64{-1, 4, 8, 8})})
	a = b.Node("Add", []string{a, b.Node("Relu", []string{c})})
	b.Rename("out")
	b.Output("out", onnx.Float, "N", 4, 8, 8)
	return b.Model(13, 7)
}

// TestCollectDerived: statistics of tensors derived from others (ReLU
// outputs, reshaped copies) are bit for bit those of the tensors fetched
// from ONNX Runtime, on real models and data, and a NaN still names the
// tensor and sample.
func TestCollectDerived(t *testing.T) {
	initORT(t)
	tests := []struct {
		name  string
		proto *onnxpb.ModelProto
		dims  []int64
		n     int
	}{
		{"classifier", testmodels.Classifier(1), []int64{3, 32, 32}, 96},
		{"resnetish", testmodels.ResNetish(16, 1), []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, 40},
		{"aliases", aliasModel(), []int64{3, 8, 8}, 64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &onnx.Model{Proto: tc.proto}
			names, err := Observed(m)
			if err != nil {
				t.Fatal(err)
			}
			if d := derive(m, names); len(d.relu) == 0 || tc.name == "aliases" && len(d.alias) != 4 {
				t.Fatalf("derive = %d ReLUs, aliases %v; want the model's", len(d.relu), d.alias)
			}
			// Batches of different scales make later batches grow
			// the histograms.
			var batches []*dataset.Batch
			for i, scale := range []float32{0.5, 1, 3, 1} {
				src := memSource{input: "images", dims: tc.dims, seed: uint64(i + 1), n: tc.n / 4}
				for _, b := range batchesOf(t, src, m.Inputs()) {
					for _, x := range b.Tensors {
						for j := range x.Data.([]float32) {
							x.Data.([]float32)[j] *= scale
						}
					}
					batches = append(batches, b)
				}
			}
			collect := func(derive bool) *Stats {
				deriveTensors = derive
				defer func() { deriveTensors = true }()
				st, err := Collect(context.Background(), m, replay(batches), CollectOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			want, got := collect(false), collect(true)
			if !slices.Equal(want.Tensors, got.Tensors) || !slices.Equal(want.IDs, got.IDs) || want.Samples != got.Samples {
				t.Fatalf("Collect derived: tensors %v, samples %d, want %v, %d", got.Tensors, got.Samples, want.Tensors, want.Samples)
			}
			for _, n := range want.Tensors {
				if want.Seen[n] != got.Seen[n] {
					t.Errorf("tensor %s: seen %d, want %d", n, got.Seen[n], want.Seen[n])
				}
				if d := sameHist(want.Hist[n], got.Hist[n]); d != "" {
					t.Errorf("tensor %s: %s differs", n, d)
				}
			}
			rw, err := want.Ranges(Entropy, MethodOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rg, err := got.Ranges(Entropy, MethodOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range rw.Tensors {
				if rw.Tensors[i] != rg.Tensors[i] {
					t.Errorf("range %d = %+v, want %+v", i, rg.Tensors[i], rw.Tensors[i])
				}
			}

			// A NaN in one sample's input.
			nanBatch := *batches[1]
			nanBatch.Tensors = map[string]*onnx.Tensor{}
			for k, x := range batches[1].Tensors {
				c := *x
				v := slices.Clone(x.Data.([]float32))
				v[len(v)/2+7] = float32(math.NaN())
				c.Data = v
				nanBatch.Tensors[k] = &c
			}
			withNaN := []*dataset.Batch{batches[0], &nanBatch, batches[2]}
			errOf := func(derive bool) *ActivationError {
				deriveTensors = derive
				defer func() { deriveTensors = true }()
				_, err := Collect(context.Background(), m, replay(withNaN), CollectOptions{})
				var ae *ActivationError
				if !errors.As(err, &ae) {
					t.Fatalf("Collect with a NaN = %v, want an *ActivationError", err)
				}
				return ae
			}
			ew, eg := errOf(false), errOf(true)
			if ew.Tensor != eg.Tensor || ew.Sample != eg.Sample {
				t.Errorf("Collect with a NaN, derived: tensor %q sample %s, want %q %s", eg.Tensor, eg.Sample, ew.Tensor, ew.Sample)
			}
		})
	}
}

// TestCollectScalars: scalar activations (a LayerNorm-style graph with
// constant exponents and a mean over everything) are collected; the ONNX
// Runtime binding cannot return them unless their rank is declared.
func TestCollectScalars(t *testing.T) {
	initORT(t)
	b := testmodels.NewBuilder("scalars", 1)
	x := b.Input("images", onnx.Float, "N", 3, 8, 8)
	two := b.Node("Constant", nil, testmodels.Float("value_float", 2))
	sq := b.Node("Pow", []string{x, two})
	mean := b.Node("ReduceMean", []string{sq}, testmodels.Int("keepdims", 0))
	eps := b.Node("Add", []string{mean, b.Init("eps", nil, []float32{1e-5})})
	b.Node("Div", []string{x, b.Node("Sqrt", []string{eps})})
	b.Rename("out")
	b.Output("out", onnx.Float, "N", 3, 8, 8)
	m := &onnx.Model{Proto: b.Model(13, 7)}
	src := memSource{input: "images", dims: []int64{3, 8, 8}, seed: 1, n: 8}
	st, err := Collect(context.Background(), m, replay(batchesOf(t, src, m.Inputs())), CollectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{two, sq, mean, eps, "out"} {
		h := st.Hist[n]
		if h == nil || h.Count() == 0 {
			t.Errorf("tensor %s: no statistics", n)
		}
	}
	// Pow(x, 2) is at least 0, and its mean is one value per run.
	if h := st.Hist[mean]; h.Count() < 1 || h.Count() > 8 || h.Min() < 0 {
		t.Errorf("mean: %d values, min %v; want 1 to 8 values >= 0", h.Count(), h.Min())
	}
}

// computedWeights is a model whose weights are computed from initializers
// (a transposed matrix, a filled bias), as exported graphs and ONNX's light
// test models have them.
func computedWeights() *onnxpb.ModelProto {
	b := testmodels.NewBuilder("computed", 1)
	x := b.Input("x", onnx.Float, "N", 16)
	wt := b.Node("Transpose", []string{b.RandNormal("wt", 0.5, 8, 16)})
	bias := b.Node("ConstantOfShape", []string{b.Init("bshape", []int64{1}, []int64{8})},
		testmodels.Tensor("value", []int64{1}, []float32{0.25}))
	h := b.Node("Add", []string{b.Node("MatMul", []string{x, wt}), bias})
	b.Node("Relu", []string{h})
	b.Rename("y")
	b.Output("y", onnx.Float, "N", 8)
	return b.Model(13, 7)
}

// TestCollectInputFree: tensors that do not depend on the inputs are
// fetched with the first run only, yet every sample counts as seen and
// every method picks the range it picks when they are fetched every batch.
func TestCollectInputFree(t *testing.T) {
	initORT(t)
	m := &onnx.Model{Proto: computedWeights()}
	names, err := Observed(m)
	if err != nil {
		t.Fatal(err)
	}
	free := inputFree(m, names)
	if len(free) != 2 {
		t.Fatalf("inputFree = %v, want the transposed weight and the bias", free)
	}
	var batches []*dataset.Batch
	for i := range 4 {
		batches = append(batches, batchesOf(t, memSource{input: "x", dims: []int64{16}, seed: uint64(i + 1), n: 8}, m.Inputs())...)
	}
	collect := func(once bool) *Stats {
		fetchFreeOnce = once
		defer func() { fetchFreeOnce = true }()
		st, err := Collect(context.Background(), m, replay(batches), CollectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	every, once := collect(false), collect(true)
	checkCounts(t, every)
	checkCounts(t, once)
	// The input's statistics cover every batch (ONNX Runtime does not
	// write a graph input fetched as an output into reused memory).
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, b := range batches {
		for _, v := range b.Tensors["x"].Data.([]float32) {
			lo, hi = min(lo, float64(v)), max(hi, float64(v))
		}
	}
	for _, st := range []*Stats{every, once} {
		if h := st.Hist["x"]; h.Min() != lo || h.Max() != hi || h.Count() != uint64(16*st.Samples) {
			t.Errorf("input x: min %v max %v over %d values, want %v %v over %d", h.Min(), h.Max(), h.Count(), lo, hi, 16*st.Samples)
		}
	}
	for n := range free {
		if once.Seen[n] != once.Samples || every.Seen[n] != every.Samples {
			t.Errorf("tensor %s: seen %d (every batch: %d), want all %d samples", n, once.Seen[n], every.Seen[n], once.Samples)
		}
		// One run's values: the 8x16 weight or the 8 biases.
		if got := once.Hist[n].Count(); got != 128 && got != 8 {
			t.Errorf("tensor %s: %d values, want one run's (8 or 128)", n, got)
		}
		if every.Hist[n].Count()%once.Hist[n].Count() != 0 || every.Hist[n].Count() == once.Hist[n].Count() {
			t.Errorf("tensor %s: %d values fetched every run, want a multiple of one run's %d", n, every.Hist[n].Count(), once.Hist[n].Count())
		}
	}
	for _, method := range Methods() {
		want, err := every.Ranges(method, MethodOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := once.Ranges(method, MethodOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Tensors) != len(want.Tensors) {
			t.Fatalf("%s: %d ranges, want %d", method, len(got.Tensors), len(want.Tensors))
		}
		for i, w := range want.Tensors {
			if g := got.Tensors[i]; g.Tensor != w.Tensor || g.Amax != w.Amax {
				t.Errorf("%s: tensor %s amax %v, want %s %v", method, g.Tensor, g.Amax, w.Tensor, w.Amax)
			}
		}
	}
}

// TestCollectChunked: running a batch a few samples at a time (the first run
// one sample) leaves exactly the statistics of running it whole.
func TestCollectChunked(t *testing.T) {
	initORT(t)
	for _, tc := range []struct {
		name  string
		proto *onnxpb.ModelProto
		dims  []int64
	}{
		{"classifier", testmodels.Classifier(1), []int64{3, 32, 32}},
		{"resnetish", testmodels.ResNetish(16, 1), []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &onnx.Model{Proto: tc.proto}
			if !splittable(m) {
				t.Fatal("splittable = false for a model with a free batch dimension")
			}
			var batches []*dataset.Batch
			for i, scale := range []float32{0.5, 3, 1} {
				for _, b := range batchesOf(t, memSource{input: "images", dims: tc.dims, seed: uint64(i + 1), n: 24}, m.Inputs()) {
					for _, x := range b.Tensors {
						for j := range x.Data.([]float32) {
							x.Data.([]float32)[j] *= scale
						}
					}
					batches = append(batches, b)
				}
			}
			collect := func(run int) *Stats {
				st, err := Collect(context.Background(), m, replay(batches), CollectOptions{RunSamples: run})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			whole := collect(-1)
			for _, run := range []int{0, 1, 5} {
				got := collect(run)
				checkCounts(t, got)
				if !slices.Equal(whole.IDs, got.IDs) || whole.Samples != got.Samples {
					t.Fatalf("RunSamples %d: samples %d %v, want %d %v", run, got.Samples, got.IDs, whole.Samples, whole.IDs)
				}
				for _, n := range whole.Tensors {
					if d := sameHist(whole.Hist[n], got.Hist[n]); d != "" || whole.Seen[n] != got.Seen[n] {
						t.Errorf("RunSamples %d: tensor %s: %s differs (seen %d, want %d)", run, n, d, got.Seen[n], whole.Seen[n])
					}
				}
			}
			// A NaN in one sample, of the first batch (scanned first)
			// or a later one, is named by that sample.
			for _, at := range []struct{ batch, sample int }{{0, 0}, {0, 17}, {1, 9}} {
				for _, run := range []int{-1, 0, 5} {
					bad := slices.Clone(batches)
					b := *bad[at.batch]
					x := *b.Tensors["images"]
					v := slices.Clone(x.Data.([]float32))
					v[at.sample*len(v)/len(b.IDs)+3] = float32(math.NaN())
					x.Data = v
					b.Tensors = map[string]*onnx.Tensor{"images": &x}
					bad[at.batch] = &b
					_, err := Collect(context.Background(), m, replay(bad), CollectOptions{RunSamples: run})
					var ae *ActivationError
					if !errors.As(err, &ae) || ae.Tensor != "images" || ae.Sample != b.IDs[at.sample] {
						t.Errorf("RunSamples %d, NaN in sample %s: %v, want an *ActivationError for images in that sample", run, b.IDs[at.sample], err)
					}
				}
			}
		})
	}
}

// checkCounts: every histogram of st has counted each value it recorded
// exactly once.
func checkCounts(t *testing.T, st *Stats) {
	t.Helper()
	for name, h := range st.Hist {
		sum := h.zeros
		for _, c := range h.Counts() {
			sum += c
		}
		if sum != h.Count() {
			t.Errorf("tensor %s: %d values in the bins, %d recorded", name, sum, h.Count())
		}
	}
}
