package pack

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/kiln-ml/kiln/internal/atomicfile"
)

// Registry pushes images to and reads them from OCI registries.
type Registry struct {
	// Options are go-containerregistry's: keychain, transport, context.
	Options []remote.Option
	// Insecure allows plain-http registries.
	Insecure bool
	// Backoff is how a push is retried after a failure that may pass (a
	// dropped connection, a 5xx, an upload the registry lost); the zero
	// value means DefaultBackoff.
	Backoff remote.Backoff
}

// DefaultBackoff tries a push up to four times, 1 s, 2 s and 4 s apart
// (go-containerregistry's own retries of each request come on top).
var DefaultBackoff = remote.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 4}

// parseRef reads an image reference.
func (r Registry) parseRef(ref string) (name.Reference, error) {
	var opts []name.Option
	if r.Insecure {
		opts = append(opts, name.Insecure)
	}
	return name.ParseReference(ref, opts...)
}

// push writes img to ref and checks that the registry holds the manifest
// under the digest kiln computed. go-containerregistry retries each
// request; a blob upload the registry no longer accepts after a dropped
// connection fails the write, so the whole write is retried here too:
// blobs that arrived are found by the registry's HEAD check and skipped,
// the others are uploaded again from their start.
func (r Registry) push(ctx context.Context, log *slog.Logger, img v1.Image, ref string) (v1.Hash, error) {
	want, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	nr, err := r.parseRef(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image:%s: %w", ref, err)
	}
	b := r.Backoff
	if b.Steps == 0 {
		b = DefaultBackoff
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.Options...)
	for try := 1; ; try++ {
		err = remote.Write(nr, img, opts...)
		if err == nil || try >= b.Steps || !retryable(ctx, err) {
			break
		}
		wait := b.Step()
		log.Warn("retrying the push", "destination", "image:"+ref, "try", try, "wait", wait, "err", err)
		select {
		case <-ctx.Done():
			return v1.Hash{}, fmt.Errorf("pushing image:%s: %w (after %v)", ref, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
	if err != nil {
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

// retryable reports whether a failed push may succeed when tried again:
// the connection failed, the registry answered 408, 429 or 5xx, or it
// lost or refused an upload a dropped connection left half written.
// Credentials, names and local files are not retried.
func retryable(ctx context.Context, err error) bool {
	var te *transport.Error
	var pe *fs.PathError
	switch {
	case ctx.Err() != nil, errors.As(err, &pe):
		return false
	case !errors.As(err, &te):
		return true
	case te.StatusCode >= 500, te.StatusCode == http.StatusRequestTimeout, te.StatusCode == http.StatusTooManyRequests:
		return true
	}
	for _, d := range te.Errors {
		switch d.Code {
		case transport.BlobUploadInvalidErrorCode, transport.BlobUploadUnknownErrorCode, transport.DigestInvalidErrorCode, transport.SizeInvalidErrorCode:
			return true
		}
	}
	return false
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
