package pack

import (
	"fmt"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
)

// Target is where the repository will run: the TensorRT release and GPU
// architecture its plans must have been built for (zero: not declared).
type Target struct {
	TRT               manifest.TRTSpec
	ComputeCapability string // "8.9", as manifest.ParseComputeCapability writes it
}

// Refusal is one model pack will not publish, and why.
type Refusal struct {
	Model  string
	Reason string
}

// RefusedError lists the models that would not load where they are going,
// found before anything was written.
type RefusedError struct{ Refusals []Refusal }

func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Refusals))
	for i, r := range e.Refusals {
		parts[i] = r.Model + ": " + r.Reason
	}
	return "refusing to publish: " + strings.Join(parts, "; ")
}

// guard checks every model of man: a TensorRT plan must match the target
// and the base image's TensorRT release; a model must have a passing
// serve verdict unless allowUnchecked. A failed verdict is always refused.
func guard(man *manifest.Manifest, target Target, baseTRT *manifest.TRTVersion, allowUnchecked bool) error {
	var out []Refusal
	for _, m := range man.Models {
		for _, reason := range refusals(m, target, baseTRT, allowUnchecked) {
			out = append(out, Refusal{Model: m.Name, Reason: reason})
		}
	}
	if len(out) > 0 {
		return &RefusedError{Refusals: out}
	}
	return nil
}

// refusals says what is wrong with one model, if anything.
func refusals(m *manifest.Model, target Target, baseTRT *manifest.TRTVersion, allowUnchecked bool) []string {
	var out []string
	if m.Variant.Runtime == manifest.RuntimeTRT && m.Status != manifest.StatusNeedsGPU {
		out = append(out, planRefusals(m, target, baseTRT)...)
	}
	rec, err := check.ReadRecord(m.Checks)
	switch {
	case err != nil:
		out = append(out, fmt.Sprintf("kiln.json checks: %v", err))
	case m.Status == manifest.StatusFailed:
		out = append(out, "kiln.json records status failed")
	case rec != nil && (rec.Verdict == check.VerdictFail || rec.Verdict == check.VerdictError):
		reason := fmt.Sprintf("its last check (%s) verdict is %s", rec.By, rec.Verdict)
		if rec.Reason != "" {
			reason += ": " + rec.Reason
		}
		out = append(out, reason)
	case allowUnchecked:
	case rec == nil || rec.By != "serve":
		out = append(out, "kiln serve has not checked it (run kiln serve on the repository, or pass --allow-unchecked)")
	case rec.Verdict != check.VerdictPass:
		out = append(out, fmt.Sprintf("its last serve verdict is %s, not pass (pass --allow-unchecked to publish it anyway)", rec.Verdict))
	}
	return out
}

// planRefusals compares a plan's recorded TensorRT release and compute
// capability with the target and the base image.
func planRefusals(m *manifest.Model, target Target, baseTRT *manifest.TRTVersion) []string {
	var out []string
	var built manifest.TRTVersion
	var cc string
	if m.Build != nil {
		cc = m.Build.ComputeCapability
		if m.Build.TensorRT != "" {
			v, err := manifest.ParseTRTVersion(m.Build.TensorRT)
			if err != nil {
				out = append(out, fmt.Sprintf("kiln.json build.tensorrt: %v", err))
			}
			built = v
		}
	}
	if built.IsZero() && (!target.TRT.IsZero() || baseTRT != nil) {
		out = append(out, "kiln.json records no TensorRT version for this plan")
	}
	if !built.IsZero() && !target.TRT.IsZero() && !target.TRT.Match(built) {
		out = append(out, fmt.Sprintf("plan built with TensorRT %s, target is TensorRT %s", built, target.TRT))
	}
	if !built.IsZero() && baseTRT != nil && (built.Major != baseTRT.Major || built.Minor != baseTRT.Minor) {
		out = append(out, fmt.Sprintf("plan built with TensorRT %s, the base image has TensorRT %s", built, baseTRT))
	}
	if target.ComputeCapability != "" && cc != target.ComputeCapability {
		if cc == "" {
			cc = "no compute capability"
		}
		out = append(out, fmt.Sprintf("plan built for %s, target is compute capability %s", cc, target.ComputeCapability))
	}
	return out
}

// tritonTRT is the TensorRT release in NVIDIA's Triton containers
// (nvcr.io/nvidia/tritonserver:<release>-py3), major.minor.patch, from:
//   - https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel_21-05.html (21.05: TensorRT 7.2.3.4)
//   - https://docs.twcloud.ai/en/docs/concepts-tutorials/twcc/ccs/concepts/images/triton-inference-server/
//     (tritonserver-21.08-py3 … 22.11-py3, a table of NGC's container contents)
//   - https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html
//     (Release Compatibility Matrix; its rows list the trtllm-python-py3 containers, built on the same
//     release's TensorRT: 24.08 10.3.0, 24.12 10.7.0, 25.01 10.8.0)
//
// A base image's own labels or environment win over this table (baseTRT).
var tritonTRT = map[string]manifest.TRTVersion{
	"21.05": {Major: 7, Minor: 2, Patch: 3},
	"21.08": {Major: 8, Minor: 0, Patch: 1},
	"21.11": {Major: 8, Minor: 0, Patch: 3},
	"22.02": {Major: 8, Minor: 2, Patch: 3},
	"22.05": {Major: 8, Minor: 2, Patch: 5},
	"22.08": {Major: 8, Minor: 4, Patch: 2},
	"22.11": {Major: 8, Minor: 5, Patch: 1},
	"24.08": {Major: 10, Minor: 3, Patch: 0},
	"24.12": {Major: 10, Minor: 7, Patch: 0},
	"25.01": {Major: 10, Minor: 8, Patch: 0},
}

// DefaultBase is the base image of serving images: the Triton release
// whose TensorRT (10.3) is the one kiln's --trt-version defaults to.
const DefaultBase = "nvcr.io/nvidia/tritonserver:24.08-py3"

var releaseRE = regexp.MustCompile(`^(\d\d\.\d\d)`)

// baseTRT finds the TensorRT release of a base image: from its labels or
// environment (TRT_VERSION, TENSORRT_VERSION as NVIDIA's containers set
// them), else from its Triton release (NVIDIA_TRITON_SERVER_VERSION, or
// the reference's tag) through tritonTRT. nil when it cannot tell.
func baseTRT(ref string, cf *v1.ConfigFile) *manifest.TRTVersion {
	vars := map[string]string{}
	if cf != nil {
		for _, kv := range cf.Config.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				vars[k] = v
			}
		}
		for k, v := range cf.Config.Labels {
			vars[k] = v
		}
	}
	for _, k := range []string{"com.nvidia.tensorrt.version", "TRT_VERSION", "TENSORRT_VERSION"} {
		if v, err := manifest.ParseTRTVersion(firstThree(vars[k])); err == nil {
			return &v
		}
	}
	release := vars["NVIDIA_TRITON_SERVER_VERSION"]
	if release == "" {
		if _, tag, ok := strings.Cut(ref[strings.LastIndexByte(ref, '/')+1:], ":"); ok {
			release = tag
		}
	}
	if m := releaseRE.FindString(release); m != "" {
		if v, ok := tritonTRT[m]; ok {
			return &v
		}
	}
	return nil
}

// firstThree keeps major.minor.patch of a four-part version (10.3.0.26).
func firstThree(v string) string {
	parts := strings.Split(v, ".")
	if len(parts) > 3 {
		parts = parts[:3]
	}
	return strings.Join(parts, ".")
}
