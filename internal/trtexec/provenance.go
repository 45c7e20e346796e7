package trtexec

import (
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
)

// Provenance is what kiln records next to a plan: the TensorRT release, GPU
// and flags that built it. Engines only load on the TensorRT version and GPU
// architecture they were built for (unless built version- or hardware-
// compatible), so a plan without this record cannot be placed safely.
type Provenance struct {
	TensorRT      string        `json:"tensorrt"`
	TensorRTBuild string        `json:"tensorrt_build,omitempty"`
	PrecisionPath PrecisionPath `json:"precision_path"`
	// GPU and ComputeCapability are what trtexec reported building on.
	GPU               string         `json:"gpu,omitempty"`
	ComputeCapability string         `json:"compute_capability,omitempty"`
	HardwareCompat    HardwareCompat `json:"hardware_compatibility_level,omitempty"`
	VersionCompatible bool           `json:"version_compatible,omitempty"`
	// Command is the trtexec argv, with the temporary engine name replaced
	// by the plan's file name.
	Command            []string        `json:"command"`
	DurationSec        float64         `json:"duration_s"`
	EngineBuildSeconds float64         `json:"engine_build_s,omitempty"`
	PlanDigest         manifest.Digest `json:"plan_digest"`
	Size               int64           `json:"size"`
}

// NewProvenance makes the record for a build of spec that gave r.
func NewProvenance(spec Spec, r *Result) Provenance {
	p := Provenance{
		TensorRT:          r.Version.String(),
		PrecisionPath:     r.PrecisionPath,
		HardwareCompat:    spec.HardwareCompat,
		VersionCompatible: spec.VersionCompatible,
		DurationSec:       r.Duration.Seconds(),
		PlanDigest:        r.PlanDigest,
		Size:              r.Size,
	}
	if r.Log != nil {
		p.TensorRTBuild = r.Log.Build
		p.GPU, p.ComputeCapability = r.Log.Device, r.Log.ComputeCapability
		p.EngineBuildSeconds = r.Log.EngineBuildSeconds
	}
	p.Command = make([]string, len(r.Command))
	for i, a := range r.Command {
		if strings.HasPrefix(a, "--saveEngine=") {
			a = "--saveEngine=" + filepath.Base(r.PlanPath)
		}
		p.Command[i] = a
	}
	return p
}
