package savedmodel

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// ObjectGraphKey is the checkpoint key of a TF2 checkpoint's object graph:
// a DT_STRING scalar holding a serialized TrackableObjectGraph.
const ObjectGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH"

// VariableValue is the SerializedTensor name of a variable's value.
const VariableValue = "VARIABLE_VALUE"

// ErrNoObjectGraph is returned for a bundle without ObjectGraphKey: a TF1
// checkpoint, whose keys are the variables' names.
var ErrNoObjectGraph = errors.New("checkpoint has no object graph (" + ObjectGraphKey + ")")

// ObjectGraph decodes the checkpoint's TrackableObjectGraph. Its node ids
// are those of the SavedModel's SavedObjectGraph: node i of one is node i
// of the other.
func (b *Bundle) ObjectGraph(ctx context.Context) (*smpb.TrackableObjectGraph, error) {
	if _, ok := b.entries[ObjectGraphKey]; !ok {
		return nil, fmt.Errorf("%s: %w", b.prefix, ErrNoObjectGraph)
	}
	t, err := b.Tensor(ctx, ObjectGraphKey)
	if err != nil {
		return nil, err
	}
	s, ok := t.Data.([]string)
	if !ok || len(s) != 1 || len(t.Dims) != 0 {
		return nil, fmt.Errorf("%s: %s is %s%v, not a string scalar", b.prefix, ObjectGraphKey, t.Type, t.Dims)
	}
	g := &smpb.TrackableObjectGraph{}
	if err := proto.Unmarshal([]byte(s[0]), g); err != nil {
		return nil, fmt.Errorf("%s: decoding %s: %w", b.prefix, ObjectGraphKey, err)
	}
	return g, nil
}

// CheckpointKeys maps each object-graph node that holds a variable's value
// to the checkpoint key of that value
// ("layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"). With the
// SavedObjectGraph's node ids (a SavedVariable's, or a concrete function's
// bound_inputs) it says where each TF2 variable's value is.
func (b *Bundle) CheckpointKeys(ctx context.Context) (map[int32]string, error) {
	g, err := b.ObjectGraph(ctx)
	if err != nil {
		return nil, err
	}
	return CheckpointKeys(g), nil
}

// CheckpointKeys is Bundle.CheckpointKeys for an already decoded graph.
func CheckpointKeys(g *smpb.TrackableObjectGraph) map[int32]string {
	keys := map[int32]string{}
	for id, n := range g.GetNodes() {
		for _, a := range n.GetAttributes() {
			if a.GetName() == VariableValue {
				keys[int32(id)] = a.GetCheckpointKey()
			}
		}
	}
	return keys
}

// VariableTensors reads the value of every variable of a TF2 SavedModel's
// object graph, by SavedObjectGraph node id, from its checkpoint.
func VariableTensors(ctx context.Context, mg *smpb.MetaGraphDef, b *Bundle) (map[int32]*onnx.Tensor, error) {
	keys, err := b.CheckpointKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := map[int32]*onnx.Tensor{}
	for id, n := range mg.GetObjectGraphDef().GetNodes() {
		if n.GetVariable() == nil {
			continue
		}
		key, ok := keys[int32(id)]
		if !ok {
			return nil, fmt.Errorf("%s: variable node %d (%s) has no %s in the checkpoint's object graph",
				b.prefix, id, n.GetVariable().GetName(), VariableValue)
		}
		t, err := b.Tensor(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("variable node %d (%s): %w", id, n.GetVariable().GetName(), err)
		}
		out[int32(id)] = t
	}
	return out, nil
}
