package pbtxt

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// Profile is one optimization profile of a TensorRT engine: the range of
// shapes each input accepts, batch dimension included. kiln cannot open
// engines, so it derives profiles from the trtexec command kiln.json
// records for the build (PlanProfiles).
type Profile struct {
	Inputs []ProfileInput `json:"inputs"`
}

// ProfileInput is the shape range of one input in a Profile; Min, Opt and
// Max have the input's rank.
type ProfileInput struct {
	Name string  `json:"name"`
	Min  []int64 `json:"min"`
	Opt  []int64 `json:"opt"`
	Max  []int64 `json:"max"`
}

// Input returns the range of the named input.
func (p Profile) Input(name string) (ProfileInput, bool) {
	for _, in := range p.Inputs {
		if in.Name == name {
			return in, true
		}
	}
	return ProfileInput{}, false
}

// MaxBatch is the largest batch every input of the profile accepts: the
// smallest first dimension of the max shapes, as the TensorRT backend's
// GetProfileMaxBatchSize computes it. ok is false when no input has a
// dimension.
func (p Profile) MaxBatch() (n int64, ok bool) {
	in, ok := p.batchLimit()
	if !ok {
		return 0, false
	}
	return in.Max[0], true
}

// batchLimit returns the input whose max shape limits the batch.
func (p Profile) batchLimit() (ProfileInput, bool) {
	var best ProfileInput
	found := false
	for _, in := range p.Inputs {
		if len(in.Max) > 0 && (!found || in.Max[0] < best.Max[0]) {
			best, found = in, true
		}
	}
	return best, found
}

// PlanProfiles returns the optimization profiles of the TensorRT plan rec
// describes, derived from the trtexec command kiln.json records in
// rec.Build (see ProfilesFromCommand); nil when the record has no trtexec
// build or no input signature.
func PlanProfiles(rec *manifest.Model) ([]Profile, error) {
	b := rec.Build
	if b == nil || b.Tool != "trtexec" || len(b.Command) == 0 || len(rec.Inputs) == 0 {
		return nil, nil
	}
	ps, err := ProfilesFromCommand(b.Command, manifestSigs(rec.Inputs))
	if err != nil {
		return nil, fmt.Errorf("model %s: recorded trtexec command: %w", rec.Name, err)
	}
	return ps, nil
}

// shapeFlags are the shape flags of one --profile section of a command.
type shapeFlags struct {
	specs [3]ShapeSpec // min, opt, max
	given [3]bool
}

var shapeFlagNames = [3]string{"--minShapes", "--optShapes", "--maxShapes"}

// ProfilesFromCommand returns the optimization profiles a trtexec command
// line (argv, program first) builds for an engine whose inputs are ins
// (full shapes, -1 for a dynamic dimension), read the way trtexec reads
// them: each --profile=N starts (or returns to) profile N, and the
// --minShapes, --optShapes and --maxShapes after it belong to it (without
// --profile everything is profile 0); only --optShapes given sets min and
// max to it too; an input no spec names keeps the model's shape with its
// dynamic dimensions set to 1, as trtexec overrides them. A command without
// shape flags builds one profile of the model's shapes.
func ProfilesFromCommand(argv []string, ins []TensorSig) ([]Profile, error) {
	var sections []*shapeFlags
	cur := 0
	for _, a := range argv {
		flag, val, ok := strings.Cut(a, "=")
		if !ok {
			continue
		}
		if flag == "--profile" {
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n > len(sections) {
				return nil, fmt.Errorf("%s: profiles are numbered in order; want 0..%d", a, len(sections))
			}
			if n == len(sections) {
				sections = append(sections, &shapeFlags{})
			}
			cur = n
			continue
		}
		k := slices.Index(shapeFlagNames[:], flag)
		if k < 0 {
			continue
		}
		spec, err := ParseShapeSpec(val)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if len(sections) == 0 {
			sections = append(sections, &shapeFlags{})
		}
		s := sections[cur]
		for _, ts := range spec {
			if i := slices.IndexFunc(s.specs[k], func(o TensorShape) bool { return o.Name == ts.Name }); i >= 0 {
				s.specs[k][i] = ts
			} else {
				s.specs[k] = append(s.specs[k], ts)
			}
		}
		s.given[k] = true
	}
	if len(sections) == 0 {
		sections = append(sections, &shapeFlags{})
	}
	out := make([]Profile, 0, len(sections))
	for i, s := range sections {
		p, err := s.profile(ins)
		if err != nil {
			return nil, fmt.Errorf("profile %d: %w", i, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// profile resolves one section against the engine's inputs.
func (s *shapeFlags) profile(ins []TensorSig) (Profile, error) {
	minS, optS, maxS := s.specs[0], s.specs[1], s.specs[2]
	switch {
	case !s.given[0] && !s.given[2]:
		minS, maxS = optS, optS
	case !s.given[0] || !s.given[1] || !s.given[2]:
		return Profile{}, fmt.Errorf("give all of --minShapes, --optShapes and --maxShapes, or only --optShapes")
	}
	for k, spec := range [3]ShapeSpec{minS, optS, maxS} {
		for _, ts := range spec {
			for j, other := range [3]ShapeSpec{minS, optS, maxS} {
				if _, ok := other.exact(ts.Name); !ok {
					return Profile{}, fmt.Errorf("input %q is in %s but not in %s", ts.Name, shapeFlagNames[k], shapeFlagNames[j])
				}
			}
		}
	}
	var p Profile
	used := map[string]bool{}
	for _, in := range ins {
		e, ok := optS.lookup(in.Name)
		if !ok {
			if !in.Unranked {
				shape := make([]int64, len(in.Shape))
				for i, d := range in.Shape {
					shape[i] = max(d, 1)
				}
				p.Inputs = append(p.Inputs, ProfileInput{Name: in.Name, Min: shape, Opt: shape, Max: shape})
			}
			continue
		}
		used[e.Name] = true
		lo, _ := minS.exact(e.Name)
		hi, _ := maxS.exact(e.Name)
		pi := ProfileInput{Name: in.Name, Min: lo.Dims, Opt: e.Dims, Max: hi.Dims}
		if len(pi.Min) != len(pi.Opt) || len(pi.Opt) != len(pi.Max) {
			return Profile{}, fmt.Errorf("input %q has min %s, opt %s and max %s of different ranks", in.Name, dimsString(pi.Min), dimsString(pi.Opt), dimsString(pi.Max))
		}
		if !in.Unranked && len(in.Shape) != len(pi.Max) {
			return Profile{}, fmt.Errorf("input %q: the shapes give %d dimensions (%s) but the model input has shape %s", in.Name, len(pi.Max), dimsString(pi.Max), dimsString(in.Shape))
		}
		p.Inputs = append(p.Inputs, pi)
	}
	for _, ts := range optS {
		if !used[ts.Name] && !strings.Contains(ts.Name, "*") {
			return Profile{}, fmt.Errorf("the shapes name %q, which is not an input of the engine (inputs: %s)", ts.Name, sigNames(ins))
		}
	}
	return p, nil
}

// usedProfiles returns the profiles the instance groups select (the
// TensorRT backend's GetProfileIndices: profile 0 when none is named),
// reporting names beyond the plan's n profiles.
func usedProfiles(col *collector, c *configpb.ModelConfig, n int) []int {
	var used []int
	for i, g := range c.GetInstanceGroup() {
		for j, s := range g.GetProfile() {
			k, err := strconv.Atoi(s)
			switch {
			case err != nil || k < 0: // Validate reports it
			case k >= n:
				col.errorf(at(at("instance_group", i)+".profile", j), "configuration specified invalid profile %s; the TensorRT plan has %d optimization profile(s), 0..%d", s, n, n-1)
			case !slices.Contains(used, k):
				used = append(used, k)
			}
		}
	}
	if len(used) == 0 {
		used = []int{0}
	}
	slices.Sort(used)
	return used
}

// checkProfiles checks a config against the optimization profiles of a
// TensorRT plan: max_batch_size within the largest batch the selected
// profiles take (the TensorRT backend's auto-complete,
// GetMaxSupportedBatchSize), and every fixed dimension of an input within
// each selected profile's min..max (TRTv3Interface::ConfigureInputDimensions,
// ValidateDimension). batchErr says the batch was already reported.
func checkProfiles(col *collector, c *configpb.ModelConfig, sig Signature, batchErr bool) {
	if len(sig.Profiles) == 0 {
		return
	}
	used := usedProfiles(col, c, len(sig.Profiles))
	mbs := int64(c.GetMaxBatchSize())
	if mbs > 0 && !batchErr {
		checkProfileBatch(col, mbs, sig.Profiles, used)
	}
	for i, in := range c.GetInput() {
		shape, field := in.GetDims(), ".dims"
		if in.GetReshape() != nil {
			shape, field = in.GetReshape().GetShape(), ".reshape.shape"
		}
		checkProfileDims(col, at("input", i), field, in.GetName(), shape, mbs, sig.Profiles, used)
	}
	for i, st := range c.GetSequenceBatching().GetState() {
		checkProfileDims(col, at("sequence_batching.state", i), ".dims", st.GetInputName(), st.GetDims(), mbs, sig.Profiles, used)
	}
}

func checkProfileBatch(col *collector, mbs int64, profiles []Profile, used []int) {
	best, bestK := int64(-1), -1
	for _, k := range used {
		if n, ok := profiles[k].MaxBatch(); ok && n > best {
			best, bestK = n, k
		}
	}
	if bestK < 0 {
		return
	}
	if mbs > best {
		lim, _ := profiles[bestK].batchLimit()
		col.errorf("max_batch_size", "configuration specified max-batch %d but the TensorRT plan only supports max-batch %d: profile %d of the plan has input '%s' with max shape %s; set max_batch_size: %d or rebuild the plan with a larger max batch (--maxShapes)",
			mbs, best, bestK, lim.Name, dimsString(lim.Max), best)
	}
	for _, k := range used {
		for _, in := range profiles[k].Inputs {
			if len(in.Min) > 0 && in.Min[0] > 1 {
				col.warnf("max_batch_size", "profile %d of the plan takes input '%s' from batch %d (min shape %s), but Triton sends batches from 1 up to max_batch_size; smaller batches will be refused", k, in.Name, in.Min[0], dimsString(in.Min))
			}
		}
	}
}

// checkProfileDims checks the fixed dimensions of one config input
// against the selected profiles; a rank that differs from the plan's is
// reported by the signature check, not here.
func checkProfileDims(col *collector, p, field, name string, shape []int64, mbs int64, profiles []Profile, used []int) {
	full, off := shape, 0
	if mbs > 0 {
		full, off = append([]int64{WildcardDim}, shape...), 1
	}
	for _, k := range used {
		pi, ok := profiles[k].Input(name)
		if !ok || len(pi.Max) != len(full) || len(pi.Min) != len(full) {
			continue
		}
		for d, v := range full {
			if v == WildcardDim || (v >= pi.Min[d] && v <= pi.Max[d]) {
				continue
			}
			col.errorf(at(p+field, d-off), "model configuration specified invalid shape for input '%s': profile %d of the TensorRT plan expects dimension %d (batch included) to be between %d and %d but the configuration gives %d (profile min %s, max %s); use a size in %d..%d, or rebuild the plan with shapes that cover %d",
				name, k, d, pi.Min[d], pi.Max[d], v, dimsString(pi.Min), dimsString(pi.Max), pi.Min[d], pi.Max[d], v)
			break
		}
	}
}

// planAutofillMaxBatch fills max_batch_size 0 the way the TensorRT
// backend's auto-complete does (ModelState::AutoCompleteConfigHelper): the
// largest batch the selected profiles take, unless the listed dims show a
// model that does not batch (no listed tensor is one dimension short of
// the plan's). It applies to plans whose every tensor has a dynamic first
// dimension; others are left to Autofill.
func planAutofillMaxBatch(c *configpb.ModelConfig, sig Signature) {
	if c.GetMaxBatchSize() != 0 || len(sig.Profiles) == 0 {
		return
	}
	if ok, _ := sig.Batchable(); !ok {
		return
	}
	shaped, hint := 0, false
	note := func(name string, dims []int64, reshape *configpb.ModelTensorReshape, ts []TensorSig) {
		if reshape != nil {
			dims = reshape.GetShape()
		}
		if len(dims) == 0 {
			return
		}
		shaped++
		for _, t := range ts {
			if t.Name == name && !t.Unranked && len(t.Shape) == len(dims)+1 {
				hint = true
			}
		}
	}
	for _, in := range c.GetInput() {
		note(in.GetName(), in.GetDims(), in.GetReshape(), sig.Inputs)
	}
	for _, out := range c.GetOutput() {
		note(out.GetName(), out.GetDims(), out.GetReshape(), sig.Outputs)
	}
	if shaped > 0 && !hint {
		return
	}
	var col collector
	best := int64(0)
	for _, k := range usedProfiles(&col, c, len(sig.Profiles)) {
		if n, ok := sig.Profiles[k].MaxBatch(); ok && n > best {
			best = n
		}
	}
	if best <= 0 || best > 1<<31-1 {
		return
	}
	c.MaxBatchSize = int32(best)
	if best > 1 && c.GetSchedulingChoice() == nil {
		c.SchedulingChoice = &configpb.ModelConfig_DynamicBatching{DynamicBatching: &configpb.ModelDynamicBatching{}}
	}
}
