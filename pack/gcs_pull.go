package pack

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"cloud.google.com/go/storage"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
)

// DryRun lists what Run would upload to and delete from each gs://
// destination of cfg, after the same guards, without writing anything.
// Every destination must be gs://.
func DryRun(ctx context.Context, cfg Config, opts ...Option) ([]Change, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, d := range cfg.To {
		if d.Kind != KindGCS {
			return nil, fmt.Errorf("destination %s: a dry run lists the changes of gs:// destinations only", d)
		}
	}
	r := newRunner(opts)
	man, err := manifest.Read(cfg.Repo)
	if err != nil {
		return nil, fmt.Errorf("reading the repository's manifest: %w", err)
	}
	if err := guard(man, cfg.Target, nil, cfg.AllowUnchecked); err != nil {
		return nil, err
	}
	t, err := readTree(cfg.Repo, man)
	if err != nil {
		return nil, err
	}
	c, done, err := r.gcs.client(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	cs := []Change{}
	for _, d := range cfg.To {
		p, err := r.gcs.plan(ctx, c, t, d)
		if err != nil {
			return nil, err
		}
		cs = append(cs, p.changes(r.gcs.Delete, t.entries[len(t.entries)-1].size)...)
	}
	return cs, nil
}

// ObjectError is an object under a gs:// source whose name would be
// written outside the target, or that holds what its listing did not say.
type ObjectError struct {
	Object string
	Reason string
}

func (e *ObjectError) Error() string {
	return fmt.Sprintf("object %s %s; refusing to read it", e.Object, e.Reason)
}

// objectPath turns the name of an object below the prefix into a path
// relative to the target, or refuses it.
func objectPath(url, rel string) (string, error) {
	if strings.HasPrefix(rel, "/") || strings.ContainsAny(rel, "\\\x00") {
		return "", &ObjectError{Object: url, Reason: "has an absolute name, a backslash or a NUL"}
	}
	for _, part := range strings.Split(rel, "/") {
		if part == "" || part == "." || part == ".." {
			return "", &ObjectError{Object: url, Reason: "has an empty, . or .. path element"}
		}
	}
	return rel, nil
}

// pull reads every object under src's prefix into dir: into a temporary
// directory through an os.Root, each object checked against the size and
// CRC32C its listing gave and read at the generation listed, every file
// then checked against the kiln.json read, and the directory renamed into
// dir's place. It returns the digest of kiln.json.
func (g GCS) pull(ctx context.Context, src Destination, dir string) (manifest.Digest, error) {
	c, done, err := g.client(ctx)
	if err != nil {
		return "", err
	}
	defer done()
	bucket, prefix := src.bucketPrefix()
	objs, err := g.list(ctx, c.Bucket(bucket), src.String(), prefix)
	if err != nil {
		return "", err
	}
	if objs[manifest.FileName] == nil {
		return "", fmt.Errorf("source %s: no %s under the prefix (not a kiln repository, or an update in progress)", src, manifest.FileName)
	}
	names := make([]string, 0, len(objs))
	var total int64
	for rel, a := range objs {
		if _, err := objectPath(src.String()+"/"+rel, rel); err != nil {
			return "", err
		}
		names = append(names, rel)
		total += a.Size
	}
	sort.Strings(names)
	var digest manifest.Digest
	err = atomicfile.ReplaceDir(dir, func(tmp string) error {
		root, err := os.OpenRoot(tmp)
		if err != nil {
			return err
		}
		defer root.Close()
		task := progress.Start(g.Progress, "download "+src.String(), total, "bytes")
		err = g.each(ctx, len(names), func(ctx context.Context, i int) error {
			return g.download(ctx, c.Bucket(bucket), root, prefix, names[i], objs[names[i]], task)
		})
		task.Finish(err)
		if err != nil {
			return err
		}
		man, err := manifest.Read(tmp)
		if err != nil {
			return fmt.Errorf("the repository read from %s: %w", src, err)
		}
		if err := verifyFiles(tmp, man); err != nil {
			return err
		}
		digest, _, err = manifest.DigestFile(filepath.Join(tmp, manifest.FileName))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("reading %s into %s: %w", src, dir, err)
	}
	return digest, nil
}

// download writes one object into root at rel and checks its size and
// CRC32C against its listing.
func (g GCS) download(ctx context.Context, b *storage.BucketHandle, root *os.Root, prefix, rel string, a *storage.ObjectAttrs, task *progress.Task) error {
	url := "gs://" + b.BucketName() + "/" + a.Name
	rd, err := b.Object(prefix + rel).Generation(a.Generation).Retryer(g.retry()...).NewReader(ctx)
	if err != nil {
		if errors.Is(err, storage.ErrObjectNotExist) {
			err = fmt.Errorf("replaced or removed since it was listed: %w", err)
		}
		return fmt.Errorf("reading %s: %w", url, err)
	}
	defer rd.Close()
	if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return err
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("writing %s: %w", url, err)
	}
	h := crc32.New(castagnoli)
	n, err := io.Copy(io.MultiWriter(f, h, taskWriter{task}), io.LimitReader(rd, a.Size+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", url, err)
	}
	if n != a.Size || h.Sum32() != a.CRC32C {
		return &ObjectError{Object: url, Reason: fmt.Sprintf("holds %d bytes with CRC32C %08x, but its listing says %d bytes with %08x", n, h.Sum32(), a.Size, a.CRC32C)}
	}
	return nil
}
