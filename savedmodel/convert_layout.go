package savedmodel

import (
	"slices"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// elementwise are one-input ONNX ops that commute with a Transpose.
var elementwise = map[string]bool{
	"Relu": true, "Sigmoid": true, "Tanh": true, "Elu": true, "Selu": true, "LeakyRelu": true, "Exp": true,
	"Log": true, "Neg": true, "Abs": true, "Sqrt": true, "Erf": true, "Identity": true, "Softplus": true,
	"Reciprocal": true, "Floor": true, "Ceil": true,
}

// optimize cancels the Transposes NHWC handling put around each layer:
// a Transpose sinks through elementwise ops (and a channel-bias Add or Mul)
// until it meets its inverse, then both go; dead nodes are dropped.
func optimize(g *onnxpb.GraphProto) {
	for changed := true; changed; {
		changed = false
		for _, t := range g.GetNode() {
			if t.GetOpType() == "Transpose" && (cancel(g, t) || sink(g, t)) {
				changed = true
				break
			}
		}
	}
	prune(g)
}

func perm(n *onnxpb.NodeProto) []int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == "perm" {
			return a.GetInts()
		}
	}
	return nil
}

func consumers(g *onnxpb.GraphProto, value string) []*onnxpb.NodeProto {
	var out []*onnxpb.NodeProto
	for _, n := range g.GetNode() {
		if slices.Contains(n.GetInput(), value) || slices.Contains(subgraphInputs(n), value) {
			out = append(out, n)
		}
	}
	return out
}

func isOutput(g *onnxpb.GraphProto, value string) bool {
	for _, o := range g.GetOutput() {
		if o.GetName() == value {
			return true
		}
	}
	return false
}

func producer(g *onnxpb.GraphProto, value string) *onnxpb.NodeProto {
	for _, n := range g.GetNode() {
		if slices.Contains(n.GetOutput(), value) {
			return n
		}
	}
	return nil
}

// cancel removes t when it undoes the Transpose feeding it.
func cancel(g *onnxpb.GraphProto, t *onnxpb.NodeProto) bool {
	first := producer(g, t.GetInput()[0])
	if first == nil || first.GetOpType() != "Transpose" || isOutput(g, t.GetOutput()[0]) {
		return false
	}
	p, q := perm(first), perm(t)
	if len(p) != len(q) || len(p) == 0 {
		return false
	}
	for i := range q {
		if p[q[i]] != int64(i) {
			return false
		}
	}
	replaceUses(g, t.GetOutput()[0], first.GetInput()[0])
	removeNode(g, t)
	return true
}

// sink moves t below its only consumer when that consumer commutes with it.
func sink(g *onnxpb.GraphProto, t *onnxpb.NodeProto) bool {
	y := t.GetOutput()[0]
	users := consumers(g, y)
	if len(users) != 1 || isOutput(g, y) {
		return false
	}
	u := users[0]
	bias := biasLike(g, u, y, perm(t))
	if !elementwise[u.GetOpType()] && bias == nil {
		return false
	}
	for _, next := range consumers(g, u.GetOutput()[0]) {
		if next.GetOpType() != "Transpose" {
			return false // sinking would only move the Transpose, not cancel it
		}
	}
	if bias != nil {
		bias.Dims = []int64{bias.GetDims()[0], 1, 1}
	}
	x, out := t.GetInput()[0], u.GetOutput()[0]
	for i, in := range u.GetInput() {
		if in == y {
			u.Input[i] = x
		}
	}
	pre := out + "__nchw"
	u.Output[0] = pre
	t.Input[0], t.Output[0] = pre, out
	moveAfter(g, t, u)
	return true
}

// biasLike returns the per-channel constant u adds or multiplies, which
// can be reshaped to follow the NHWC→NCHW permutation, or nil.
func biasLike(g *onnxpb.GraphProto, u *onnxpb.NodeProto, y string, p []int64) *onnxpb.TensorProto {
	if (u.GetOpType() != "Add" && u.GetOpType() != "Mul") || len(u.GetInput()) != 2 || !slices.Equal(p, nchwToNHWC) {
		return nil
	}
	other := u.GetInput()[0]
	if other == y {
		other = u.GetInput()[1]
	}
	for _, init := range g.GetInitializer() {
		if init.GetName() == other && len(init.GetDims()) == 1 && len(consumers(g, other)) == 1 {
			return init
		}
	}
	return nil
}

func replaceUses(g *onnxpb.GraphProto, from, to string) {
	for _, n := range g.GetNode() {
		for i, in := range n.GetInput() {
			if in == from {
				n.Input[i] = to
			}
		}
		replaceSubgraphUses(n, from, to)
	}
}

func removeNode(g *onnxpb.GraphProto, t *onnxpb.NodeProto) {
	g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool { return n == t })
}

func moveAfter(g *onnxpb.GraphProto, t, u *onnxpb.NodeProto) {
	removeNode(g, t)
	i := slices.Index(g.Node, u)
	g.Node = slices.Insert(g.Node, i+1, t)
}

// prune drops nodes and initializers nothing reads.
func prune(g *onnxpb.GraphProto) {
	for {
		used := map[string]bool{}
		for _, o := range g.GetOutput() {
			used[o.GetName()] = true
		}
		for _, n := range g.GetNode() {
			for _, in := range slices.Concat(n.GetInput(), subgraphInputs(n)) {
				used[in] = true
			}
		}
		before := len(g.Node)
		g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool {
			return !slices.ContainsFunc(n.GetOutput(), func(o string) bool { return used[o] })
		})
		g.Initializer = slices.DeleteFunc(g.Initializer, func(t *onnxpb.TensorProto) bool { return !used[t.GetName()] })
		if len(g.Node) == before {
			return
		}
	}
}
