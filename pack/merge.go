package pack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// CollisionError is a model that two sources of a merge both hold with
// different content: a file in one that the other lacks, or the same file
// with different bytes.
type CollisionError struct {
	Model, File string
	// Reason says how the copies differ, naming the sources.
	Reason string
}

func (e *CollisionError) Error() string {
	return fmt.Sprintf("model %s: file %s %s; one repository holds one copy of a model", e.Model, e.File, e.Reason)
}

// Merge reads every source (image:REF, oci-layout:PATH, gs://BUCKET/PREFIX
// or dir:PATH, each verified as Pull verifies it) and assembles their models
// into one repository at dir with one kiln.json: a model only one source
// holds is kept with its records (source, build, calibration, checks); a
// model several hold is kept once if every file is the same in each (a
// record without files, a variant another machine could not build, gives
// way to one with files), and is a *CollisionError otherwise. Source
// records of the same base name must have the same digest. Everything is
// assembled in a temporary directory, checked against the merged kiln.json
// and renamed into dir's place: a failure leaves dir as it was. It returns
// the digest of what was read from each source.
func Merge(ctx context.Context, srcs []Destination, dir string, opts ...Option) ([]manifest.Digest, error) {
	if len(srcs) == 0 {
		return nil, errors.New("merge: no source given")
	}
	var digests []manifest.Digest
	err := atomicfile.ReplaceDir(dir, func(tmp string) error {
		staging := filepath.Join(tmp, ".kiln-merge")
		parts := make([]mergePart, len(srcs))
		for i, src := range srcs {
			p := mergePart{src: src.String(), dir: filepath.Join(staging, strconv.Itoa(i))}
			d, err := readPart(ctx, src, p.dir, opts)
			if err != nil {
				return err
			}
			if p.man, err = manifest.Read(p.dir); err != nil {
				return fmt.Errorf("the repository read from %s: %w", src, err)
			}
			digests, parts[i] = append(digests, d), p
		}
		merged, from, err := mergeManifests(parts)
		if err != nil {
			return err
		}
		for _, m := range merged.Models {
			err := os.Rename(filepath.Join(parts[from[m.Name]].dir, m.Name), filepath.Join(tmp, m.Name))
			if err != nil && !(errors.Is(err, os.ErrNotExist) && len(m.Files) == 0) {
				return fmt.Errorf("model %s from %s: %w", m.Name, parts[from[m.Name]].src, err)
			}
		}
		if err := os.RemoveAll(staging); err != nil {
			return err
		}
		if err := writeManifest(tmp, merged); err != nil {
			return err
		}
		return verifyFiles(tmp, merged)
	})
	if err != nil {
		return nil, fmt.Errorf("merging into %s: %w", dir, err)
	}
	return digests, nil
}

// mergePart is one source of a merge, read into dir.
type mergePart struct {
	src string
	dir string
	man *manifest.Manifest
}

// readPart reads src into dir: Pull, or for dir:PATH a verified copy.
func readPart(ctx context.Context, src Destination, dir string, opts []Option) (manifest.Digest, error) {
	if src.Kind != KindDir {
		return Pull(ctx, src, dir, opts...)
	}
	man, err := manifest.Read(src.Path)
	if err != nil {
		return "", fmt.Errorf("source %s: %w", src, err)
	}
	t, err := readTree(src.Path, man)
	if err != nil {
		return "", err
	}
	return copyDir(ctx, t, dir)
}

// mergeManifests merges the parts' kiln.json and says which part each
// kept model comes from.
func mergeManifests(parts []mergePart) (*manifest.Manifest, map[string]int, error) {
	first := parts[0].man
	merged := &manifest.Manifest{SchemaVersion: first.SchemaVersion, Tool: first.Tool, Models: []*manifest.Model{}}
	from := map[string]int{}
	srcOf := map[string]int{}
	for i, p := range parts {
		for _, s := range p.man.Sources {
			old := merged.SourceNamed(s.Name)
			switch {
			case old == nil:
				merged.PutSource(s)
				srcOf[s.Name] = i
			case old.Digest != s.Digest:
				return nil, nil, fmt.Errorf("source %s: %s has digest %s and %s has %s; one repository holds one source per base name",
					s.Name, parts[srcOf[s.Name]].src, old.Digest, p.src, s.Digest)
			}
		}
		for _, m := range p.man.Models {
			old := merged.Model(m.Name)
			if old == nil {
				merged.Put(m)
				from[m.Name] = i
				continue
			}
			replace, err := sameModel(old, m, parts[from[m.Name]].src, p.src)
			if err != nil {
				return nil, nil, err
			}
			if replace {
				merged.Put(m)
				from[m.Name] = i
			}
		}
	}
	return merged, from, nil
}

// sameModel compares two records of one model name from sources a and b:
// it is an error unless their files are the same; a record without files
// gives way to one with files (replace: keep b's).
func sameModel(old, m *manifest.Model, a, b string) (replace bool, err error) {
	switch {
	case len(m.Files) == 0:
		return false, nil
	case len(old.Files) == 0:
		return true, nil
	}
	files := map[string]manifest.File{}
	for _, f := range old.Files {
		files[f.Path] = f
	}
	for _, f := range m.Files {
		o, ok := files[f.Path]
		switch {
		case !ok:
			return false, &CollisionError{Model: m.Name, File: f.Path, Reason: fmt.Sprintf("is in %s but not in %s", b, a)}
		case o.Digest != f.Digest || o.Size != f.Size:
			return false, &CollisionError{Model: m.Name, File: f.Path, Reason: fmt.Sprintf("differs between %s (%s) and %s (%s)", a, o.Digest, b, f.Digest)}
		}
		delete(files, f.Path)
	}
	if len(files) > 0 {
		path := slices.Sorted(maps.Keys(files))[0]
		return false, &CollisionError{Model: m.Name, File: path, Reason: fmt.Sprintf("is in %s but not in %s", a, b)}
	}
	return false, nil
}
