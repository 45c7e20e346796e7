package convert

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// TRTVersion is a TensorRT release, as trtexec reports it in its banner.
type TRTVersion struct {
	Major, Minor, Patch int
}

// String returns the version as "10.3.0".
func (v TRTVersion) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// MarshalText writes the version as "10.3.0", also inside JSON.
func (v TRTVersion) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText reads "10.3.0".
func (v *TRTVersion) UnmarshalText(b []byte) error {
	parsed, err := ParseTRTVersion(string(b))
	if err != nil {
		return err
	}
	*v = parsed
	return nil
}

// IsZero reports whether v is the zero value (no version known).
func (v TRTVersion) IsZero() bool { return v == TRTVersion{} }

// Less reports whether v is an earlier release than w.
func (v TRTVersion) Less(w TRTVersion) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// AtLeast reports whether v is major.minor or later.
func (v TRTVersion) AtLeast(major, minor int) bool {
	return !v.Less(TRTVersion{Major: major, Minor: minor})
}

// CacheVersion returns the number TensorRT writes for this release in the
// trtexec banner ("[TensorRT v100300]") and in calibration cache headers
// ("TRT-100300-EntropyCalibration2"): NV_TENSORRT_VERSION, which is
// major*1000+minor*100+patch up to TensorRT 9 (8.6.1 -> 8601) and
// major*10000+minor*100+patch from TensorRT 10 (10.3.0 -> 100300)
// (reference/formats.md §2.1).
func (v TRTVersion) CacheVersion() int {
	if v.Major >= 10 {
		return v.Major*10000 + v.Minor*100 + v.Patch
	}
	return v.Major*1000 + v.Minor*100 + v.Patch
}

// VersionFromNumber decodes NV_TENSORRT_VERSION as printed in the banner
// ("8601", "100300"); it is the inverse of CacheVersion.
func VersionFromNumber(s string) (TRTVersion, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || len(s) > 7 {
		return TRTVersion{}, fmt.Errorf("TensorRT version number %q: want digits like 8601 or 100300", s)
	}
	var v TRTVersion
	if n >= 100000 {
		v = TRTVersion{Major: n / 10000, Minor: n / 100 % 100, Patch: n % 100}
	} else {
		// Five digits would be neither encoding (10.0.0 is 100000).
		if n >= 10000 {
			return TRTVersion{}, fmt.Errorf("TensorRT version number %q: want digits like 8601 or 100300", s)
		}
		v = TRTVersion{Major: n / 1000, Minor: n / 100 % 10, Patch: n % 100}
	}
	return v, nil
}

// bannerRE matches trtexec's first and last lines (samples/common/logging.h):
// "&&&& RUNNING TensorRT.trtexec [TensorRT v100300] [b17] # trtexec ...".
// Releases before 8.4 print no "[b<build>]".
var bannerRE = regexp.MustCompile(`^&&&& (RUNNING|PASSED|FAILED|WAIVED) (\S+) \[TensorRT v(\d+)\](?: \[b(\d+)\])?(?: # ?(.*))?$`)

// Banner is trtexec's "&&&& RUNNING ..." line, taken apart.
type Banner struct {
	// Status is RUNNING, PASSED, FAILED or WAIVED.
	Status string
	// Test is the test name, "TensorRT.trtexec".
	Test    string
	Version TRTVersion
	// Build is the build number ("11" for "[b11]"); empty before 8.4.
	Build string
	// Command is the command line after "# ", argv joined by spaces.
	Command string
}

// ParseBanner parses one trtexec banner line.
func ParseBanner(line string) (Banner, error) {
	m := bannerRE.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
	if m == nil {
		return Banner{}, fmt.Errorf("not a trtexec banner: %q", clip(line, 80))
	}
	v, err := VersionFromNumber(m[3])
	if err != nil {
		return Banner{}, err
	}
	return Banner{Status: m[1], Test: m[2], Version: v, Build: m[4], Command: m[5]}, nil
}

// ParseTRTVersion parses a dotted version: "10.3.0", "8.6.1", or "10.3"
// (patch 0).
func ParseTRTVersion(s string) (TRTVersion, error) {
	spec, err := ParseVersionSpec(s)
	if err != nil {
		return TRTVersion{}, err
	}
	return TRTVersion{Major: spec.Major, Minor: spec.Minor, Patch: spec.Patch}, nil
}

// VersionSpec is a TensorRT version a target asks for: "10.3" accepts any
// 10.3.x release, "10.3.1" only that one.
type VersionSpec struct {
	Major, Minor, Patch int
	// HasPatch is set when the spec names a patch release.
	HasPatch bool
}

// ParseVersionSpec parses "10.3" or "10.3.1" (a leading "v" is accepted).
func ParseVersionSpec(s string) (VersionSpec, error) {
	parts := strings.Split(strings.TrimPrefix(strings.TrimSpace(s), "v"), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return VersionSpec{}, fmt.Errorf("TensorRT version %q: want major.minor or major.minor.patch, like 10.3 or 8.6.1", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || v > 99 || p == "" || (len(p) > 1 && p[0] == '0') {
			return VersionSpec{}, fmt.Errorf("TensorRT version %q: %q is not a version number", s, p)
		}
		n[i] = v
	}
	if n[0] == 0 {
		return VersionSpec{}, fmt.Errorf("TensorRT version %q: major version must be positive", s)
	}
	return VersionSpec{Major: n[0], Minor: n[1], Patch: n[2], HasPatch: len(parts) == 3}, nil
}

// Match reports whether release v satisfies the spec.
func (s VersionSpec) Match(v TRTVersion) bool {
	return s.Major == v.Major && s.Minor == v.Minor && (!s.HasPatch || s.Patch == v.Patch)
}

// String returns "10.3" or "10.3.1", as the spec was written.
func (s VersionSpec) String() string {
	if s.HasPatch {
		return fmt.Sprintf("%d.%d.%d", s.Major, s.Minor, s.Patch)
	}
	return fmt.Sprintf("%d.%d", s.Major, s.Minor)
}

// clip shortens s for error messages.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
