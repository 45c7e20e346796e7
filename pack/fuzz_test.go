package pack

import (
	"errors"
	"testing"
)

// FuzzParseDestination: the parser never panics, and what it accepts is
// written back by String and read again to the same destination.
func FuzzParseDestination(f *testing.F) {
	for _, s := range []string{"dir:out", "oci-layout:/tmp/l", "oci-layout:/tmp/l:v1", "oci-archive:repo.tar:tag", "image:localhost:5000/a/b:c",
		"image:reg/a@sha256:0000", "gs://bucket/x", "dir:", "x", "oci-layout:a:b:c", "oci-layout:a:", "oci-layout::", "oci-layout:c:\\x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDestination(s)
		if err != nil {
			if errors.Is(err, ErrGCSNotBuilt) != (len(s) >= 3 && s[:3] == "gs:") {
				t.Fatalf("ParseDestination(%q) = %v: gs refusal on the wrong input", s, err)
			}
			return
		}
		back, err := ParseDestination(d.String())
		if err != nil || back != d {
			t.Fatalf("ParseDestination(%q) = %+v, written %q, read back %+v, %v", s, d, d.String(), back, err)
		}
	})
}
