package pack

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-ml/kiln/internal/atomicfile"
)

// Registry pushes images to and reads them from OCI registries.
type Registry struct {
	// Options are go-containerregistry's: keychain, transport, context.
	Options []remote.Option
	// Insecure allows plain-http registries.
	Insecure bool
}

// parseRef reads an image reference.
func (r Registry) parseRef(ref string) (name.Reference, error) {
	var opts []name.Option
	if r.Insecure {
		opts = append(opts, name.Insecure)
	}
	return name.ParseReference(ref, opts...)
}

// push writes img to ref and checks that the registry holds the manifest
// under the digest kiln computed.
func (r Registry) push(ctx context.Context, img v1.Image, ref string) (v1.Hash, error) {
	want, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	nr, err := r.parseRef(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image:%s: %w", ref, err)
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.Options...)
	if err := remote.Write(nr, img, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing image:%s: %w", ref, err)
	}
	desc, err := remote.Head(nr, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading back image:%s: %w", ref, err)
	}
	if desc.Digest != want {
		return v1.Hash{}, fmt.Errorf("image:%s: the registry holds %s, kiln pushed %s", ref, desc.Digest, want)
	}
	return want, nil
}

// image reads an image from a registry.
func (r Registry) image(ctx context.Context, ref string) (v1.Image, error) {
	nr, err := r.parseRef(ref)
	if err != nil {
		return nil, fmt.Errorf("image:%s: %w", ref, err)
	}
	img, err := remote.Image(nr, append([]remote.Option{remote.WithContext(ctx)}, r.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("reading image:%s: %w", ref, err)
	}
	return img, nil
}

// writeLayout writes img into dir as an OCI image layout named tag, into a
// temporary directory that is checked (read back, digest compared) and
// renamed into dir's place.
func writeLayout(img v1.Image, dir, tag string) (v1.Hash, error) {
	var digest v1.Hash
	err := atomicfile.ReplaceDir(dir, func(tmp string) error {
		d, err := fillLayout(img, tmp, tag)
		digest = d
		return err
	})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing oci-layout:%s: %w", dir, err)
	}
	return digest, nil
}

// fillLayout writes img as the only image of a new layout in dir and reads
// it back.
func fillLayout(img v1.Image, dir, tag string) (v1.Hash, error) {
	want, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{keyOCIRefName: tag})); err != nil {
		return v1.Hash{}, err
	}
	back, err := layoutImage(dir, tag)
	if err != nil {
		return v1.Hash{}, err
	}
	if got, err := back.Digest(); err != nil || got != want {
		return v1.Hash{}, fmt.Errorf("read back %v, wrote %s (%v)", got, want, err)
	}
	return want, nil
}

// layoutImage finds the image named tag in an OCI layout (or its only image).
func layoutImage(dir, tag string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("oci-layout:%s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("oci-layout:%s: index.json: %w", dir, err)
	}
	for _, d := range im.Manifests {
		if d.Annotations[keyOCIRefName] == tag || (len(im.Manifests) == 1 && tag == defaultTag) {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("oci-layout:%s: %w", dir, err)
			}
			return img, nil
		}
	}
	return nil, fmt.Errorf("oci-layout:%s: no image named %q in index.json", dir, tag)
}

// writeArchive writes img as a tarball of an OCI image layout (plus the
// manifest.json docker load reads), built in a temporary directory next
// to file and written atomically.
func writeArchive(img v1.Image, file, tag string) (v1.Hash, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(file), "."+filepath.Base(file)+".kiln-tmp-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing oci-archive:%s: %w", file, err)
	}
	defer os.RemoveAll(tmp)
	digest, err := fillLayout(img, tmp, tag)
	if err == nil {
		err = dockerManifest(img, tmp, tag)
	}
	if err == nil {
		err = atomicfile.Write(file, 0o644, func(w io.Writer) error { return tarDir(w, tmp) })
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing oci-archive:%s: %w", file, err)
	}
	return digest, nil
}

// dockerManifest writes the manifest.json of docker save's format, whose
// paths point into the layout's blobs, as docker save itself writes since
// Docker 25.
func dockerManifest(img v1.Image, dir, tag string) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	entry := struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{Config: blobPath(m.Config.Digest), RepoTags: []string{"kiln/repository:" + tag}}
	for _, l := range m.Layers {
		entry.Layers = append(entry.Layers, blobPath(l.Digest))
	}
	data, err := json.Marshal([]any{entry})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), data, 0o644)
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// tarDir writes the files below dir as a tar stream in lexical order with
// fixed times and owners.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: rel + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch, Format: tar.FormatPAX})
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Typeflag: tar.TypeReg, Size: info.Size(), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		return entry{src: p, size: info.Size()}.copyTo(tw)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
