package savedmodel_test

import (
	"testing"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// cudnnParams builds the params buffer in the graph as Keras's cuDNN
// path does (gru_lstm_utils canonical_to_params): the kernels split per
// gate, each transposed to [units, in] and flattened, then the biases;
// LSTM gives cuDNN zero input biases and Keras's bias as the recurrent
// ones, GRU swaps Keras's z,r to cuDNN's r,z.
func cudnnParams(g *smtest.Graph, w rnnWeights) string {
	gates, u := 4, int64(w.units)
	if w.gru {
		gates = 3
	}
	k := g.ResourceVariable("rnn/kernel", []int64{int64(w.in), int64(gates) * u}, f32v(w.kernel))
	r := g.ResourceVariable("rnn/recurrent_kernel", []int64{u, int64(gates) * u}, f32v(w.rec))
	flat := g.Ints("flat", -1)
	split := func(name, v string, axis int32, n int) []string {
		g.Node(name, "Split", smtest.Attrs{"num_split": smtest.Int64(int64(n))}, g.Int(name+"/axis", axis), v)
		out := []string{name}
		for i := 1; i < n; i++ {
			out = append(out, name+":"+string(rune('0'+i)))
		}
		return out
	}
	order := []int{0, 1, 2, 3}
	var b []string
	if w.gru {
		order = []int{1, 0, 2}
		bias := g.ResourceVariable("rnn/bias", []int64{2, 3 * u}, f32v(w.bias))
		bs := split("split_b", g.Node("bias_flat", "Reshape", nil, bias, flat), 0, 6)
		b = []string{bs[1], bs[0], bs[2], bs[4], bs[3], bs[5]}
	} else {
		bias := g.ResourceVariable("rnn/bias", []int64{4 * u}, f32v(w.bias))
		full := g.Node("full_bias", "ConcatV2", smtest.Attrs{"N": smtest.Int64(2)}, g.Node("zeros_b", "ZerosLike", attrF, bias), bias, g.Int("axis0", 0))
		b = split("split_b", full, 0, 8)
	}
	var parts []string
	for _, m := range []struct{ name, v string }{{"k", k}, {"r", r}} {
		s := split("split_"+m.name, m.v, 1, gates)
		for _, i := range order {
			t := g.Node(m.name+"/t"+string(rune('0'+i)), "Transpose", nil, s[i], g.Ints(m.name+"/perm"+string(rune('0'+i)), 1, 0))
			parts = append(parts, g.Node(m.name+"/flat"+string(rune('0'+i)), "Reshape", nil, t, flat))
		}
	}
	parts = append(parts, b...)
	return g.Node("params", "ConcatV2", smtest.Attrs{"N": smtest.Int64(int64(len(parts)))}, append(parts, g.Int("axis_p", 0))...)
}

// TestCudnnRNN checks CudnnRNN(V2/V3), fed the params buffer Keras builds
// from its kernels, against the Keras cell equations: the buffer's gate
// order and blocks decide every value.
func TestCudnnRNN(t *testing.T) {
	const batch, steps, in, units = 2, 4, 3, 5
	for _, tc := range []struct {
		name, op string
		gru      bool
		batchMaj bool
		lens     []int32
	}{
		{"LSTM", "CudnnRNN", false, false, nil},
		{"GRU", "CudnnRNNV2", true, false, nil},
		{"LSTM V3 batch-major with sequence_lengths", "CudnnRNNV3", false, true, []int32{steps, 2}},
		{"GRU V3 with sequence_lengths", "CudnnRNNV3", true, false, []int32{3, steps}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := randomRNN(tc.gru, in, units)
			x := random(0.9, batch, steps, in) // batch-major, as Keras takes it
			h0, c0 := random(0.45, batch, units), random(0.55, batch, units)
			g := &smtest.Graph{}
			xDims := []int64{steps, batch, in}
			if tc.batchMaj {
				xDims = []int64{batch, steps, in}
			}
			g.Placeholder("x", dtF, xDims)
			axis := int32(0)
			if tc.batchMaj {
				axis = 1
			}
			state := func(name string, v nd) string {
				return g.Node(name+"/expand", "ExpandDims", nil, g.Floats(name, []int64{batch, units}, f32s(v)...), g.Int(name+"/axis", axis))
			}
			ins := []string{"x", state("h0", h0), state("c0", c0), cudnnParams(g, w)}
			if tc.lens != nil {
				ins = append(ins, g.Ints("lens", tc.lens...))
			}
			hShape := []int64{1, batch, units}
			attrs := smtest.Attrs{"T": smtest.Type(dtF), "rnn_mode": smtest.Str(map[bool]string{false: "lstm", true: "gru"}[tc.gru]),
				"input_mode": smtest.Str("linear_input"), "direction": smtest.Str("unidirectional"), "is_training": smtest.Bool(false),
				"_output_shapes": smtest.Shapes(nil, hShape, hShape, nil)}
			if tc.op == "CudnnRNNV3" {
				attrs["time_major"] = smtest.Bool(!tc.batchMaj)
			}
			g.Node("rnn", tc.op, attrs, ins...)
			dir := t.TempDir()
			err := g.Write(dir, smtest.Signature{
				Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: dtF, Dims: xDims}},
				Outputs: map[string]smtest.Arg{"y": {Tensor: "rnn:0", DType: dtF}, "h": {Tensor: "rnn:1", DType: dtF}, "c": {Tensor: "rnn:2", DType: dtF}},
			})
			if err != nil {
				t.Fatal(err)
			}
			feed := x
			if !tc.batchMaj {
				feed = transpose(x, 1, 0, 2)
			}
			c, got := importRun(t, dir, savedmodel.ConvertOptions{}, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: xDims, Data: f32s(feed)}})
			want := map[bool]string{false: "LSTM", true: "GRU"}[tc.gru]
			if n := c.Model.OpCounts()[want]; n != 1 {
				t.Errorf("%s nodes = %d, want 1", want, n)
			}
			seq, h, cs := runLengths(w, x, rows(h0), rows(c0), tc.lens)
			if !tc.batchMaj {
				seq = transpose(seq, 1, 0, 2)
			}
			compare(t, "y", floats(t, got["y"]), seq.v, 1e-5)
			compare(t, "h", floats(t, got["h"]), flat(h), 1e-5)
			if !tc.gru {
				compare(t, "c", floats(t, got["c"]), flat(cs), 1e-5)
			}
		})
	}
}

// runLengths runs each batch row over its first lens[n] steps; later
// outputs stay zero, as cuDNN leaves them.
func runLengths(w rnnWeights, x nd, h0, c0 [][]float64, lens []int32) (nd, [][]float64, [][]float64) {
	if lens == nil {
		return w.run(x, h0, c0)
	}
	b, t := x.d[0], x.d[1]
	seq := newND(b, t, w.units)
	var hs, cs [][]float64
	for n := range b {
		row := nd{d: []int{1, int(lens[n]), w.in}, v: x.v[x.off(n, 0, 0) : x.off(n, 0, 0)+int(lens[n])*w.in]}
		s, h, c := w.run(row, h0[n:n+1], c0[n:n+1])
		copy(seq.v[seq.off(n, 0, 0):], s.v)
		hs, cs = append(hs, h[0]), append(cs, c[0])
	}
	return seq, hs, cs
}

func TestCudnnRNNErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		attrs smtest.Attrs
		want  string
	}{
		{"bidirectional", smtest.Attrs{"direction": smtest.Str("bidirectional")}, `direction "bidirectional"`},
		{"no shapes", smtest.Attrs{}, "num_units and input_size are unknown"},
		{"projection", smtest.Attrs{"num_proj": smtest.Int64(2)}, "num_proj 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &smtest.Graph{}
			g.Placeholder("x", dtF, nil)
			g.Node("rnn", "CudnnRNN", tc.attrs, "x", g.Floats("h", nil, 0), g.Floats("c", nil, 0), g.Floats("p", []int64{2}, 0, 0))
			dir := t.TempDir()
			if err := g.Write(dir, smtest.Signature{
				Inputs:  map[string]smtest.Arg{"x": {Tensor: "x:0", DType: dtF}},
				Outputs: map[string]smtest.Arg{"y": {Tensor: "rnn:0", DType: dtF}},
			}); err != nil {
				t.Fatal(err)
			}
			wantErr(t, convertDir(dir, savedmodel.ConvertOptions{}), tc.want, "node rnn (op CudnnRNN")
		})
	}
}
