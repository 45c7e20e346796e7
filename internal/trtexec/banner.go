package trtexec

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
)

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
	Version manifest.TRTVersion
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
	v, err := manifest.TRTVersionFromNumber(m[3])
	if err != nil {
		return Banner{}, err
	}
	return Banner{Status: m[1], Test: m[2], Version: v, Build: m[4], Command: m[5]}, nil
}

// clip shortens s for error messages.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
