package pack

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Kind is the kind of a destination or source.
type Kind string

// The kinds of destination.
const (
	KindDir        Kind = "dir"         // a local directory
	KindOCILayout  Kind = "oci-layout"  // an OCI image layout directory
	KindOCIArchive Kind = "oci-archive" // a tarball of an OCI image layout
	KindImage      Kind = "image"       // an image in a registry
	KindGCS        Kind = "gs"          // objects under a prefix of a GCS bucket
)

// Destination is where a repository goes (or, for --from, where one is
// read from), as written "KIND:WHERE".
type Destination struct {
	Kind Kind
	// Path is the directory or file of dir, oci-layout and oci-archive;
	// for gs, "bucket" or "bucket/prefix" (no trailing slash).
	Path string
	// Ref is the image reference of image (registry/repo:tag or @digest).
	Ref string
	// Tag is the name an OCI layout gives the image (ref.name); "latest"
	// when the spec names none.
	Tag string
}

// isImage says whether a destination of kind k receives an image.
func (k Kind) isImage() bool { return k != KindDir && k != KindGCS }

// String writes the destination back in the form ParseDestination reads.
func (d Destination) String() string {
	switch d.Kind {
	case KindImage:
		return "image:" + d.Ref
	case KindGCS:
		return "gs://" + d.Path
	case KindOCILayout, KindOCIArchive:
		if (d.Tag != "" && d.Tag != defaultTag) || strings.Contains(d.Path, ":") {
			return string(d.Kind) + ":" + d.Path + ":" + d.Tag
		}
	}
	return string(d.Kind) + ":" + d.Path
}

const defaultTag = "latest"

// ParseDestination reads "dir:PATH", "oci-layout:PATH[:TAG]",
// "oci-archive:FILE.tar[:TAG]", "image:REF" or "gs://BUCKET[/PREFIX]".
func ParseDestination(s string) (Destination, error) {
	if strings.HasPrefix(s, "gs:") {
		return parseGCS(s)
	}
	kind, where, ok := strings.Cut(s, ":")
	if !ok || where == "" {
		return Destination{}, fmt.Errorf("destination %q: want dir:PATH, oci-layout:PATH, oci-archive:FILE.tar, image:REF or gs://BUCKET/PREFIX", s)
	}
	if strings.ContainsRune(s, 0) {
		return Destination{}, fmt.Errorf("destination %q: contains a NUL byte", s)
	}
	d := Destination{Kind: Kind(kind)}
	switch d.Kind {
	case KindDir:
		d.Path = where
	case KindOCILayout, KindOCIArchive:
		d.Path, d.Tag = splitTag(where)
		if d.Path == "" {
			return Destination{}, fmt.Errorf("destination %q: the path is empty", s)
		}
	case KindImage:
		if strings.ContainsAny(where, " \t\r\n") {
			return Destination{}, fmt.Errorf("destination %q: an image reference has no spaces", s)
		}
		d.Ref = where
	default:
		return Destination{}, fmt.Errorf("destination %q: unknown kind %q (want dir, oci-layout, oci-archive, image or gs://)", s, kind)
	}
	return d, nil
}

// splitTag splits "PATH:TAG" as skopeo's oci: transport does: the part
// after the last colon is a tag when it has no path separator.
func splitTag(where string) (string, string) {
	i := strings.LastIndexByte(where, ':')
	if i < 0 || strings.ContainsAny(where[i+1:], `/\`) || where[i+1:] == "" {
		return where, defaultTag
	}
	return where[:i], where[i+1:]
}

// parseGCS reads "gs://BUCKET[/PREFIX[/]]". The bucket follows GCS's
// naming rules; the prefix is a '/'-separated path with no empty, "." or
// ".." element, so that every object kiln writes or reads under it maps
// to a file inside the repository.
func parseGCS(s string) (Destination, error) {
	rest, ok := strings.CutPrefix(s, "gs://")
	if !ok {
		return Destination{}, fmt.Errorf("destination %q: want gs://BUCKET/PREFIX", s)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	if !validBucket(bucket) {
		return Destination{}, fmt.Errorf("destination %q: bucket %q: want 3 to 63 of a-z, 0-9, '-', '_', '.', starting and ending with a letter or digit", s, bucket)
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix != "" {
		if !utf8.ValidString(prefix) || strings.ContainsAny(prefix, "\x00\r\n") {
			return Destination{}, fmt.Errorf("destination %q: the prefix holds a NUL, newline or invalid UTF-8", s)
		}
		for _, part := range strings.Split(prefix, "/") {
			if part == "" || part == "." || part == ".." {
				return Destination{}, fmt.Errorf("destination %q: the prefix has an empty, . or .. element", s)
			}
		}
	}
	return Destination{Kind: KindGCS, Path: strings.TrimSuffix(bucket+"/"+prefix, "/")}, nil
}

func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 {
		return false
	}
	for i, c := range b {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || i == len(b)-1 || !strings.ContainsRune("-_.", c)) {
			return false
		}
	}
	return true
}

// bucketPrefix splits a gs destination's Path into the bucket and the
// prefix objects are named under ("" or "dir/").
func (d Destination) bucketPrefix() (string, string) {
	bucket, prefix, _ := strings.Cut(d.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	return bucket, prefix
}
