package manifest

import (
	"fmt"
	"strconv"
	"strings"
)

// TRTVersion is a TensorRT release. It is kiln's only representation of a
// TensorRT version: the one calibration caches name, the one trtexec's
// banner reports and the one kiln.json records.
type TRTVersion struct {
	Major, Minor, Patch int
}

// MinTRTMajor is the oldest TensorRT major release kiln works with.
const MinTRTMajor = 7

// String returns the version as "10.3.0".
func (v TRTVersion) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
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

// Number is NV_TENSORRT_VERSION, the number TensorRT prints in trtexec's
// banner ("[TensorRT v100300]") and writes in calibration cache headers
// ("TRT-100300-EntropyCalibration2"): major*1000+minor*100+patch up to
// TensorRT 9 (8.6.1 -> 8601), major*10000+minor*100+patch from TensorRT 10
// (10.3.0 -> 100300) (reference/formats.md §2.1).
func (v TRTVersion) Number() int {
	if v.Major >= 10 {
		return v.Major*10000 + v.Minor*100 + v.Patch
	}
	return v.Major*1000 + v.Minor*100 + v.Patch
}

// MarshalText writes the version as "10.3.0", also inside JSON.
func (v TRTVersion) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText reads any form ParseTRTVersion accepts.
func (v *TRTVersion) UnmarshalText(b []byte) error {
	parsed, err := ParseTRTVersion(string(b))
	if err != nil {
		return err
	}
	*v = parsed
	return nil
}

// TRTVersionFromNumber decodes NV_TENSORRT_VERSION as the banner prints it
// ("8601", "100300"); it is the inverse of Number. Four digits are the
// encoding up to TensorRT 9, six the one from TensorRT 10 to 99; five
// digits are neither (9.x never reached minor 10, and 10.0.0 is 100000).
func TRTVersionFromNumber(digits string) (TRTVersion, error) {
	bad := fmt.Errorf("TensorRT version number %q: want the digits of trtexec's banner, like 8601 or 100300", digits)
	if digits == "" || len(digits) > 6 || strings.Trim(digits, "0123456789") != "" {
		return TRTVersion{}, bad
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return TRTVersion{}, bad
	}
	var v TRTVersion
	switch {
	case n >= 100000:
		v = TRTVersion{Major: n / 10000, Minor: n / 100 % 100, Patch: n % 100}
	case n >= 1000 && n < 10000:
		v = TRTVersion{Major: n / 1000, Minor: n / 100 % 10, Patch: n % 100}
	default:
		return TRTVersion{}, bad
	}
	if v.Major < MinTRTMajor {
		return TRTVersion{}, fmt.Errorf("TensorRT version number %q is TensorRT %s: kiln needs TensorRT %d or later", digits, v, MinTRTMajor)
	}
	return v, nil
}

// TRTSpec is a TensorRT version as a user writes it: "10.3" (any 10.3.x
// release where a release is matched; 10.3.0 where one version is needed,
// as in a cache header), "10.3.1", or a banner number such as 100301.
type TRTSpec struct {
	TRTVersion
	// AnyPatch is set when the patch release was not written ("10.3").
	AnyPatch bool
}

// ParseTRTSpec is kiln's one parser of TensorRT versions: "10.3", "10.3.0",
// "v10.3.0", or the number of trtexec's banner ("100300", "8601").
func ParseTRTSpec(s string) (TRTSpec, error) {
	s = strings.TrimSpace(s)
	if s != "" && !strings.Contains(s, ".") {
		v, err := TRTVersionFromNumber(s)
		return TRTSpec{TRTVersion: v}, err
	}
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return TRTSpec{}, fmt.Errorf("TensorRT version %q: want major.minor, major.minor.patch or trtexec's banner number, like 10.3, 8.6.1 or 100300", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || v > 99 || p == "" || p[0] == '+' || (len(p) > 1 && p[0] == '0') {
			return TRTSpec{}, fmt.Errorf("TensorRT version %q: %q is not a version number", s, p)
		}
		n[i] = v
	}
	if n[0] < MinTRTMajor {
		return TRTSpec{}, fmt.Errorf("TensorRT version %q: kiln needs TensorRT %d or later", s, MinTRTMajor)
	}
	if n[0] < 10 && n[1] > 9 {
		// Before 10 the version number has one digit for the minor release.
		return TRTSpec{}, fmt.Errorf("TensorRT version %q: releases before 10 have minor versions 0-9", s)
	}
	return TRTSpec{TRTVersion: TRTVersion{Major: n[0], Minor: n[1], Patch: n[2]}, AnyPatch: len(parts) == 2}, nil
}

// ParseTRTVersion parses a version with ParseTRTSpec; "10.3" is 10.3.0.
func ParseTRTVersion(s string) (TRTVersion, error) {
	spec, err := ParseTRTSpec(s)
	return spec.TRTVersion, err
}

// Match reports whether release v satisfies the spec.
func (s TRTSpec) Match(v TRTVersion) bool {
	return s.Major == v.Major && s.Minor == v.Minor && (s.AnyPatch || s.Patch == v.Patch)
}

// String returns "10.3" or "10.3.1", as the spec was written.
func (s TRTSpec) String() string {
	if s.AnyPatch {
		return fmt.Sprintf("%d.%d", s.Major, s.Minor)
	}
	return s.TRTVersion.String()
}
