package serve

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/serve/report"
)

// group is the artifacts made from one source and their fp32 reference.
type group struct {
	ref     Artifact
	hasRef  bool
	members []Artifact
}

// groupArtifacts groups a repository's artifacts by source; each group's
// reference is its fp32 ONNX model. Without kiln.json the sources are
// unknown, and every model is its own group without a reference.
func groupArtifacts(repo *repository) []group {
	var gs []group
	index := map[manifest.Digest]int{}
	for _, a := range repo.artifacts {
		if repo.manifest == nil || a.Source == "" {
			gs = append(gs, group{members: []Artifact{a}})
			continue
		}
		i, ok := index[a.Source]
		if !ok {
			i = len(gs)
			index[a.Source] = i
			gs = append(gs, group{})
		}
		g := &gs[i]
		g.members = append(g.members, a)
		if !g.hasRef && a.Platform == pbtxt.PlatformONNX && a.Variant.Precision == manifest.FP32 {
			g.ref, g.hasRef = a, true
		}
	}
	return gs
}

// checkGroup runs the reference on the feeds once and checks every member
// against it, appending a report.Model per member.
func (r *runner) checkGroup(ctx context.Context, rep *report.Report, g group, problems map[string]pbtxt.Problems) error {
	if !g.hasRef {
		for _, a := range g.members {
			m := modelOf(a, "")
			m.Verdict, m.Reason = report.NotJudged, "no fp32 ONNX reference to compare with (the repository's kiln.json records none for this model's source)"
			r.loadOnly(ctx, &m, a)
			rep.Models = append(rep.Models, m)
		}
		return nil
	}
	refFailed := func(what string, err error) {
		for _, a := range g.members {
			m := modelOf(a, g.ref.Name)
			m.Verdict, m.Reason = report.Errored, fmt.Sprintf("the fp32 reference %s did not %s: %v", g.ref.Name, what, err)
			rep.Models = append(rep.Models, m)
		}
	}
	sess, err := ort.NewSession(g.ref.Path, r.refOptions)
	if err != nil {
		refFailed("load", err)
		return nil
	}
	defer sess.Close()
	spec := r.cfg.Feed
	spec.Inputs = ort.ValueInfos(sess.Inputs())
	feeds, data, err := check.Feeds(ctx, spec)
	if err != nil {
		return fmt.Errorf("preparing inputs for %s: %w", g.ref.Name, err)
	}
	if rep.Data.Kind == "" {
		rep.Data = reportData(data)
	}
	ref, err := check.RunReference(ctx, ort.Runner{Session: sess}, feeds, nil)
	if err != nil {
		refFailed("run", err)
		return nil
	}
	// Peak maps are found from the graph; a graph kiln cannot read (ONNX
	// Runtime just did) is judged by the shape-based kinds, the stricter.
	if m, err := onnx.LoadWith(g.ref.Path, onnx.LoadOptions{SkipExternalData: true}); err == nil {
		ref.Peaks = check.PeakOutputs(m)
	}
	for _, a := range g.members {
		m := r.checkArtifact(ctx, a, g.ref, ref, data, problems[a.Name])
		rep.Models = append(rep.Models, m)
	}
	return nil
}

// checkArtifact loads a, compares it with the reference, judges it and
// times it.
func (r *runner) checkArtifact(ctx context.Context, a, refArt Artifact, ref *check.Reference, data check.Data, probs pbtxt.Problems) report.Model {
	isRef := a.Path == refArt.Path
	m := modelOf(a, refArt.Name)
	if isRef {
		m.Reference = ""
	}
	for _, p := range probs {
		if p.Severity == pbtxt.SeverityError {
			m.Verdict, m.Reason = report.Fail, fmt.Sprintf("%s does not match its model: %s", pbtxt.ConfigFile, p.String())
			return m
		}
	}
	sess, ok := r.open(ctx, &m, a)
	if !ok {
		return m
	}
	defer sess.Close()
	res, err := ref.Compare(ctx, sess, func(output string) check.Thresholds {
		return check.Resolve(check.Defaults(a.Variant.Precision), r.cfg.Thresholds, a.Name, output)
	})
	if err != nil {
		m.Verdict, m.Reason = report.Errored, err.Error()
		return m
	}
	m.Outputs, m.Thresholds, m.Failures = res.Outputs, res.Thresholds, res.Failures
	switch {
	case len(res.Failures) > 0:
		m.Verdict = report.Fail
	case isRef:
		m.Verdict, m.Reason = report.Pass, "the fp32 reference: it loads and runs"
	case a.Variant.Precision == manifest.INT8 && !data.Real():
		m.Verdict, m.Reason = report.NotJudged, "needs real data: random inputs cannot judge int8 accuracy (give --data, or check after calibrate with its validation split)"
	default:
		m.Verdict = report.Pass
	}
	m.Perf = r.perf(ctx, &m, a, sess, ref.Feeds[0])
	return m
}

// open loads a with its platform's runtime, recording in m why it could
// not be checked or did not load.
func (r *runner) open(ctx context.Context, m *report.Model, a Artifact) (Session, bool) {
	rt := r.runtimes[a.Platform]
	if rt == nil {
		m.Verdict, m.Reason = report.NotChecked, notCheckedReason(a.Platform)
		return nil, false
	}
	sess, err := rt.Open(ctx, a)
	var ue *UnavailableError
	switch {
	case errors.As(err, &ue):
		m.Verdict, m.Reason = report.NotChecked, ue.Reason
		return nil, false
	case err != nil:
		m.Verdict, m.Reason = report.Errored, err.Error()
		return nil, false
	}
	return sess, true
}

// loadOnly loads and runs a model with no reference, so the report can at
// least say whether it loads.
func (r *runner) loadOnly(ctx context.Context, m *report.Model, a Artifact) {
	sess, ok := r.open(ctx, m, a)
	if ok {
		sess.Close()
	}
}

// notCheckedReason says what a platform needs that is missing here.
func notCheckedReason(platform string) string {
	if platform == pbtxt.PlatformTensorRT {
		return "needs GPU/TensorRT (trtexec not found)"
	}
	return fmt.Sprintf("no runtime for platform %q here", platform)
}

// modelOf starts the report entry of an artifact.
func modelOf(a Artifact, ref string) report.Model {
	v := ""
	if a.Version > 0 {
		v = strconv.FormatInt(a.Version, 10)
	}
	return report.Model{Name: a.Name, Version: v, Variant: a.Variant.ID(), Runtime: string(a.Variant.Runtime),
		Precision: string(a.Variant.Precision), Platform: a.Platform, Path: a.Path, Size: a.Size, Reference: ref}
}

// reportData converts the feeds' description for the report.
func reportData(d check.Data) report.Data {
	out := report.Data{Kind: report.DataKind(d.Kind), Path: d.Path, Samples: d.Samples}
	if d.Kind == check.DataRandom || len(d.Random) > 0 {
		out.Seed = d.Seed
	}
	if len(d.Random) > 0 && d.Kind != check.DataRandom {
		out.Note = fmt.Sprintf("random data for inputs %v", d.Random)
	}
	return out
}
