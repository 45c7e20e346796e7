package savedmodel_test

import "math"

// Keras's recurrent cells in plain Go (keras/layers/rnn lstm.py and
// gru.py, standard implementations), for checking the imported While
// loops and CudnnRNN ops against equations that never went through ONNX.

func sigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

// rnnWeights are a Keras layer's kernel [in, g·units], recurrent_kernel
// [units, g·units] and bias ([g·units]; GRU reset_after: [2, 3·units]),
// row-major, gates in Keras order (LSTM i,f,c,o; GRU z,r,h).
type rnnWeights struct {
	in, units   int
	kernel, rec []float64
	bias        []float64
	gru         bool
}

// gates is x·kernel (or h·recurrent_kernel) plus bias row b, for one
// batch row.
func (w rnnWeights) gates(v []float64, m []float64, bias []float64) []float64 {
	g := len(m) / len(v)
	out := make([]float64, g)
	copy(out, bias)
	for j := range g {
		for k, x := range v {
			out[j] += x * m[k*g+j]
		}
	}
	return out
}

// run applies the cell over x [batch, time, in] from h0 (and c0) given per
// batch row, returning every step's h [batch, time, units] and the last
// h and c.
func (w rnnWeights) run(x nd, h0, c0 [][]float64) (seq nd, h, c [][]float64) {
	b, t, u := x.d[0], x.d[1], w.units
	seq = newND(b, t, u)
	h, c = clone2(h0), clone2(c0)
	for n := range b {
		for s := range t {
			xt := x.v[x.off(n, s, 0) : x.off(n, s, 0)+w.in]
			if w.gru {
				h[n] = w.gruStep(xt, h[n])
			} else {
				h[n], c[n] = w.lstmStep(xt, h[n], c[n])
			}
			copy(seq.v[seq.off(n, s, 0):], h[n])
		}
	}
	return seq, h, c
}

func (w rnnWeights) lstmStep(x, h, c []float64) ([]float64, []float64) {
	u := w.units
	zx := w.gates(x, w.kernel, w.bias)
	zh := w.gates(h, w.rec, nil)
	nh, nc := make([]float64, u), make([]float64, u)
	for j := range u {
		i := sigmoid(zx[j] + zh[j])
		f := sigmoid(zx[u+j] + zh[u+j])
		g := math.Tanh(zx[2*u+j] + zh[2*u+j])
		o := sigmoid(zx[3*u+j] + zh[3*u+j])
		nc[j] = f*c[j] + i*g
		nh[j] = o * math.Tanh(nc[j])
	}
	return nh, nc
}

// gruStep is GRU with reset_after=True: the reset gate scales the
// recurrent candidate after its bias.
func (w rnnWeights) gruStep(x, h []float64) []float64 {
	u := w.units
	mx := w.gates(x, w.kernel, w.bias[:3*u])
	mh := w.gates(h, w.rec, w.bias[3*u:])
	nh := make([]float64, u)
	for j := range u {
		z := sigmoid(mx[j] + mh[j])
		r := sigmoid(mx[u+j] + mh[u+j])
		hh := math.Tanh(mx[2*u+j] + r*mh[2*u+j])
		nh[j] = z*h[j] + (1-z)*hh
	}
	return nh
}

func clone2(a [][]float64) [][]float64 {
	out := make([][]float64, len(a))
	for i := range a {
		out[i] = append([]float64(nil), a[i]...)
	}
	return out
}

func rows(a nd) [][]float64 {
	n := a.d[len(a.d)-1]
	var out [][]float64
	for i := 0; i < len(a.v); i += n {
		out = append(out, a.v[i:i+n])
	}
	return out
}

func flat(a [][]float64) []float64 {
	var out []float64
	for _, r := range a {
		out = append(out, r...)
	}
	return out
}
