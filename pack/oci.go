package pack

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

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

// repoLayer makes the layer holding the tree under /models. Its content is
// streamed from the files each time it is read (for its digests and for
// each upload), never held in memory.
func repoLayer(t *tree, c Compression) (v1.Layer, error) {
	opener := func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(t.writeTar(pw, strings.TrimPrefix(ModelsDir, "/"))) }()
		return pr, nil
	}
	opts := []tarball.LayerOption{tarball.WithMediaType(types.OCILayer)}
	if c == Zstd {
		opts = []tarball.LayerOption{tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd)}
	}
	l, err := tarball.LayerFromOpener(opener, opts...)
	if err != nil {
		return nil, fmt.Errorf("building the repository layer: %w", err)
	}
	return l, nil
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
	cfg := cf.Config.DeepCopy()
	cfg.Labels = mergeLabels(cfg.Labels, anns)
	if !base.IsScratch() {
		cfg.Entrypoint = []string{"tritonserver", "--model-repository=" + ModelsDir}
		cfg.Cmd = nil
		cfg.ExposedPorts = map[string]struct{}{"8000/tcp": {}, "8001/tcp": {}, "8002/tcp": {}}
	}
	if img, err = mutate.Config(img, *cfg); err != nil {
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
