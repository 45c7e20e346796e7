package savedmodel

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// tfNode is one node of the flattened graph: a main-graph node or a node of
// an inlined function, its inputs rewritten to canonical "node:index"
// references and its control inputs dropped.
type tfNode struct {
	name   string
	op     string
	inputs []string
	attr   map[string]*smpb.AttrValue
	// fn is the function the node came from ("" for the main graph).
	fn string
	// call is the object-graph function a main-graph call node invokes.
	call string
}

// flatGraph is a meta graph with every function call inlined.
type flatGraph struct {
	file  string
	nodes map[string]*tfNode
	// alias maps a call's output to the tensor its function returns.
	alias map[string]string
	lib   map[string]*smpb.FunctionDef
	// calls are the main-graph call nodes with their original inputs, for
	// binding captured variables.
	calls []*tfNode
}

var callOps = map[string]bool{"StatefulPartitionedCall": true, "PartitionedCall": true}

// multiOut lists the output arguments of ops with more than one, so that a
// function's "node:arg:i" reference finds its flat index.
var multiOut = map[string][]string{
	"FusedBatchNorm":   {"y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"},
	"FusedBatchNormV2": {"y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"},
	"FusedBatchNormV3": {"y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2", "reserve_space_3"},
	"TopKV2":           {"values", "indices"},
	"CudnnRNN":         {"output", "output_h", "output_c", "reserve_space"},
	"CudnnRNNV2":       {"output", "output_h", "output_c", "reserve_space", "host_reserved"},
	"CudnnRNNV3":       {"output", "output_h", "output_c", "reserve_space", "host_reserved"},
	"Unique":           {"y", "idx"},
}

func canon(ref string) string {
	if strings.Contains(ref, ":") {
		return ref
	}
	return ref + ":0"
}

func refNode(ref string) (string, int) {
	i := strings.LastIndexByte(ref, ':')
	if i < 0 {
		return ref, 0
	}
	n, _ := strconv.Atoi(ref[i+1:])
	return ref[:i], n
}

func flatten(mg *smpb.MetaGraphDef, file string) (*flatGraph, error) {
	fg := &flatGraph{file: file, nodes: map[string]*tfNode{}, alias: map[string]string{}, lib: map[string]*smpb.FunctionDef{}}
	for _, f := range mg.GetGraphDef().GetLibrary().GetFunction() {
		fg.lib[f.GetSignature().GetName()] = f
	}
	for _, nd := range mg.GetGraphDef().GetNode() {
		var ins []string
		for _, in := range nd.GetInput() {
			if !strings.HasPrefix(in, "^") {
				ins = append(ins, canon(in))
			}
		}
		if err := fg.add(nd, nd.GetName(), ins, ""); err != nil {
			return nil, err
		}
	}
	return fg, nil
}

// add records a node, inlining it when it calls a library function.
func (fg *flatGraph) add(nd *smpb.NodeDef, name string, ins []string, fn string) error {
	n := &tfNode{name: name, op: nd.GetOp(), inputs: ins, attr: nd.GetAttr(), fn: fn}
	callee := ""
	if callOps[n.op] {
		callee = nd.GetAttr()["f"].GetFunc().GetName()
	} else if _, ok := fg.lib[n.op]; ok {
		callee = n.op
	}
	if callee == "" {
		fg.nodes[name] = n
		return nil
	}
	f, ok := fg.lib[callee]
	if !ok {
		return fmt.Errorf("%s: node %s (op %s) calls %s, which is not in the function library", fg.file, name, n.op, callee)
	}
	if fn == "" {
		n.call = callee
		fg.calls = append(fg.calls, n)
	}
	rets, err := fg.inline(name, f, ins)
	if err != nil {
		return err
	}
	for i, r := range rets {
		fg.alias[name+":"+strconv.Itoa(i)] = r
	}
	return nil
}

// inline adds f's nodes under prefix with its arguments bound to args and
// returns the references of its outputs.
func (fg *flatGraph) inline(prefix string, f *smpb.FunctionDef, args []string) ([]string, error) {
	fname := f.GetSignature().GetName()
	bind := map[string]string{}
	for i, a := range f.GetSignature().GetInputArg() {
		if i >= len(args) {
			return nil, fmt.Errorf("%s: call %s of %s passes %d inputs, the function takes %d", fg.file, prefix, fname, len(args), len(f.GetSignature().GetInputArg()))
		}
		bind[a.GetName()] = args[i]
	}
	local := map[string]*smpb.NodeDef{}
	for _, nd := range f.GetNodeDef() {
		local[nd.GetName()] = nd
	}
	resolve := func(in string) (string, error) {
		parts := strings.Split(in, ":")
		if len(parts) == 1 {
			if r, ok := bind[in]; ok {
				return r, nil
			}
			return prefix + "/" + in + ":0", nil
		}
		nd, ok := local[parts[0]]
		if !ok {
			return "", fmt.Errorf("%s: function %s: input %q names no node", fg.file, fname, in)
		}
		idx := 0
		if len(parts) == 3 {
			idx, _ = strconv.Atoi(parts[2])
		}
		if args, ok := multiOut[nd.GetOp()]; ok {
			for i, a := range args {
				if a == parts[1] {
					idx += i
				}
			}
		}
		return prefix + "/" + parts[0] + ":" + strconv.Itoa(idx), nil
	}
	for _, nd := range f.GetNodeDef() {
		var ins []string
		for _, in := range nd.GetInput() {
			if strings.HasPrefix(in, "^") {
				continue
			}
			r, err := resolve(in)
			if err != nil {
				return nil, err
			}
			ins = append(ins, r)
		}
		if err := fg.add(nd, prefix+"/"+nd.GetName(), ins, fname); err != nil {
			return nil, err
		}
	}
	var rets []string
	for _, oa := range f.GetSignature().GetOutputArg() {
		r, err := resolve(f.GetRet()[oa.GetName()])
		if err != nil {
			return nil, err
		}
		rets = append(rets, r)
	}
	return rets, nil
}

// passThrough are ops whose output is their first input once the graph is
// frozen and run for inference.
var passThrough = map[string]bool{
	"Identity": true, "PreventGradient": true, "StopGradient": true, "Snapshot": true,
	"ReadVariableOp": true, "PlaceholderWithDefault": true, "EnsureShape": true, "CheckNumerics": true,
}

// resolve follows call aliases and Identity chains to the tensor that
// really produces ref; stop names the signature inputs, which are kept.
func (fg *flatGraph) resolve(ref string, stop map[string]bool) string {
	for range 10000 {
		if a, ok := fg.alias[ref]; ok {
			ref = a
			continue
		}
		name, idx := refNode(ref)
		n := fg.nodes[name]
		if n == nil || stop[ref] {
			return ref
		}
		switch {
		case n.op == "IdentityN" && idx < len(n.inputs):
			ref = n.inputs[idx]
		case passThrough[n.op] && idx == 0 && len(n.inputs) > 0:
			ref = n.inputs[0]
		default:
			return ref
		}
	}
	return ref
}

var variableOps = map[string]bool{"VariableV2": true, "VarHandleOp": true, "Variable": true}

// bindVariables reads the checkpoint value of every variable node: TF2
// resource captures through the object graph's concrete functions, TF1
// variables by name.
func bindVariables(ctx context.Context, fg *flatGraph, mg *smpb.MetaGraphDef, b *Bundle) (map[string]*onnxpb.TensorProto, error) {
	keys := map[string]string{} // variable node → checkpoint key
	og := mg.GetObjectGraphDef()
	if ids, err := b.CheckpointKeys(ctx); err == nil {
		for _, c := range fg.calls {
			bound := og.GetConcreteFunctions()[c.call].GetBoundInputs()
			off := len(c.inputs) - len(bound)
			for i, id := range bound {
				if off+i < 0 {
					continue
				}
				if key, ok := ids[id]; ok {
					name, _ := refNode(fg.resolve(c.inputs[off+i], nil))
					keys[name] = key
				}
			}
		}
	}
	out := map[string]*onnxpb.TensorProto{}
	for name, n := range fg.nodes {
		if !variableOps[n.op] {
			continue
		}
		key, ok := keys[name]
		if !ok {
			for _, k := range []string{string(n.attr["shared_name"].GetS()), name} {
				if _, has := b.Entry(string(k)); has && len(k) > 0 {
					key, ok = string(k), true
					break
				}
			}
		}
		if !ok {
			continue // not needed unless the signature reads it
		}
		t, err := b.TensorProto(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", fg.file, name, err)
		}
		out[name] = t
	}
	return out, nil
}
