package pack

import (
	"testing"
)

// FuzzParseDestination: the parser never panics, and what it accepts is
// written back by String and read again to the same destination.
func FuzzParseDestination(f *testing.F) {
	for _, s := range []string{"dir:out", "oci-layout:/tmp/l", "oci-layout:/tmp/l:v1", "oci-archive:repo.tar:tag", "image:localhost:5000/a/b:c",
		"image:reg/a@sha256:0000", "gs://bucket/x", "gs://b", "gs://bkt/a/b/", "gs://bkt//a", "gs:bkt", "dir:", "x", "oci-layout:a:b:c", "oci-layout:a:", "oci-layout::", "oci-layout:c:\\x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDestination(s)
		if err != nil {
			return
		}
		back, err := ParseDestination(d.String())
		if err != nil || back != d {
			t.Fatalf("ParseDestination(%q) = %+v, written %q, read back %+v, %v", s, d, d.String(), back, err)
		}
	})
}
