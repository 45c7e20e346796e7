package calibrate

import "github.com/kiln-ml/kiln/onnx"

// fetchFreeOnce turns on fetching input-free tensors with the first run
// only in Collect (see inputFree); tests turn it off to compare.
var fetchFreeOnce = true

// randomOps are operators whose outputs differ from run to run without
// depending on any input.
var randomOps = map[string]bool{
	"RandomNormal": true, "RandomUniform": true, "RandomNormalLike": true, "RandomUniformLike": true,
	"Multinomial": true, "Bernoulli": true,
}

// inputFree returns the tensors among names whose values do not depend on
// the model's inputs: weights a graph computes from initializers
// (ConstantOfShape, a transposed or reshaped initializer, Constant nodes).
// Every run gives them the same values, so Collect fetches them with the
// first run only: fetching a computed weight on every run (hundreds of MB
// for a fully connected layer) would cost more than the inference. Range
// methods depend on the shape of a histogram, not on its total, so one run's
// values give the same ranges as N runs' would. A node with a subgraph or a
// random operator counts as depending on the inputs.
func inputFree(m *onnx.Model, names []string) map[string]bool {
	g := m.Graph()
	dependent := map[string]bool{}
	for _, in := range m.Inputs() {
		dependent[in.Name] = true
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return nil
	}
	for _, n := range nodes {
		dep := randomOps[n.GetOpType()]
		for _, a := range n.GetAttribute() {
			if a.GetG() != nil || len(a.GetGraphs()) > 0 {
				dep = true
			}
		}
		for _, in := range onnx.NodeInputs(n) {
			if dependent[in] {
				dep = true
				break
			}
		}
		if dep {
			for _, o := range n.GetOutput() {
				dependent[o] = true
			}
		}
	}
	free := map[string]bool{}
	for _, n := range names {
		if !dependent[n] {
			free[n] = true
		}
	}
	return free
}
