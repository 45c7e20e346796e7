package pbtxt

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// tensorUse is one place an ensemble tensor's type and shape come from.
type tensorUse struct {
	model    string
	dt       configpb.DataType
	dims     []int64
	batching bool
}

func (u tensorUse) full() []int64 {
	if u.batching {
		return append([]int64{WildcardDim}, u.dims...)
	}
	return u.dims
}

// checkEnsembleRepo checks an ensemble against the other models of the
// repository (Triton's ensemble_utils.cc ValidateEnsembleConfig): the step
// models exist and load the required versions, the maps name real inputs
// and outputs, every step input is fed, types and shapes agree along each
// tensor, batch sizes fit, no ensemble includes itself, and no step mixes
// responses of different decoupled models.
func checkEnsembleRepo(name string, r *Repository, st *lintState) Problems {
	var col collector
	ens := st.effective[name]
	steps := ens.GetEnsembleScheduling().GetStep()
	uses := map[string][]tensorUse{}
	var order []string
	use := func(t string, u tensorUse) {
		if _, ok := uses[t]; !ok {
			order = append(order, t)
		}
		uses[t] = append(uses[t], u)
	}
	ebatch := ens.GetMaxBatchSize() > 0
	for _, in := range ens.GetInput() {
		use(in.GetName(), tensorUse{name, in.GetDataType(), in.GetDims(), ebatch})
	}
	decoupled := make([]bool, len(steps))
	for i, s := range steps {
		p := at("ensemble_scheduling.step", i)
		sm := r.Model(s.GetModelName())
		sc := st.effective[s.GetModelName()]
		if sm == nil || sc == nil || sm.ConfigErr != nil {
			col.errorf(p+".model_name", "ensemble %s contains models that are not available or ambiguous: %s (no model directory %q in %s)", name, s.GetModelName(), s.GetModelName(), r.Dir)
			continue
		}
		if v := s.GetModelVersion(); v >= 0 && !containsVersion(sm.Loaded, v) {
			col.errorf(p+".model_version", "ensemble '%s' depends on '%s' whose required version %d is not loaded (loaded: %s); use model_version: -1 for the latest", name, s.GetModelName(), v, orNone(versionList(sm.Loaded)))
		}
		if smb := sc.GetMaxBatchSize(); smb > 0 && ens.GetMaxBatchSize() > smb {
			col.errorf("max_batch_size", "ensemble %s allows maximum batch size %d, but it contains model %s which only allows maximum batch size to be %d", name, ens.GetMaxBatchSize(), s.GetModelName(), smb)
		}
		decoupled[i] = sc.GetModelTransactionPolicy().GetDecoupled()
		ins := map[string]*configpb.ModelInput{}
		for _, in := range sc.GetInput() {
			ins[in.GetName()] = in
		}
		outs := map[string]*configpb.ModelOutput{}
		for _, out := range sc.GetOutput() {
			outs[out.GetName()] = out
		}
		batch := sc.GetMaxBatchSize() > 0
		for _, k := range slices.Sorted(maps.Keys(s.GetInputMap())) {
			t := s.GetInputMap()[k]
			in, ok := ins[k]
			if !ok {
				if len(ins) > 0 {
					col.errorf(key(p+".input_map", k), "in ensemble %s, ensemble tensor %s is mapping to non-existing input %s in model %s; inputs are %s", name, t, k, s.GetModelName(), inputNames(sc))
				}
				continue
			}
			use(t, tensorUse{s.GetModelName(), in.GetDataType(), in.GetDims(), batch})
		}
		for _, k := range slices.Sorted(maps.Keys(s.GetOutputMap())) {
			t := s.GetOutputMap()[k]
			out, ok := outs[k]
			if !ok {
				if len(outs) > 0 {
					col.errorf(key(p+".output_map", k), "in ensemble %s, ensemble tensor %s is mapped from non-existing output %s in model %s; outputs are %s", name, t, k, s.GetModelName(), outputNames(sc))
				}
				continue
			}
			use(t, tensorUse{s.GetModelName(), out.GetDataType(), out.GetDims(), batch})
		}
		for _, in := range sc.GetInput() {
			if _, ok := s.GetInputMap()[in.GetName()]; !ok && !in.GetOptional() {
				col.errorf(p+".input_map", "in ensemble %s, input %s in model %s is not mapped to any ensemble tensors; add it to input_map", name, in.GetName(), s.GetModelName())
			}
		}
	}
	for _, out := range ens.GetOutput() {
		use(out.GetName(), tensorUse{name, out.GetDataType(), out.GetDims(), ebatch})
	}
	for _, t := range order {
		us := uses[t]
		for _, u := range us[1:] {
			if msg := inconsistent(us[0], u); msg != "" {
				col.errorf("ensemble_scheduling", "in ensemble %s, ensemble tensor %s: %s", name, t, msg)
				break
			}
		}
	}
	checkDecoupled(&col, name, ens, decoupled)
	if cycle := ensembleCycle(name, st); cycle != "" {
		col.errorf("ensemble_scheduling", "circular dependency between ensembles: %s", cycle)
	}
	return col.ps
}

func containsVersion(vs []int64, v int64) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// inconsistent is Triton's ValidateTensorConsistency: data types must be
// equal; shapes must match with wildcards, directly or once both carry
// their batch dimension.
func inconsistent(a, b tensorUse) string {
	if a.dt != b.dt {
		return fmt.Sprintf("inconsistent data type: %s is inferred from model %s while %s is inferred from model %s", a.dt, a.model, b.dt, b.model)
	}
	if matchDims(a.dims, b.dims) || matchDims(a.full(), b.full()) {
		return ""
	}
	return fmt.Sprintf("inconsistent shape: %s is inferred from model %s while %s is inferred from model %s", dimsString(a.full()), a.model, dimsString(b.full()), b.model)
}

// checkDecoupled reports steps (and ensemble outputs) fed by more than one
// decoupled model: their responses cannot be matched up.
func checkDecoupled(col *collector, name string, ens *configpb.ModelConfig, decoupled []bool) {
	steps := ens.GetEnsembleScheduling().GetStep()
	origin := map[string]map[int]bool{}
	union := func(names []string) map[int]bool {
		u := map[int]bool{}
		for _, n := range names {
			for k := range origin[n] {
				u[k] = true
			}
		}
		return u
	}
	for iter := 0; iter <= len(steps); iter++ {
		changed := false
		for i, s := range steps {
			out := map[int]bool{i: true}
			if !decoupled[i] {
				out = union(mapValues(s.GetInputMap()))
			}
			for _, t := range s.GetOutputMap() {
				for k := range out {
					if origin[t] == nil {
						origin[t] = map[int]bool{}
					}
					if !origin[t][k] {
						origin[t][k], changed = true, true
					}
				}
			}
		}
		if !changed {
			break
		}
	}
	reported := map[string]bool{}
	for i, s := range steps {
		if len(union(mapValues(s.GetInputMap()))) > 1 && !reported[s.GetModelName()] {
			reported[s.GetModelName()] = true
			col.errorf(at("ensemble_scheduling.step", i), "in ensemble %s, step of model '%s' receives inputs originated from different decoupled models; their responses cannot be paired", name, s.GetModelName())
		}
	}
	var outs []string
	for _, o := range ens.GetOutput() {
		outs = append(outs, o.GetName())
	}
	if len(union(outs)) > 1 {
		col.errorf("output", "in ensemble %s, step of model '%s' receives inputs originated from different decoupled models: its outputs come from more than one decoupled step", name, name)
	}
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// ensembleCycle returns "a -> ... -> b -> a" when ensemble start reaches
// itself through the ensembles its steps use.
func ensembleCycle(start string, st *lintState) string {
	var path []string
	seen := map[string]bool{}
	var visit func(n string) bool
	visit = func(n string) bool {
		c := st.effective[n]
		if c == nil || !isEnsemble(c) {
			return false
		}
		path = append(path, n)
		steps := map[string]bool{}
		for _, s := range c.GetEnsembleScheduling().GetStep() {
			steps[s.GetModelName()] = true
		}
		names := make([]string, 0, len(steps))
		for s := range steps {
			names = append(names, s)
		}
		sort.Strings(names)
		for _, s := range names {
			if s == start {
				path = append(path, start)
				return true
			}
			if !seen[s] {
				seen[s] = true
				if visit(s) {
					return true
				}
			}
		}
		path = path[:len(path)-1]
		return false
	}
	if !visit(start) {
		return ""
	}
	return strings.Join([]string{path[0], "...", path[len(path)-2], path[len(path)-1]}, " -> ")
}
