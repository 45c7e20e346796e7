package pack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// Config is one publishing run.
type Config struct {
	// Repo is the repository kiln built (it holds kiln.json).
	Repo string
	// To are the destinations, written in order; all are checked first.
	To []Destination
	// Base is the serving image's base: an image reference, or "scratch"
	// for a model-only image; empty means DefaultBase.
	Base string
	// Compression of the repository layer: gzip (default) or zstd.
	Compression Compression
	// Target is what TensorRT plans must have been built for.
	Target Target
	// AllowUnchecked publishes models that kiln serve has not passed (a
	// failed verdict is refused all the same).
	AllowUnchecked bool
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.Repo == "" {
		return errors.New("no repository given")
	}
	if len(c.To) == 0 {
		return errors.New("no destination given (--to)")
	}
	switch c.Compression {
	case "", Gzip, Zstd:
	default:
		return fmt.Errorf("compression %q: want gzip or zstd", c.Compression)
	}
	for _, d := range c.To {
		if d.Kind == KindDir && samePath(d.Path, c.Repo) {
			return fmt.Errorf("destination %s is the repository itself", d)
		}
	}
	return nil
}

func samePath(a, b string) bool {
	x, err1 := filepath.Abs(a)
	y, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && x == y
}

// Publication is one destination written: where, the digest that
// identifies what arrived there (the image manifest's; for a directory,
// its kiln.json's), and when.
type Publication = manifest.Publication

// Option injects a collaborator.
type Option func(*runner)

type runner struct {
	log      *slog.Logger
	registry Registry
	gcs      GCS
	now      func() time.Time
}

// WithLogger logs progress to l.
func WithLogger(l *slog.Logger) Option { return func(r *runner) { r.log = l } }

// WithRegistry sets how registries are reached (keychain, transport, --insecure).
func WithRegistry(reg Registry) Option { return func(r *runner) { r.registry = reg } }

// WithClock sets the clock publication times come from.
func WithClock(now func() time.Time) Option { return func(r *runner) { r.now = now } }

func newRunner(opts []Option) *runner {
	r := &runner{log: slog.New(slog.DiscardHandler), now: time.Now}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Run publishes cfg.Repo to every destination. The guards run before
// anything is written: a refused model is a *RefusedError and no
// destination is touched.
func Run(ctx context.Context, cfg Config, opts ...Option) ([]Publication, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := newRunner(opts)
	man, err := manifest.Read(cfg.Repo)
	if err != nil {
		return nil, fmt.Errorf("reading the repository's manifest: %w", err)
	}
	base, err := r.base(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var trt *manifest.TRTVersion
	if base.Image != nil {
		cf, err := base.Image.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("base image %s: %w", base.Ref, err)
		}
		trt = baseTRT(base.Ref, cf)
	}
	if err := guard(man, cfg.Target, trt, cfg.AllowUnchecked); err != nil {
		return nil, err
	}
	t, err := readTree(cfg.Repo, man)
	if err != nil {
		return nil, err
	}
	var img v1.Image
	var pubs []Publication
	for _, d := range cfg.To {
		if d.Kind.isImage() && img == nil {
			if img, err = buildImage(t, base, cfg.Compression); err != nil {
				return pubs, err
			}
		}
		digest, err := r.publish(ctx, t, img, d)
		if err != nil {
			return pubs, err
		}
		r.log.Info("published", "destination", d.String(), "digest", digest)
		pub := Publication{Destination: d.String(), Digest: digest, Time: r.now().UTC()}
		pubs = append(pubs, pub)
		man.Published = manifest.AddPublication(man.Published, pub)
		// Recorded after each destination, so a later failure keeps the
		// record of what did arrive.
		if err := writeManifest(cfg.Repo, man); err != nil {
			return pubs, err
		}
	}
	return pubs, nil
}

// writeManifest replaces repo's kiln.json atomically.
func writeManifest(repo string, man *manifest.Manifest) error {
	data, err := man.Marshal()
	if err != nil {
		return fmt.Errorf("recording the publication in %s: %w", manifest.FileName, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(repo, manifest.FileName), data, 0o644); err != nil {
		return fmt.Errorf("recording the publication in %s: %w", manifest.FileName, err)
	}
	return nil
}

// base resolves the base image when a destination is an image.
func (r *runner) base(ctx context.Context, cfg Config) (Base, error) {
	ref := cfg.Base
	if ref == "" {
		ref = DefaultBase
	}
	needed := false
	for _, d := range cfg.To {
		needed = needed || d.Kind.isImage()
	}
	if !needed || ref == "scratch" {
		return Base{Ref: ref}, nil
	}
	img, err := r.registry.image(ctx, ref)
	if err != nil {
		return Base{}, fmt.Errorf("base image: %w", err)
	}
	return Base{Ref: ref, Image: img}, nil
}

// publish writes one destination and returns the digest of what arrived.
func (r *runner) publish(ctx context.Context, t *tree, img v1.Image, d Destination) (manifest.Digest, error) {
	var h v1.Hash
	var err error
	switch d.Kind {
	case KindDir:
		return copyDir(ctx, t, d.Path)
	case KindGCS:
		return r.gcs.publish(ctx, r.log, t, d)
	case KindOCILayout:
		h, err = writeLayout(img, d.Path, d.Tag)
	case KindOCIArchive:
		h, err = writeArchive(img, d.Path, d.Tag)
	case KindImage:
		h, err = r.registry.push(ctx, r.log, img, d.Ref)
	default:
		err = fmt.Errorf("destination %s: unknown kind", d)
	}
	if err != nil {
		return "", err
	}
	return manifest.Digest(h.String()), nil
}

// Pull reads a repository back from src (image:REF, oci-layout:PATH or gs://)
// into dir, verified, and returns the digest of the image it read.
func Pull(ctx context.Context, src Destination, dir string, opts ...Option) (manifest.Digest, error) {
	r := newRunner(opts)
	var img v1.Image
	var err error
	switch src.Kind {
	case KindGCS:
		return r.gcs.pull(ctx, src, dir)
	case KindImage:
		img, err = r.registry.image(ctx, src.Ref)
	case KindOCILayout:
		img, err = layoutImage(src.Path, src.Tag)
	default:
		return "", fmt.Errorf("source %s: want image:REF, oci-layout:PATH or gs://BUCKET/PREFIX", src)
	}
	if err != nil {
		return "", err
	}
	h, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("source %s: %w", src, err)
	}
	if err := extractImage(ctx, img, dir); err != nil {
		return "", fmt.Errorf("unpacking %s into %s: %w", src, dir, err)
	}
	return manifest.Digest(h.String()), nil
}
