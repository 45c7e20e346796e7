package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// WalkGraphs calls fn for g and every subgraph below it (the bodies of If,
// Loop and Scan nodes), parents first.
func WalkGraphs(g *onnxpb.GraphProto, fn func(*onnxpb.GraphProto)) {
	if g == nil {
		return
	}
	fn(g)
	for _, n := range g.GetNode() {
		for _, a := range n.GetAttribute() {
			for _, sg := range subgraphs(a) {
				WalkGraphs(sg, fn)
			}
		}
	}
}

// Names hands out value and node names that a graph does not use yet, so
// that a rewrite can add nodes and tensors without clashing with the
// graph's own names or with each other.
type Names struct {
	used  map[string]bool
	first int
}

// NewNames collects the names used in g and its subgraphs: inputs,
// initializers, node names and node outputs. A name already taken gets a
// numeric suffix, "_<first>" or the next free one.
func NewNames(g *onnxpb.GraphProto, first int) *Names {
	n := &Names{used: map[string]bool{}, first: first}
	WalkGraphs(g, func(g *onnxpb.GraphProto) {
		for _, v := range g.GetInput() {
			n.used[v.GetName()] = true
		}
		for _, t := range g.GetInitializer() {
			n.used[t.GetName()] = true
		}
		for _, nd := range g.GetNode() {
			n.used[nd.GetName()] = true
			for _, o := range nd.GetOutput() {
				n.used[o] = true
			}
		}
	})
	return n
}

// Fresh returns base, or base with the first free numeric suffix, and marks
// it used.
func (n *Names) Fresh(base string) string {
	name := base
	for i := n.first; n.used[name]; i++ {
		name = fmt.Sprintf("%s_%d", base, i)
	}
	n.used[name] = true
	return name
}
