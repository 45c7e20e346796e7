package pack

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
)

// GCS publishes repositories to Google Cloud Storage and reads them back:
// one object per file under the destination's prefix, kiln.json among
// them. Every upload sends its CRC32C (Castagnoli), which the server
// checks, and is checked again against the attributes the server returns;
// objects whose size and CRC32C already match are not sent again. An
// update removes kiln.json first and writes it last, so a reader that
// finds kiln.json under a prefix finds a complete repository.
//
// Uploads are resumable in chunks of ChunkSize and retried (the chunk is
// held in memory until the server has it), so a dropped connection costs
// at most one chunk. The zero GCS is usable.
type GCS struct {
	// Client reaches GCS; nil: one is created with Application Default
	// Credentials, or for STORAGE_EMULATOR_HOST, which the storage library
	// reads itself.
	Client *storage.Client
	// Jobs is how many objects move at once; 0 means DefaultJobs.
	Jobs int
	// ChunkSize is the resumable upload's chunk (rounded up to 256 KiB by
	// the library); 0 means DefaultChunkSize. Each job holds one chunk.
	ChunkSize int64
	// Delete removes objects under the prefix that the repository does
	// not hold (before kiln.json is written).
	Delete bool
	// RetryDeadline is how long the requests of one object are retried
	// after the first failure before the run fails; 0 means
	// DefaultRetryDeadline.
	RetryDeadline time.Duration
	// Progress receives a bytes task per upload or download.
	Progress progress.Reporter
}

// GCS's defaults.
const (
	DefaultJobs          = 4
	DefaultChunkSize     = 16 << 20
	DefaultRetryDeadline = 32 * time.Second // the storage library's per-chunk default
)

// WithGCS sets how gs:// destinations and sources are reached.
func WithGCS(g GCS) Option { return func(r *runner) { r.gcs = g } }

// castagnoli is the CRC32C table GCS uses.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Change is one object a publish to GCS writes or removes.
type Change struct {
	// Op is "upload" or "delete".
	Op string `json:"op"`
	// Object is the gs:// URL of the object.
	Object string `json:"object"`
	// Size is the number of bytes uploaded (the object's size for a delete).
	Size int64 `json:"size"`
}

func (g GCS) jobs() int {
	if g.Jobs > 0 {
		return g.Jobs
	}
	return DefaultJobs
}

// client returns g.Client, or a new client and the function that closes it.
func (g GCS) client(ctx context.Context) (*storage.Client, func(), error) {
	if g.Client != nil {
		return g.Client, func() {}, nil
	}
	c, err := storage.NewClient(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("creating a GCS client: %w", err)
	}
	return c, func() { c.Close() }, nil
}

// retry makes every request of one object retried, uploads included
// (kiln writes whole objects whose content it names by CRC32C, so sending
// one twice does no harm), for at most the retry deadline after its first
// failure: the storage library alone would retry some requests until the
// context ends.
func (g GCS) retry() []storage.RetryOption {
	deadline := g.RetryDeadline
	if deadline <= 0 {
		deadline = DefaultRetryDeadline
	}
	var mu sync.Mutex
	var first time.Time
	return []storage.RetryOption{storage.WithPolicy(storage.RetryAlways), storage.WithErrorFunc(func(err error) bool {
		if !storage.ShouldRetry(err) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		return time.Since(first) < deadline
	})}
}

// objects is what a prefix holds: object attributes by name below it.
type objects map[string]*storage.ObjectAttrs

// list reads every object under prefix (directory placeholders, whose
// names end in "/", left out).
func (g GCS) list(ctx context.Context, b *storage.BucketHandle, url, prefix string) (objects, error) {
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size", "CRC32C", "Generation"}); err != nil {
		return nil, err
	}
	it := b.Retryer(g.retry()...).Objects(ctx, q)
	objs := objects{}
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", url, err)
		}
		if !strings.HasSuffix(a.Name, "/") {
			objs[strings.TrimPrefix(a.Name, prefix)] = a
		}
	}
}

// gcsPlan is what a publish to one prefix does.
type gcsPlan struct {
	bucket, prefix, url string
	upload              []entry
	crc                 map[string]uint32 // of every file of the tree, by rel
	stale               []string          // rel names the tree does not hold
	existing            objects
}

// plan lists the prefix and compares it with the tree.
func (g GCS) plan(ctx context.Context, c *storage.Client, t *tree, d Destination) (*gcsPlan, error) {
	p := &gcsPlan{url: d.String(), crc: map[string]uint32{}}
	p.bucket, p.prefix = d.bucketPrefix()
	objs, err := g.list(ctx, c.Bucket(p.bucket), p.url, p.prefix)
	if err != nil {
		return nil, err
	}
	p.existing = objs
	held := map[string]bool{}
	for _, e := range t.entries {
		if e.dir {
			continue
		}
		held[e.rel] = true
		sum, err := entryCRC(e)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", e.rel, err)
		}
		p.crc[e.rel] = sum
		if a := objs[e.rel]; a == nil || a.Size != e.size || a.CRC32C != sum {
			p.upload = append(p.upload, e)
		}
	}
	for rel := range objs {
		if !held[rel] {
			p.stale = append(p.stale, rel)
		}
	}
	sort.Strings(p.stale)
	return p, nil
}

// upToDate says that the prefix already holds the tree (and, with
// --delete, nothing else).
func (p *gcsPlan) upToDate(del bool) bool {
	return len(p.upload) == 0 && (!del || len(p.stale) == 0)
}

// changes lists what the plan writes and removes, kiln.json (manSize
// bytes, rewritten whenever anything changes) last.
func (p *gcsPlan) changes(del bool, manSize int64) []Change {
	if p.upToDate(del) {
		return nil
	}
	var cs []Change
	for _, e := range p.upload {
		if e.rel != manifest.FileName {
			cs = append(cs, Change{Op: "upload", Object: p.object(e.rel), Size: e.size})
		}
	}
	if del {
		for _, rel := range p.stale {
			cs = append(cs, Change{Op: "delete", Object: p.object(rel), Size: p.existing[rel].Size})
		}
	}
	return append(cs, Change{Op: "upload", Object: p.object(manifest.FileName), Size: manSize})
}

func (p *gcsPlan) object(rel string) string { return "gs://" + p.bucket + "/" + p.prefix + rel }

// entryCRC is the CRC32C of an entry's content.
func entryCRC(e entry) (uint32, error) {
	h := crc32.New(castagnoli)
	if err := e.copyTo(h); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

// publish writes the tree under d's prefix and returns the digest of
// kiln.json as published.
func (g GCS) publish(ctx context.Context, log *slog.Logger, t *tree, d Destination) (manifest.Digest, error) {
	c, done, err := g.client(ctx)
	if err != nil {
		return "", err
	}
	defer done()
	p, err := g.plan(ctx, c, t, d)
	if err != nil {
		return "", err
	}
	man := t.entries[len(t.entries)-1]
	digest := manifest.DigestBytes(man.data)
	if p.upToDate(g.Delete) {
		log.Info("up to date", "destination", p.url, "objects", len(p.crc))
		return digest, nil
	}
	b := c.Bucket(p.bucket)
	if _, ok := p.existing[manifest.FileName]; ok {
		if err := g.remove(ctx, b, p, manifest.FileName); err != nil {
			return "", err
		}
	}
	var files []entry
	var total int64
	for _, e := range p.upload {
		if e.rel != manifest.FileName {
			files = append(files, e)
			total += e.size
		}
	}
	task := progress.Start(g.Progress, "upload "+p.url, total, "bytes")
	err = g.each(ctx, len(files), func(ctx context.Context, i int) error {
		return g.upload(ctx, b, p, files[i], task)
	})
	task.Finish(err)
	if err != nil {
		return "", err
	}
	log.Info("uploaded", "destination", p.url, "objects", len(files), "bytes", total, "unchanged", len(p.crc)-1-len(files))
	if err := g.finish(ctx, log, b, p, man); err != nil {
		return "", err
	}
	return digest, nil
}

// finish removes stale objects (with Delete), checks every object of the
// tree against its size and CRC32C, and writes kiln.json last.
func (g GCS) finish(ctx context.Context, log *slog.Logger, b *storage.BucketHandle, p *gcsPlan, man entry) error {
	if g.Delete {
		err := g.each(ctx, len(p.stale), func(ctx context.Context, i int) error { return g.remove(ctx, b, p, p.stale[i]) })
		if err != nil {
			return err
		}
		log.Info("deleted", "destination", p.url, "objects", len(p.stale))
	} else if len(p.stale) > 0 {
		log.Info("objects under the prefix that the repository does not hold are kept (--delete removes them)", "destination", p.url, "objects", len(p.stale))
	}
	objs, err := g.list(ctx, b, p.url, p.prefix)
	if err != nil {
		return err
	}
	for rel, sum := range p.crc {
		if rel == manifest.FileName {
			continue
		}
		if a := objs[rel]; a == nil || a.CRC32C != sum {
			return fmt.Errorf("checking %s: the object is missing or its CRC32C is not the file's %08x", p.object(rel), sum)
		}
	}
	return g.upload(ctx, b, p, man, nil)
}

// remove deletes one object; one already gone is no error.
func (g GCS) remove(ctx context.Context, b *storage.BucketHandle, p *gcsPlan, rel string) error {
	err := b.Object(p.prefix + rel).Retryer(g.retry()...).Delete(ctx)
	if err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("deleting %s: %w", p.object(rel), err)
	}
	return nil
}

// upload writes one entry as an object, sending its CRC32C, and checks
// the attributes the server returns.
func (g GCS) upload(ctx context.Context, b *storage.BucketHandle, p *gcsPlan, e entry, task *progress.Task) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	want := p.crc[e.rel]
	w := b.Object(p.prefix + e.rel).Retryer(g.retry()...).NewWriter(ctx)
	w.ChunkSize = g.chunk(e.size)
	w.ChunkRetryDeadline = max(g.RetryDeadline, 0)
	w.CRC32C, w.SendCRC32C = want, true
	w.ContentType = "application/octet-stream"
	if e.rel == manifest.FileName {
		w.ContentType = "application/json"
	}
	h := crc32.New(castagnoli)
	err := e.copyTo(io.MultiWriter(w, h, taskWriter{task}))
	if err == nil && h.Sum32() != want {
		err = fmt.Errorf("%s changed while being uploaded", e.rel)
	}
	if err != nil {
		cancel() // abandons the upload: no object is written
		w.Close()
		return fmt.Errorf("uploading %s to %s: %w", e.rel, p.object(e.rel), err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("uploading %s to %s: %w", e.rel, p.object(e.rel), err)
	}
	if a := w.Attrs(); a.Size != e.size || a.CRC32C != want {
		return fmt.Errorf("uploading %s to %s: the server holds %d bytes with CRC32C %08x, kiln sent %d bytes with %08x",
			e.rel, p.object(e.rel), a.Size, a.CRC32C, e.size, want)
	}
	return nil
}

// chunk is the chunk size for an object of size bytes: ChunkSize, or for
// a smaller object just enough to hold it in one request.
func (g GCS) chunk(size int64) int {
	c := g.ChunkSize
	if c <= 0 {
		c = DefaultChunkSize
	}
	const quantum = 256 << 10
	if need := (size/quantum + 1) * quantum; need < c {
		c = need
	}
	return int(c)
}

type taskWriter struct{ t *progress.Task }

func (w taskWriter) Write(p []byte) (int, error) {
	if w.t != nil {
		w.t.Add(int64(len(p)))
	}
	return len(p), nil
}

// each runs f for 0..n-1 on g.jobs() goroutines; the first error cancels
// the rest and is returned.
func (g GCS) each(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range min(g.jobs(), n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			i = n
		}
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
