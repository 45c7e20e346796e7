package calibrate

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// quantizedOps are the operators whose inputs the Q/DQ model quantizes
// (residual Adds only beside one of them).
var quantizedOps = map[string]bool{"Conv": true, "ConvTranspose": true, "Gemm": true, "MatMul": true}

// checkQuantizable refuses, before any sample is read, a model whose main
// graph has none of the operators the Q/DQ model quantizes, naming what
// it found instead: the same operators inside If, Loop or Scan bodies
// (and the graph inputs an If's condition depends on, which --fix can
// fold so that the branch becomes the graph), or none at all.
func checkQuantizable(m *onnx.Model) error {
	g := m.Graph()
	for _, n := range g.GetNode() {
		if quantizedOps[n.GetOpType()] && n.GetDomain() == "" {
			return nil
		}
	}
	nested := map[string]int{}
	var holders []*onnxpb.NodeProto
	for _, n := range g.GetNode() {
		before := total(nested)
		for _, a := range n.GetAttribute() {
			for _, sg := range append([]*onnxpb.GraphProto{a.GetG()}, a.GetGraphs()...) {
				countOps(sg, nested)
			}
		}
		if total(nested) > before {
			holders = append(holders, n)
		}
	}
	if len(nested) == 0 {
		return fmt.Errorf("%w (its operators: %s)", ErrNothingToQuantize, opList(m.OpCounts()))
	}
	msg := fmt.Sprintf("%s, all inside %s bodies", opList(nested), holderOps(holders))
	if ins := conditionInputs(g, holders); len(ins) > 0 {
		msg += fmt.Sprintf(": fix the input that selects the branch with --fix (e.g. --fix %s=VALUE)", ins[0])
		if len(ins) > 1 {
			msg += fmt.Sprintf("; the conditions depend on %s", strings.Join(ins, ", "))
		}
	}
	return fmt.Errorf("%w: %s", ErrNothingToQuantize, msg)
}

// countOps adds the quantized operators of g and of its own subgraphs to
// counts.
func countOps(g *onnxpb.GraphProto, counts map[string]int) {
	if g == nil {
		return
	}
	for _, n := range g.GetNode() {
		if quantizedOps[n.GetOpType()] && n.GetDomain() == "" {
			counts[n.GetOpType()]++
		}
		for _, a := range n.GetAttribute() {
			countOps(a.GetG(), counts)
			for _, sg := range a.GetGraphs() {
				countOps(sg, counts)
			}
		}
	}
}

func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// opList prints counts as "119 Conv, 2 MatMul", most frequent first.
func opList(counts map[string]int) string {
	ops := slices.Sorted(maps.Keys(counts))
	slices.SortStableFunc(ops, func(a, b string) int { return counts[b] - counts[a] })
	parts := make([]string, 0, len(ops))
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%d %s", counts[op], op))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func holderOps(holders []*onnxpb.NodeProto) string {
	seen := map[string]bool{}
	var ops []string
	for _, n := range holders {
		if !seen[n.GetOpType()] {
			seen[n.GetOpType()] = true
			ops = append(ops, n.GetOpType())
		}
	}
	return strings.Join(ops, "/")
}

// conditionInputs lists the graph inputs the conditions of the If nodes
// among holders are computed from, in graph input order.
func conditionInputs(g *onnxpb.GraphProto, holders []*onnxpb.NodeProto) []string {
	ix := onnx.NewIndex(g)
	deps := map[string]bool{}
	var walk func(name string, depth int)
	walk = func(name string, depth int) {
		if deps[name] || depth > 256 {
			return
		}
		deps[name] = true
		if p := ix.Producer[name]; p != nil {
			for _, in := range p.GetInput() {
				if in != "" {
					walk(in, depth+1)
				}
			}
		}
	}
	for _, n := range holders {
		if n.GetOpType() == "If" && len(n.GetInput()) > 0 {
			walk(n.GetInput()[0], 0)
		}
	}
	var out []string
	for _, in := range g.GetInput() {
		if deps[in.GetName()] && ix.Initializers[in.GetName()] == nil {
			out = append(out, in.GetName())
		}
	}
	return out
}
