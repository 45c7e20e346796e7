package calibrate

import "github.com/kiln-ml/kiln/onnx"

// deriveTensors turns on deriving tensors from others in Collect (see
// derive); tests turn it off to compare with fetching them.
var deriveTensors = true

// derivation says which observed tensors Collect derives from others
// instead of fetching them from ONNX Runtime.
type derivation struct {
	// relu maps a fetched tensor to the output of a Relu reading it,
	// whose statistics are added from the same pass over its values: a
	// ReLU output is as large as its input, so that halves the memory
	// and the passes over the pair.
	relu map[string]string
	// alias maps the output of an operator that hands on its input's
	// values in the same order (Identity, Reshape, Flatten, Squeeze,
	// Unsqueeze, inference Dropout) to the tensor that first held them;
	// the output's statistics are a copy of that tensor's.
	alias map[string]string
	// reluOf maps a derived ReLU output back to its input.
	reluOf map[string]string
}

// derive finds the derivable tensors among names. Outputs that are graph
// outputs of the model are left to be fetched (ONNX Runtime returns them
// anyway), as is a second Relu of the same values.
func derive(m *onnx.Model, names []string) derivation {
	d := derivation{relu: map[string]string{}, alias: map[string]string{}, reluOf: map[string]string{}}
	if !deriveTensors {
		return d
	}
	g := m.Graph()
	observed := map[string]bool{}
	for _, n := range names {
		observed[n] = true
	}
	graphOut := map[string]bool{}
	for _, o := range g.GetOutput() {
		graphOut[o.GetName()] = true
	}
	nodes, err := onnx.TopoSort(g)
	if err != nil {
		return d
	}
	derived := map[string]bool{}
	for _, n := range nodes {
		ins, outs := n.GetInput(), n.GetOutput()
		if n.GetDomain() != "" || len(ins) == 0 || len(outs) == 0 {
			continue
		}
		in, out := ins[0], outs[0]
		if !observed[in] || !observed[out] || graphOut[out] || derived[out] || in == out {
			continue
		}
		if root, ok := d.alias[in]; ok {
			in = root
		}
		switch n.GetOpType() {
		case "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze":
		case "Dropout":
			if len(ins) > 2 && ins[2] != "" {
				continue // training_mode may be on
			}
		case "Relu":
			if derived[in] || d.relu[in] != "" {
				continue // its values are not fetched, or taken
			}
			d.relu[in] = out
			d.reluOf[out] = in
			derived[out] = true
			continue
		default:
			continue
		}
		d.alias[out] = in
		derived[out] = true
	}
	return d
}

// fetched is names less the tensors d derives: the tensors Collect fetches
// from ONNX Runtime.
func (d derivation) fetched(names []string) []string {
	var fetch []string
	for _, n := range names {
		if !d.derived(n) {
			fetch = append(fetch, n)
		}
	}
	return fetch
}

// derived tells whether d derives name.
func (d derivation) derived(name string) bool {
	_, alias := d.alias[name]
	_, relu := d.reluOf[name]
	return alias || relu
}

// source is the fetched tensor name's values come from.
func (d derivation) source(name string) string {
	if root, ok := d.alias[name]; ok {
		name = root
	}
	if in, ok := d.reluOf[name]; ok {
		return in
	}
	return name
}

// addRelu adds values to h as Add does and their ReLU to r as r.Add would,
// with one min/max pass and one counting pass over values for both. ONNX
// Runtime's ReLU turns a negative value into 0 and keeps -0 (and NaN,
// which h rejects first).
func addRelu(h, r *Histogram, values []float32) error {
	var s batchScan
	if err := s.add(values); err != nil {
		return err
	}
	countH, countR := beginRelu(h, r, s)
	countBoth(h, r, values, countH, countR)
	return nil
}

// beginRelu begins a batch scanned as s for h and its ReLU for r (see
// Histogram.begin).
func beginRelu(h, r *Histogram, s batchScan) (countH, countR bool) {
	rlo, rhi := s.relu()
	return h.begin(s.lo, s.hi, s.n), r.begin(rlo, rhi, s.n)
}

// countBoth counts values into h and their ReLU into r, each if asked.
func countBoth(h, r *Histogram, values []float32, countH, countR bool) {
	switch {
	case countH && countR:
		countRelu(h.counts, r.counts, values, 1/h.width, 1/r.width)
	case countH:
		count(h.counts, values, 1/h.width)
	case countR: // not reached: a batch with a non-zero ReLU has non-zero values
		rv := make([]float32, len(values))
		for i, v := range values {
			rv[i] = reluOf(v)
		}
		count(r.counts, rv, 1/r.width)
	}
}

// reluOf is ONNX Runtime's ReLU of a finite v: 0 for a negative v, v (-0
// included) otherwise.
func reluOf(v float32) float32 {
	if v < 0 {
		return 0
	}
	return v
}
