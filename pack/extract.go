package pack

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// EscapeError is a layer entry that would be written outside the target.
type EscapeError struct {
	Entry  string
	Reason string
}

func (e *EscapeError) Error() string {
	return fmt.Sprintf("layer entry %q %s; refusing to unpack it", e.Entry, e.Reason)
}

// extractImage unpacks the repository layer of img (the one annotated as
// kiln's, else the last) into dir: into a temporary directory, checking
// the layer's digest, size and diff ID and every file against the
// kiln.json it holds, then renamed into dir's place.
func extractImage(ctx context.Context, img v1.Image, dir string) error {
	desc, diffID, err := repoLayerDesc(img)
	if err != nil {
		return err
	}
	layer, err := img.LayerByDigest(desc.Digest)
	if err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	return atomicfile.ReplaceDir(dir, func(tmp string) error {
		rc, err := layer.Compressed()
		if err != nil {
			return fmt.Errorf("layer %s: %w", desc.Digest, err)
		}
		defer rc.Close()
		if err := unpackLayer(ctx, rc, desc, diffID, tmp); err != nil {
			return err
		}
		man, err := manifest.Read(tmp)
		if err != nil {
			return fmt.Errorf("the image's repository: %w", err)
		}
		return verifyFiles(tmp, man)
	})
}

// repoLayerDesc finds the repository layer's descriptor and diff ID.
func repoLayerDesc(img v1.Image) (v1.Descriptor, v1.Hash, error) {
	m, err := img.Manifest()
	if err != nil {
		return v1.Descriptor{}, v1.Hash{}, fmt.Errorf("reading the image manifest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Descriptor{}, v1.Hash{}, fmt.Errorf("reading the image config: %w", err)
	}
	if len(m.Layers) == 0 || len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return v1.Descriptor{}, v1.Hash{}, fmt.Errorf("image has %d layers and %d diff IDs; want a repository layer", len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	i := len(m.Layers) - 1
	for j, l := range m.Layers {
		if l.Annotations[KeyLayer] == "repository" {
			i = j
		}
	}
	return m.Layers[i], cf.RootFS.DiffIDs[i], nil
}

// unpackLayer reads a compressed layer, unpacks its entries below models/
// into dir and checks the compressed digest and size and the diff ID
// once the stream has been read to its end.
func unpackLayer(ctx context.Context, r io.Reader, desc v1.Descriptor, diffID v1.Hash, dir string) error {
	ch := manifest.NewHash()
	counted := &countingReader{r: io.TeeReader(r, ch)}
	plain, err := decompress(counted, desc.MediaType)
	if err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	uh := manifest.NewHash()
	if err := untar(ctx, io.TeeReader(plain, uh), dir); err != nil {
		return err
	}
	if _, err := io.Copy(uh, plain); err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	if _, err := io.Copy(io.Discard, counted); err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	if got := manifest.HashDigest(ch); string(got) != desc.Digest.String() || counted.n != desc.Size {
		return fmt.Errorf("layer %s: read %d bytes with digest %s, the manifest records %d bytes", desc.Digest, counted.n, got, desc.Size)
	}
	if got := manifest.HashDigest(uh); string(got) != diffID.String() {
		return fmt.Errorf("layer %s: uncompressed digest %s, the config records diff ID %s", desc.Digest, got, diffID)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decompress opens a layer stream by its media type.
func decompress(r io.Reader, mt types.MediaType) (io.Reader, error) {
	switch mt {
	case types.OCILayer, types.DockerLayer, types.OCIRestrictedLayer:
		return gzip.NewReader(r)
	case types.OCILayerZStd:
		return zstd.NewReader(r)
	case types.OCIUncompressedLayer, types.DockerUncompressedLayer:
		return r, nil
	}
	return nil, fmt.Errorf("media type %s is not a layer kiln reads", mt)
}

// untar writes the entries below models/ into dir through an os.Root, so
// that nothing, links included, can write outside dir; entries that would
// escape it are refused by name.
func untar(ctx context.Context, r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	prefix := strings.TrimPrefix(ModelsDir, "/")
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the layer: %w", err)
		}
		rel, err := entryPath(hdr.Name, prefix)
		if err != nil || rel == "" {
			if err != nil {
				return err
			}
			continue
		}
		if err := writeTarEntry(root, tr, hdr, rel); err != nil {
			return err
		}
	}
}

// entryPath turns a layer entry name into a path relative to the target,
// or refuses it.
func entryPath(name, prefix string) (string, error) {
	if strings.HasPrefix(name, "/") || strings.Contains(name, `\`) || filepath.VolumeName(name) != "" {
		return "", &EscapeError{Entry: name, Reason: "is an absolute path"}
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", &EscapeError{Entry: name, Reason: "has a .. element"}
		}
	}
	clean := path.Clean(name)
	if clean == prefix || clean == "." {
		return "", nil
	}
	rel, ok := strings.CutPrefix(clean, prefix+"/")
	if !ok {
		return "", &EscapeError{Entry: name, Reason: "is outside " + ModelsDir}
	}
	return rel, nil
}

// writeTarEntry writes one entry: directories, regular files and links
// whose target stays inside the root.
func writeTarEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, rel string) error {
	if err := belowLink(root, hdr.Name, rel); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return root.MkdirAll(rel, 0o755)
	case tar.TypeReg:
		if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return err
		}
		f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
		n, err := io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("layer entry %q: %d bytes, header says %d", hdr.Name, n, hdr.Size)
		}
		return err
	case tar.TypeSymlink, tar.TypeLink:
		return writeLink(root, hdr, rel)
	}
	return &EscapeError{Entry: hdr.Name, Reason: fmt.Sprintf("has type %q, which a model repository does not hold", hdr.Typeflag)}
}

// writeLink makes a symbolic or hard link whose target is inside the root.
func writeLink(root *os.Root, hdr *tar.Header, rel string) error {
	target := hdr.Linkname
	if strings.HasPrefix(target, "/") {
		return &EscapeError{Entry: hdr.Name, Reason: "links to the absolute path " + target}
	}
	resolved := path.Join(path.Dir(rel), target)
	if hdr.Typeflag == tar.TypeLink {
		r, err := entryPath(target, strings.TrimPrefix(ModelsDir, "/"))
		if err != nil || r == "" {
			return &EscapeError{Entry: hdr.Name, Reason: "links to " + target + ", outside " + ModelsDir}
		}
		resolved = r
	}
	if !filepath.IsLocal(filepath.FromSlash(resolved)) {
		return &EscapeError{Entry: hdr.Name, Reason: "links to " + target + ", outside the target"}
	}
	if hdr.Typeflag == tar.TypeLink {
		// A hard link to a symbolic link is a second symbolic link,
		// whose relative target may point out from its new place.
		if err := belowLink(root, hdr.Name, resolved); err != nil {
			return err
		}
		if fi, err := root.Lstat(resolved); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return &EscapeError{Entry: hdr.Name, Reason: "is a hard link to the symbolic link " + target}
		}
	}
	if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeLink {
		return root.Link(resolved, rel)
	}
	return root.Symlink(target, rel)
}

// belowLink refuses an entry whose parent directories pass through a
// symbolic link: where the entry lands (and where a relative link in it
// points) would no longer be where its name says, so the checks on names
// would not hold.
func belowLink(root *os.Root, name, rel string) error {
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := root.Lstat(p)
		if err != nil {
			return nil // not made yet: nothing below it exists either
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return &EscapeError{Entry: name, Reason: "is below the symbolic link " + p}
		}
	}
	return nil
}
