package savedmodel

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

var rnnOps = map[string]opFunc{"CudnnRNN": cudnnRNN, "CudnnRNNV2": cudnnRNN, "CudnnRNNV3": cudnnRNN}

// rnnCell is how one cuDNN rnn_mode becomes an ONNX op: cuDNN stores the
// gates' matrices in cudnn order; onnx[k] is the cuDNN gate ONNX wants
// k-th. LSTM: cuDNN i,f,c,o and ONNX i,o,f,c; GRU: cuDNN r,z,h and ONNX
// z,r,h, with cuDNN's reset applied after the recurrent matmul
// (linear_before_reset). rnn_tanh and rnn_relu have one gate.
type rnnCell struct {
	op    string
	onnx  []int64
	attrs []*onnxpb.AttributeProto
}

var rnnCells = map[string]rnnCell{
	"lstm":     {"LSTM", []int64{0, 3, 1, 2}, nil},
	"gru":      {"GRU", []int64{1, 0, 2}, []*onnxpb.AttributeProto{attrInt("linear_before_reset", 1)}},
	"rnn_tanh": {"RNN", []int64{0}, []*onnxpb.AttributeProto{attrStrings("activations", "Tanh")}},
	"rnn_relu": {"RNN", []int64{0}, []*onnxpb.AttributeProto{attrStrings("activations", "Relu")}},
}

func attrStrings(name string, v ...string) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_STRINGS
	a := &onnxpb.AttributeProto{Name: &name, Type: &t}
	for _, s := range v {
		a.Strings = append(a.Strings, []byte(s))
	}
	return a
}

// last is the last entry of dims when it is known.
func last(dims []int64, ok bool) int64 {
	if !ok || len(dims) == 0 {
		return -1
	}
	return dims[len(dims)-1]
}

// rnnSizes finds num_units h and input_size i from the shapes the graph
// records, solving the params buffer's size g·(h·i + h·h + 2h) for the
// one it lacks.
func (c *opCtx) rnnSizes(g int64) (h, i int64, err error) {
	h = last(c.dims(1))
	if h < 0 {
		h = last(c.outDims(1))
	}
	i = last(c.dims(0))
	p := last(c.dims(3))
	switch {
	case h > 0 && i > 0:
	case h > 0 && p > 0 && p%(g*h) == 0:
		i = (p/g - h*h - 2*h) / h
	case i > 0 && p > 0 && p%g == 0:
		b := float64(i + 2)
		h = int64(math.Round((-b + math.Sqrt(b*b+4*float64(p/g))) / 2))
	default:
		return 0, 0, fmt.Errorf("num_units and input_size are unknown: no recorded shapes for input, input_h or params")
	}
	if h <= 0 || i <= 0 {
		return 0, 0, fmt.Errorf("params of %d values fit no num_units/input_size pair", p)
	}
	if want := g * (h*i + h*h + 2*h); p > 0 && p != want {
		return 0, 0, fmt.Errorf("params has %d values; one unidirectional layer of %d units over %d inputs has %d (several layers are not supported)", p, h, i, want)
	}
	return h, i, nil
}

// cudnnRNN maps CudnnRNN(V2/V3), the op Keras's cuDNN LSTM and GRU run, to
// ONNX LSTM/GRU/RNN: one unidirectional layer, the flat params buffer cut
// into cuDNN's blocks (every gate's input matrix [units, input], then every
// recurrent matrix [units, units], then the input and recurrent biases)
// and re-laid in ONNX gate order.
func cudnnRNN(c *opCtx) error {
	cell, ok := rnnCells[c.strAttr("rnn_mode")]
	if m := c.strAttr("rnn_mode"); m == "" {
		cell, ok = rnnCells["lstm"], true
	} else if !ok {
		return fmt.Errorf("rnn_mode %q is not supported", m)
	}
	if d := c.strAttr("direction"); d != "" && d != "unidirectional" {
		return fmt.Errorf("direction %q is not supported (only unidirectional)", d)
	}
	if c.intAttr("num_proj") != 0 {
		return fmt.Errorf("num_proj %d (an LSTM projection) has no ONNX LSTM equivalent", c.intAttr("num_proj"))
	}
	if len(c.in) < 4 {
		return fmt.Errorf("has %d inputs, want at least 4", len(c.in))
	}
	g := int64(len(cell.onnx))
	h, in, err := c.rnnSizes(g)
	if err != nil {
		return err
	}
	switch m := c.strAttr("input_mode"); {
	case m == "skip_input" || (m == "auto_select" && in == h):
		return fmt.Errorf("input_mode %q (no input matrices) is not supported", m)
	case m != "" && m != "linear_input" && m != "auto_select":
		return fmt.Errorf("input_mode %q is not supported", m)
	}
	name := c.n.name
	params := c.in[3]
	block := func(off, n int64) string {
		return c.tmp("Slice", []string{params, c.e.ints(name+"/start", off), c.e.ints(name+"/end", off+n), c.e.ints(name+"/axis", 0)})
	}
	gates := func(base, size int64, shape ...int64) string {
		var parts []string
		for _, k := range cell.onnx {
			parts = append(parts, block(base+k*size, size))
		}
		return c.tmp("Reshape", []string{c.tmp("Concat", parts, attrInt("axis", 0)), c.e.ints(name+"/shape", shape...)})
	}
	w := gates(0, h*in, 1, g*h, in)
	r := gates(g*h*in, h*h, 1, g*h, h)
	biases := g * (h*in + h*h)
	b := c.tmp("Concat", []string{gates(biases, h, 1, g*h), gates(biases+g*h, h, 1, g*h)}, attrInt("axis", 1))
	x, h0, c0 := c.in[0], c.in[1], c.in[2]
	batchMajor := c.n.op == "CudnnRNNV3" && c.n.attr["time_major"] != nil && !c.boolAttr("time_major")
	swap := func(v string) string { return c.tmp("Transpose", []string{v}, attrInts("perm", 1, 0, 2)) }
	if batchMajor {
		x, h0, c0 = swap(x), swap(h0), swap(c0)
	}
	lens := ""
	if c.n.op == "CudnnRNNV3" && len(c.in) > 4 {
		lens = c.tmp("Cast", c.in[4:5], attrInt("to", 6)) // int32
	}
	ins := []string{x, w, r, b, lens, h0}
	y, yh, yc := c.e.fresh(name+"/Y"), c.e.fresh(name+"/Y_h"), c.e.fresh(name+"/Y_c")
	outs := []string{y, yh}
	if cell.op == "LSTM" {
		ins, outs = append(ins, c0), append(outs, yc)
	}
	c.e.node(cell.op, ins, outs, append([]*onnxpb.AttributeProto{attrInt("hidden_size", h)}, cell.attrs...)...)
	y = c.tmp("Squeeze", []string{y, c.e.ints(name+"/dir", 1)})
	if cell.op != "LSTM" {
		yc = c0
	}
	if batchMajor {
		y, yh, yc = swap(y), swap(yh), swap(yc)
	}
	c.e.node("Identity", []string{y}, []string{c.out(0)})
	c.e.node("Identity", []string{yh}, []string{c.out(1)})
	c.e.node("Identity", []string{yc}, []string{c.out(2)})
	return nil
}
