package dataset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
)

// GCS reads datasets from Google Cloud Storage. Names are
// "gs://bucket/object"; any other name is handed to Local, so one GCS value
// serves a whole run whatever mix of local and gs:// paths it sees.
//
// List treats a name as a directory unless an object has exactly that name:
// List("gs://b/calib") returns the object "calib" alone if it exists and
// otherwise every object under "calib/", skipping directory placeholders
// (names ending in "/") and hidden objects (a path element below the listed
// prefix that starts with ".", as Local skips hidden files). Open and
// OpenRange stream object readers; Size answers from the attributes List saw,
// so indexing a directory costs one listing, not a call per object.
//
// Errors name the object (os.PathError style: "open gs://b/o: object not
// found") and wrap fs.ErrNotExist or fs.ErrPermission, and the storage
// library's ErrObjectNotExist or ErrBucketNotExist, for errors.Is. They never
// carry credentials, query strings or response bodies.
//
// Objects stored with Content-Encoding: gzip are served decompressed by
// GCS, so their size and ranges do not match what Open returns; store
// datasets uncompressed.
//
// The zero GCS has no client and refuses gs:// names with ErrNeedGCS.
// A GCS is safe for concurrent use.
type GCS struct {
	client *storage.Client

	mu    sync.Mutex
	sizes map[string]int64 // by full gs:// name, from List and Size
}

var _ RangeFS = (*GCS)(nil)

// NewGCS connects to GCS with Application Default Credentials (the
// GOOGLE_APPLICATION_CREDENTIALS file, gcloud's application-default login, or
// the metadata server), unless opts say otherwise. The storage library itself
// honours STORAGE_EMULATOR_HOST: when it is set (host:port, as
// fake-gcs-server prints), requests go to that emulator over plain HTTP
// without credentials. Close releases the client.
func NewGCS(ctx context.Context, opts ...option.ClientOption) (*GCS, error) {
	c, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("creating GCS client: %w", err)
	}
	return NewGCSWithClient(c), nil
}

// NewGCSWithClient reads through an existing client (a test server's, or
// one configured by the caller). Close closes c.
func NewGCSWithClient(c *storage.Client) *GCS {
	return &GCS{client: c}
}

// Close closes the storage client.
func (g *GCS) Close() error {
	if g.client == nil {
		return nil
	}
	return g.client.Close()
}

// splitGCS splits "gs://bucket/object" into its bucket and object name. The
// object is empty for "gs://bucket" and "gs://bucket/".
func splitGCS(name string) (bucket, object string, err error) {
	rest := strings.TrimPrefix(name, "gs://")
	bucket, object, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("%s: not a gs://bucket/object name", name)
	}
	return bucket, object, nil
}

// object resolves a name that must name one object.
func (g *GCS) object(op, name string) (*storage.ObjectHandle, error) {
	if g.client == nil {
		return nil, fmt.Errorf("%s: %w", name, ErrNeedGCS)
	}
	bucket, object, err := splitGCS(name)
	if err != nil {
		return nil, err
	}
	if object == "" || strings.HasSuffix(object, "/") {
		return nil, &gcsError{op: op, name: name, what: "names a bucket or prefix, not an object", kind: fs.ErrInvalid}
	}
	return g.client.Bucket(bucket).Object(object), nil
}

// Open streams an object (or opens a local file).
func (g *GCS) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if !isGCS(name) {
		return Local{}.Open(ctx, name)
	}
	return g.OpenRange(ctx, name, 0, -1)
}

// OpenRange streams length bytes of an object from offset, or the rest of
// it when length is negative, with one ranged request: nothing before offset
// is transferred.
func (g *GCS) OpenRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if !isGCS(name) {
		return Local{}.OpenRange(ctx, name, offset, length)
	}
	o, err := g.object("open", name)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, &gcsError{op: "open", name: name, what: fmt.Sprintf("negative offset %d", offset), kind: fs.ErrInvalid}
	}
	if length == 0 {
		// The library sends no Range header for a zero length and would
		// fetch the whole object.
		return io.NopCloser(strings.NewReader("")), nil
	}
	r, err := o.NewRangeReader(ctx, offset, length)
	if err != nil {
		return nil, g.fail(ctx, "open", o, err)
	}
	return &gcsReader{r: r, name: name}, nil
}

// Size returns an object's size, from List's attributes when it has them.
func (g *GCS) Size(ctx context.Context, name string) (int64, error) {
	if !isGCS(name) {
		return Local{}.Size(ctx, name)
	}
	g.mu.Lock()
	size, ok := g.sizes[name]
	g.mu.Unlock()
	if ok {
		return size, nil
	}
	o, err := g.object("stat", name)
	if err != nil {
		return 0, err
	}
	attrs, err := o.Attrs(ctx)
	if err != nil {
		return 0, g.fail(ctx, "stat", o, err)
	}
	g.remember(name, attrs.Size)
	return attrs.Size, nil
}

func (g *GCS) remember(name string, size int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sizes == nil {
		g.sizes = map[string]int64{}
	}
	g.sizes[name] = size
}

// List returns dir itself when an object has that name, and otherwise the
// objects under dir+"/", sorted. An empty listing is an error wrapping
// fs.ErrNotExist, as a missing local directory is.
func (g *GCS) List(ctx context.Context, dir string) ([]string, error) {
	if !isGCS(dir) {
		return Local{}.List(ctx, dir)
	}
	if g.client == nil {
		return nil, fmt.Errorf("%s: %w", dir, ErrNeedGCS)
	}
	bucket, prefix, err := splitGCS(dir)
	if err != nil {
		return nil, err
	}
	b := g.client.Bucket(bucket)
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		// One metadata call tells a file from a directory; a listing by
		// prefix alone would also walk every "calib2/..." next to "calib".
		attrs, err := b.Object(prefix).Attrs(ctx)
		switch {
		case err == nil:
			g.remember(dir, attrs.Size)
			return []string{dir}, nil
		case !errors.Is(err, storage.ErrObjectNotExist):
			return nil, g.fail(ctx, "list", b.Object(prefix), err)
		}
		prefix += "/"
	}
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size"}); err != nil {
		return nil, err
	}
	base := "gs://" + bucket + "/"
	var names []string
	it := b.Objects(ctx, q)
	for {
		attrs, err := it.Next()
		if err == iterator.Done {
			break
		}
		if err != nil {
			return nil, g.failList(dir, bucket, err)
		}
		if strings.HasSuffix(attrs.Name, "/") || hiddenBelow(attrs.Name[len(prefix):]) {
			continue
		}
		name := base + attrs.Name
		g.remember(name, attrs.Size)
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, &gcsError{op: "list", name: dir, what: "no objects found", kind: fs.ErrNotExist}
	}
	sort.Strings(names)
	return names, nil
}

// hiddenBelow reports whether a relative object path has an element
// starting with ".".
func hiddenBelow(rel string) bool {
	for el := range strings.SplitSeq(rel, "/") {
		if strings.HasPrefix(el, ".") {
			return true
		}
	}
	return false
}

// gcsReader streams an object and names it in read errors.
type gcsReader struct {
	r    *storage.Reader
	name string
}

func (r *gcsReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = &gcsError{op: "read", name: r.name, err: err}
	}
	return n, err
}

func (r *gcsReader) Close() error { return r.r.Close() }

// gcsError is a failed GCS call. Its message is built only from the
// operation, the gs:// name, a fixed description and a scrubbed summary of
// the cause; the cause itself stays reachable through Unwrap.
type gcsError struct {
	op   string // open, stat, list, read
	name string // gs://bucket[/object]
	what string // "object not found"; empty for an unclassified cause
	kind error  // fs.ErrNotExist, fs.ErrPermission, fs.ErrInvalid or nil
	err  error  // the library's error, or nil
}

func (e *gcsError) Error() string {
	msg := e.op + " " + e.name + ": "
	switch {
	case e.what != "" && e.err != nil && e.kind != fs.ErrNotExist:
		return msg + e.what + " (" + safeMessage(e.err) + ")"
	case e.what != "":
		return msg + e.what
	default:
		return msg + safeMessage(e.err)
	}
}

// Unwrap returns the classification and the library's error.
func (e *gcsError) Unwrap() []error {
	var out []error
	for _, err := range []error{e.kind, e.err} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// fail classifies an error from an object call. A missing object is checked
// against its bucket (one more call, on the failure path only), so that a
// mistyped bucket is reported as such.
func (g *GCS) fail(ctx context.Context, op string, o *storage.ObjectHandle, err error) error {
	name := "gs://" + o.BucketName() + "/" + o.ObjectName()
	e := classify(op, name, err)
	if errors.Is(err, storage.ErrObjectNotExist) && ctx.Err() == nil {
		if _, berr := g.client.Bucket(o.BucketName()).Attrs(ctx); errors.Is(berr, storage.ErrBucketNotExist) {
			e.what, e.err = "bucket gs://"+o.BucketName()+" not found", errors.Join(storage.ErrBucketNotExist, err)
		}
	}
	return e
}

// failList classifies an error from a listing, where 404 means the bucket.
func (g *GCS) failList(dir, bucket string, err error) error {
	if code(err) == http.StatusNotFound && !errors.Is(err, storage.ErrBucketNotExist) {
		err = errors.Join(storage.ErrBucketNotExist, err)
	}
	return classify("list", dir, err)
}

func classify(op, name string, err error) *gcsError {
	e := &gcsError{op: op, name: name, err: err}
	switch c := code(err); {
	case errors.Is(err, storage.ErrBucketNotExist):
		bucket, _, _ := splitGCS(name)
		e.what, e.kind = "bucket gs://"+bucket+" not found", fs.ErrNotExist
	case errors.Is(err, storage.ErrObjectNotExist) || c == http.StatusNotFound:
		e.what, e.kind = "object not found", fs.ErrNotExist
	case c == http.StatusForbidden:
		e.what, e.kind = "permission denied", fs.ErrPermission
	case c == http.StatusUnauthorized:
		e.what, e.kind = "not authenticated (check Application Default Credentials)", fs.ErrPermission
	case c == http.StatusRequestedRangeNotSatisfiable:
		e.what, e.kind = "range not satisfiable (object shorter than expected)", io.ErrUnexpectedEOF
	}
	return e
}

// code returns the HTTP status of a googleapi error, or 0.
func code(err error) int {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}

// safeMessage describes err without what might carry secrets: URLs lose
// their query strings and user info, and API errors keep their status code
// and message but drop headers and bodies.
func safeMessage(err error) string {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		msg := ge.Message
		if msg == "" {
			msg = http.StatusText(ge.Code)
		}
		return fmt.Sprintf("HTTP %d: %s", ge.Code, msg)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		u := ue.URL
		if p, perr := url.Parse(ue.URL); perr == nil {
			p.User, p.RawQuery, p.ForceQuery, p.Fragment = nil, "", false, ""
			u = p.String()
		} else {
			u = "(unparsable URL)"
		}
		return fmt.Sprintf("%s %q: %v", ue.Op, u, ue.Err)
	}
	return err.Error()
}
