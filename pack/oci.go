package pack

import (
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"github.com/klauspost/pgzip"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
)

// ModelsDir is where an image holds the repository (Triton's
// --model-repository and KServe's modelcar path).
const ModelsDir = "/models"

// Annotation and label keys kiln writes, besides the OCI ones.
const (
	keyPrefix        = "io.github.kiln-ml."
	KeyLayer         = keyPrefix + "layer" // on the repository layer: "repository"
	KeySources       = keyPrefix + "source.digest"
	KeyModels        = keyPrefix + "models"
	KeyVariants      = keyPrefix + "variants"
	KeyTensorRT      = keyPrefix + "tensorrt"
	KeyCapability    = keyPrefix + "compute-capability"
	KeyChecks        = keyPrefix + "checks"
	keyOCITitle      = "org.opencontainers.image.title"
	keyOCIBaseName   = "org.opencontainers.image.base.name"
	keyOCIBaseDigest = "org.opencontainers.image.base.digest"
	keyOCIRefName    = "org.opencontainers.image.ref.name"
)

// Compression is how the repository layer is compressed.
type Compression string

// Compressions.
const (
	Gzip Compression = "gzip"
	Zstd Compression = "zstd"
)

// repoLayer makes the layer holding the tree under /models.
func repoLayer(t *tree, c Compression) (v1.Layer, error) {
	if c == "" {
		c = Gzip
	}
	return &streamLayer{t: t, c: c}, nil
}

// gzipBlock is pgzip's block size. It fixes where blocks start, so the
// compressed bytes (and the digest) do not depend on the number of cores.
const gzipBlock = 1 << 20

// streamLayer is the repository layer: the tree as a tar stream, compressed
// with parallel gzip or zstd. Its bytes are made from the files each time
// they are read (once for its digests and size, once per upload), never
// held in memory.
type streamLayer struct {
	t *tree
	c Compression

	once           sync.Once
	digest, diffID v1.Hash
	size           int64
	err            error
}

// compress writes the compressed layer to w and, when plain is not nil,
// the tar it compresses to plain.
func (l *streamLayer) compress(w, plain io.Writer) error {
	var zw io.WriteCloser
	if l.c == Zstd {
		enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			return err
		}
		zw = enc
	} else {
		gw, err := pgzip.NewWriterLevel(w, pgzip.BestSpeed)
		if err == nil {
			err = gw.SetConcurrency(gzipBlock, max(2, runtime.GOMAXPROCS(0)))
		}
		if err != nil {
			return err
		}
		zw = gw
	}
	dst := io.Writer(zw)
	if plain != nil {
		dst = io.MultiWriter(zw, plain)
	}
	if err := l.t.writeTar(dst, strings.TrimPrefix(ModelsDir, "/")); err != nil {
		zw.Close()
		return err
	}
	return zw.Close()
}

// describe computes the digests and size in one pass over the stream.
func (l *streamLayer) describe() error {
	l.once.Do(func() {
		ch, uh := manifest.NewHash(), manifest.NewHash()
		n := &countingWriter{w: ch}
		if l.err = l.compress(n, uh); l.err != nil {
			l.err = fmt.Errorf("building the repository layer: %w", l.err)
			return
		}
		l.size = n.n
		if l.digest, l.err = v1.NewHash(string(manifest.HashDigest(ch))); l.err == nil {
			l.diffID, l.err = v1.NewHash(string(manifest.HashDigest(uh)))
		}
	})
	return l.err
}

// Digest is the sha256 of the compressed layer.
func (l *streamLayer) Digest() (v1.Hash, error) { return l.digest, l.describe() }

// DiffID is the sha256 of the tar.
func (l *streamLayer) DiffID() (v1.Hash, error) { return l.diffID, l.describe() }

// Size is the compressed layer's length.
func (l *streamLayer) Size() (int64, error) { return l.size, l.describe() }

// MediaType is the OCI layer type of the compression.
func (l *streamLayer) MediaType() (types.MediaType, error) {
	if l.c == Zstd {
		return types.OCILayerZStd, nil
	}
	return types.OCILayer, nil
}

// Compressed streams the compressed layer.
func (l *streamLayer) Compressed() (io.ReadCloser, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(l.compress(pw, nil)) }()
	return pr, nil
}

// Uncompressed streams the tar.
func (l *streamLayer) Uncompressed() (io.ReadCloser, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(l.t.writeTar(pw, strings.TrimPrefix(ModelsDir, "/"))) }()
	return pr, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Base is the image a serving image is built on.
type Base struct {
	// Ref is how the user named it ("scratch" for none).
	Ref string
	// Image is nil for scratch.
	Image v1.Image
}

// IsScratch reports whether the image holds the repository only.
func (b Base) IsScratch() bool { return b.Image == nil }

// buildImage makes the image: base + the repository layer, with Triton's
// entrypoint and ports unless the base is scratch, and provenance from
// kiln.json as labels and manifest annotations.
func buildImage(t *tree, base Base, c Compression) (v1.Image, error) {
	layer, err := repoLayer(t, c)
	if err != nil {
		return nil, err
	}
	img := base.Image
	anns := provenance(t.man)
	if base.IsScratch() {
		img = mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	} else {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		anns[keyOCIBaseName] = base.Ref
		if d, err := base.Image.Digest(); err == nil {
			anns[keyOCIBaseDigest] = d.String()
		}
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: mustMediaType(layer),
		Annotations: map[string]string{KeyLayer: "repository", keyOCITitle: ModelsDir},
		History:     v1.History{CreatedBy: "kiln pack", Created: v1.Time{Time: epoch}}})
	if err != nil {
		return nil, fmt.Errorf("adding the repository layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the base image's config: %w", err)
	}
	cf = cf.DeepCopy()
	cfg := &cf.Config
	cfg.Labels = mergeLabels(cfg.Labels, anns)
	if base.IsScratch() {
		// The image spec requires both, and runtimes (umoci, runc) refuse a
		// config without them. The files are the same on every machine, so
		// they are fixed rather than taken from this one.
		cf.OS, cf.Architecture = "linux", "amd64"
	} else {
		cfg.Entrypoint = []string{"tritonserver", "--model-repository=" + ModelsDir}
		cfg.Cmd = nil
		cfg.ExposedPorts = map[string]struct{}{"8000/tcp": {}, "8001/tcp": {}, "8002/tcp": {}}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: epoch}); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, anns).(v1.Image), nil
}

func mustMediaType(l v1.Layer) types.MediaType {
	mt, err := l.MediaType()
	if err != nil {
		return types.OCILayer
	}
	return mt
}

func mergeLabels(old, add map[string]string) map[string]string {
	out := make(map[string]string, len(old)+len(add))
	for k, v := range old {
		out[k] = v
	}
	for k, v := range add {
		out[k] = v
	}
	return out
}

// provenance is what kiln.json says about the repository, as OCI
// annotations: source digests, variants, TensorRT versions, compute
// capabilities and check verdicts, each a sorted comma-separated list.
func provenance(man *manifest.Manifest) map[string]string {
	var sources, models, variants, trt, cc, checks []string
	for _, s := range man.Sources {
		sources = append(sources, string(s.Digest))
	}
	for _, m := range man.Models {
		models = append(models, m.Name)
		variants = append(variants, m.Name+"="+m.Variant.ID())
		if m.Build != nil && m.Build.TensorRT != "" {
			trt = append(trt, m.Name+"="+m.Build.TensorRT)
		}
		if m.Build != nil && m.Build.ComputeCapability != "" {
			cc = append(cc, m.Name+"="+m.Build.ComputeCapability)
		}
		verdict := "none"
		if rec, err := check.ReadRecord(m.Checks); err == nil && rec != nil {
			verdict = string(rec.Verdict) + "@" + rec.By
		}
		checks = append(checks, m.Name+"="+verdict)
	}
	out := map[string]string{keyOCITitle: "kiln model repository", KeyModels: join(models), KeyVariants: join(variants), KeyChecks: join(checks)}
	for k, v := range map[string][]string{KeySources: sources, KeyTensorRT: trt, KeyCapability: cc} {
		if len(v) > 0 {
			out[k] = join(v)
		}
	}
	return out
}

func join(s []string) string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return strings.Join(s, ",")
}
