package savedmodel_test

import "math"

// Reference implementations of TensorFlow ops in plain Go, for checking
// what ONNX Runtime computes from kiln's import against values derived
// without ONNX.

// nd is a row-major array.
type nd struct {
	d []int
	v []float64
}

func newND(d ...int) nd {
	n := 1
	for _, x := range d {
		n *= x
	}
	return nd{d: d, v: make([]float64, n)}
}

func ndOf(v []float32, d ...int) nd {
	a := newND(d...)
	for i := range a.v {
		a.v[i] = float64(v[i])
	}
	return a
}

func (a nd) off(idx ...int) int {
	o := 0
	for i, x := range idx {
		o = o*a.d[i] + x
	}
	return o
}

// wave makes n deterministic values in about [-1, 1].
func seq(n int, seed float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Round(1000*math.Sin(float64(i+1)*seed)) / 1000)
	}
	return v
}

// samePad returns TensorFlow's SAME output size and leading pad.
func samePad(in, k, s int) (out, before int) {
	out = (in + s - 1) / s
	total := max((out-1)*s+k-in, 0)
	return out, total / 2
}

func outSize(in, k, s int, same bool) (int, int) {
	if same {
		return samePad(in, k, s)
	}
	return (in-k)/s + 1, 0
}

// conv2D is an NHWC convolution with an HWIO kernel, or a depthwise one
// with an [H,W,C,M] kernel writing channel c*M+m.
func conv2D(x, w nd, s int, same, depthwise bool) nd {
	n, h, wd, c := x.d[0], x.d[1], x.d[2], x.d[3]
	kh, kw, co := w.d[0], w.d[1], w.d[3]
	oh, ph := outSize(h, kh, s, same)
	ow, pw := outSize(wd, kw, s, same)
	oc := co
	if depthwise {
		oc = c * co
	}
	y := newND(n, oh, ow, oc)
	for b := range n {
		for i := range oh {
			for j := range ow {
				for o := range oc {
					sum := 0.0
					for di := range kh {
						for dj := range kw {
							r, q := i*s+di-ph, j*s+dj-pw
							if r < 0 || q < 0 || r >= h || q >= wd {
								continue
							}
							if depthwise {
								sum += x.v[x.off(b, r, q, o/co)] * w.v[w.off(di, dj, o/co, o%co)]
								continue
							}
							for ci := range c {
								sum += x.v[x.off(b, r, q, ci)] * w.v[w.off(di, dj, ci, o)]
							}
						}
					}
					y.v[y.off(b, i, j, o)] = sum
				}
			}
		}
	}
	return y
}

// pool is an NHWC max or average pool; SAME averages skip the padding.
func pool(x nd, k, s int, same, isMax bool) nd {
	n, h, wd, c := x.d[0], x.d[1], x.d[2], x.d[3]
	oh, ph := outSize(h, k, s, same)
	ow, pw := outSize(wd, k, s, same)
	y := newND(n, oh, ow, c)
	for b := range n {
		for i := range oh {
			for j := range ow {
				for ch := range c {
					acc, cnt := math.Inf(-1), 0
					if !isMax {
						acc = 0
					}
					for di := range k {
						for dj := range k {
							r, q := i*s+di-ph, j*s+dj-pw
							if r < 0 || q < 0 || r >= h || q >= wd {
								continue
							}
							v := x.v[x.off(b, r, q, ch)]
							if isMax {
								acc = max(acc, v)
							} else {
								acc += v
							}
							cnt++
						}
					}
					if !isMax {
						acc /= float64(cnt)
					}
					y.v[y.off(b, i, j, ch)] = acc
				}
			}
		}
	}
	return y
}

// matMul multiplies batches of [m,k] by one [k,n].
func matMul(a, b nd) nd {
	k, n := b.d[0], b.d[1]
	m := len(a.v) / k
	y := newND(append(append([]int{}, a.d[:len(a.d)-1]...), n)...)
	for i := range m {
		for j := range n {
			for p := range k {
				y.v[i*n+j] += a.v[i*k+p] * b.v[p*n+j]
			}
		}
	}
	return y
}

// softmax is over the last axis.
func softmax(x nd) nd {
	y := newND(x.d...)
	last := x.d[len(x.d)-1]
	for r := 0; r < len(x.v); r += last {
		m, sum := math.Inf(-1), 0.0
		for _, v := range x.v[r : r+last] {
			m = max(m, v)
		}
		for i := range last {
			y.v[r+i] = math.Exp(x.v[r+i] - m)
			sum += y.v[r+i]
		}
		for i := range last {
			y.v[r+i] /= sum
		}
	}
	return y
}

// transpose permutes the axes of x.
func transpose(x nd, perm ...int) nd {
	d := make([]int, len(perm))
	for i, p := range perm {
		d[i] = x.d[p]
	}
	y := newND(d...)
	idx := make([]int, len(d))
	src := make([]int, len(d))
	for o := range y.v {
		r := o
		for i := len(d) - 1; i >= 0; i-- {
			idx[i], r = r%d[i], r/d[i]
		}
		for i, p := range perm {
			src[p] = idx[i]
		}
		y.v[o] = x.v[x.off(src...)]
	}
	return y
}

// mapND applies f elementwise.
func mapND(x nd, f func(float64) float64) nd {
	y := newND(x.d...)
	for i, v := range x.v {
		y.v[i] = f(v)
	}
	return y
}

// sub2D picks rows and columns of a matrix.
func sub2D(x nd, rows, cols []int) nd {
	y := newND(len(rows), len(cols))
	for i, r := range rows {
		for j, c := range cols {
			y.v[i*len(cols)+j] = x.v[x.off(r, c)]
		}
	}
	return y
}

func span(from, to, step int) []int {
	var out []int
	for i := from; (step > 0 && i < to) || (step < 0 && i > to); i += step {
		out = append(out, i)
	}
	return out
}
