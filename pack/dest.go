package pack

import (
	"errors"
	"fmt"
	"strings"
)

// Kind is the kind of a destination or source.
type Kind string

// The kinds of destination.
const (
	KindDir        Kind = "dir"         // a local directory
	KindOCILayout  Kind = "oci-layout"  // an OCI image layout directory
	KindOCIArchive Kind = "oci-archive" // a tarball of an OCI image layout
	KindImage      Kind = "image"       // an image in a registry
)

// ErrGCSNotBuilt is returned for gs:// destinations, which are planned.
var ErrGCSNotBuilt = errors.New("gs:// destinations are not built yet; use dir:, oci-layout:, oci-archive: or image:")

// Destination is where a repository goes (or, for --from, where one is
// read from), as written "KIND:WHERE".
type Destination struct {
	Kind Kind
	// Path is the directory or file of dir, oci-layout and oci-archive.
	Path string
	// Ref is the image reference of image (registry/repo:tag or @digest).
	Ref string
	// Tag is the name an OCI layout gives the image (ref.name); "latest"
	// when the spec names none.
	Tag string
}

// String writes the destination back in the form ParseDestination reads.
func (d Destination) String() string {
	switch d.Kind {
	case KindImage:
		return "image:" + d.Ref
	case KindOCILayout, KindOCIArchive:
		if (d.Tag != "" && d.Tag != defaultTag) || strings.Contains(d.Path, ":") {
			return string(d.Kind) + ":" + d.Path + ":" + d.Tag
		}
	}
	return string(d.Kind) + ":" + d.Path
}

const defaultTag = "latest"

// ParseDestination reads "dir:PATH", "oci-layout:PATH[:TAG]",
// "oci-archive:FILE.tar[:TAG]" or "image:REF". A gs:// URL is refused with
// ErrGCSNotBuilt.
func ParseDestination(s string) (Destination, error) {
	if strings.HasPrefix(s, "gs://") || strings.HasPrefix(s, "gs:") {
		return Destination{}, ErrGCSNotBuilt
	}
	kind, where, ok := strings.Cut(s, ":")
	if !ok || where == "" {
		return Destination{}, fmt.Errorf("destination %q: want dir:PATH, oci-layout:PATH, oci-archive:FILE.tar or image:REF", s)
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
		return Destination{}, fmt.Errorf("destination %q: unknown kind %q (want dir, oci-layout, oci-archive or image)", s, kind)
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
