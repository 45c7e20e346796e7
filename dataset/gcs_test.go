package dataset

import (
	"bytes"
	"context"
	"errors"
	"image/color"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/kiln-ml/kiln/onnx"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/option"
)

// wire sits between the storage client and the in-process GCS emulator. It
// records each request's path and Range header, counts the object bytes
// the client actually reads (media downloads, not JSON metadata), and can
// answer in the emulator's place.
type wire struct {
	base    http.RoundTripper
	answer  func(*http.Request) (*http.Response, error) // nil: the emulator answers
	mu      sync.Mutex
	reqs    []string // "GET /b/o bytes=10-19"
	readLen int64    // object bytes read by the client
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	w.mu.Lock()
	w.reqs = append(w.reqs, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+r.Header.Get("Range")))
	answer := w.answer
	w.mu.Unlock()
	if answer != nil {
		return answer(r)
	}
	res, err := w.base.RoundTrip(r)
	if err == nil && !strings.HasPrefix(r.URL.Path, "/storage/") {
		res.Body = &countedBody{ReadCloser: res.Body, w: w}
	}
	return res, err
}

// reset forgets what was seen so far.
func (w *wire) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reqs, w.readLen = nil, 0
}

func (w *wire) seen() ([]string, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.reqs...), w.readLen
}

type countedBody struct {
	io.ReadCloser
	w *wire
}

func (c *countedBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.w.mu.Lock()
	c.w.readLen += int64(n)
	c.w.mu.Unlock()
	return n, err
}

// fakeGCS starts an in-process emulator holding objects (in bucket "b"
// unless they say otherwise) and returns a GCS reading it through a wire.
func fakeGCS(t testing.TB, objects map[string][]byte) (*GCS, *wire) {
	t.Helper()
	var initial []fakestorage.Object
	for name, content := range objects {
		bucket, object := "b", name
		if b, o, ok := strings.Cut(name, ":"); ok {
			bucket, object = b, o
		}
		initial = append(initial, fakestorage.Object{
			ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: object},
			Content:     content,
		})
	}
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true, InitialObjects: initial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	w := &wire{base: srv.HTTPClient().Transport}
	// The same options as srv.Client(), with the wire in the path.
	c, err := storage.NewClient(context.Background(),
		option.WithHTTPClient(&http.Client{Transport: w}), option.WithCredentials(&google.Credentials{}))
	if err != nil {
		t.Fatal(err)
	}
	g := NewGCSWithClient(c)
	t.Cleanup(func() { g.Close() })
	return g, w
}

func TestGCSList(t *testing.T) {
	ctx := context.Background()
	g, _ := fakeGCS(t, map[string][]byte{
		"calib/sub/b.npy":      []byte("b"),
		"calib/":               nil, // placeholders, as the console's "create folder" makes
		"calib/sub/":           nil,
		"calib/a.npy":          []byte("a"),
		"calib/.DS_Store":      []byte("x"),
		"calib/.cache/c.npy":   []byte("x"),
		"calib/z/y/x/deep.pb":  []byte("x"),
		"calib2/other.npy":     []byte("x"),
		"calibration.tfrecord": []byte("x"),
		"empty/":               nil,
		"other:data/x.npy":     []byte("x"),
	})
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "l.npy"), []byte("l"), 0o644)

	for _, tt := range []struct {
		dir  string
		want []string
		err  string
		is   []error
	}{
		{dir: "gs://b/calib", want: []string{"gs://b/calib/a.npy", "gs://b/calib/sub/b.npy", "gs://b/calib/z/y/x/deep.pb"}},
		{dir: "gs://b/calib/", want: []string{"gs://b/calib/a.npy", "gs://b/calib/sub/b.npy", "gs://b/calib/z/y/x/deep.pb"}},
		{dir: "gs://b/calib/sub", want: []string{"gs://b/calib/sub/b.npy"}},
		{dir: "gs://b/calibration.tfrecord", want: []string{"gs://b/calibration.tfrecord"}},
		{dir: "gs://other", want: []string{"gs://other/data/x.npy"}},
		{dir: "gs://other/", want: []string{"gs://other/data/x.npy"}},
		{dir: local, want: []string{filepath.Join(local, "l.npy")}},
		{dir: "gs://b/missing", err: "list gs://b/missing: no objects found", is: []error{fs.ErrNotExist}},
		{dir: "gs://b/empty", err: "list gs://b/empty: no objects found", is: []error{fs.ErrNotExist}},
		{dir: "gs://nobucket/calib", err: "list gs://nobucket/calib: bucket gs://nobucket not found", is: []error{fs.ErrNotExist, storage.ErrBucketNotExist}},
		{dir: "gs:///calib", err: "gs:///calib: not a gs://bucket/object name"},
	} {
		got, err := g.List(ctx, tt.dir)
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("List(%s) = %v, %v, want error %q", tt.dir, got, err, tt.err)
			}
			for _, is := range tt.is {
				if !errors.Is(err, is) {
					t.Errorf("List(%s) = %v, want it to wrap %v", tt.dir, err, is)
				}
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("List(%s) = %q, %v, want %q", tt.dir, got, err, tt.want)
		}
	}
	if _, err := (&GCS{}).List(ctx, "gs://b/calib"); !errors.Is(err, ErrNeedGCS) {
		t.Errorf("GCS{}.List(gs://b/calib) = %v, want ErrNeedGCS", err)
	}
}

func TestGCSRead(t *testing.T) {
	ctx := context.Background()
	content := bytes.Repeat([]byte("0123456789"), 1000)
	g, w := fakeGCS(t, map[string][]byte{"d/x.bin": content, "d/y.bin": []byte("y")})
	const name = "gs://b/d/x.bin"

	read := func(rc io.ReadCloser, err error) (string, error) {
		if err != nil {
			return "", err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		return string(b), err
	}
	for _, tt := range []struct {
		off, n int64
		want   string
		rng    string
	}{
		{0, -1, string(content), ""},
		{10, 5, "01234", "bytes=10-14"},
		{9995, -1, "56789", "bytes=9995-"},
		{9995, 100, "56789", "bytes=9995-10094"},
		{3, 0, "", "none"},
	} {
		w.reset()
		got, err := read(g.OpenRange(ctx, name, tt.off, tt.n))
		if err != nil || got != tt.want {
			t.Errorf("OpenRange(%d, %d) = %.20q (%d bytes), %v, want %.20q", tt.off, tt.n, got, len(got), err, tt.want)
		}
		reqs, _ := w.seen()
		want := []string{strings.TrimSpace("GET /b/d/x.bin " + tt.rng)}
		if tt.rng == "none" {
			want = nil
		}
		if !reflect.DeepEqual(reqs, want) {
			t.Errorf("OpenRange(%d, %d) sent %q, want %q", tt.off, tt.n, reqs, want)
		}
	}
	if got, err := read(g.Open(ctx, name)); err != nil || got != string(content) {
		t.Errorf("Open(%s) = %d bytes, %v, want %d", name, len(got), err, len(content))
	}

	// Size asks once, then answers from what it learned; List fills the
	// same cache, so the sizes of listed objects cost nothing.
	w.reset()
	for range 2 {
		if n, err := g.Size(ctx, name); err != nil || n != int64(len(content)) {
			t.Errorf("Size(%s) = %d, %v, want %d", name, n, err, len(content))
		}
	}
	if _, err := g.List(ctx, "gs://b/d"); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Size(ctx, "gs://b/d/y.bin"); err != nil || n != 1 {
		t.Errorf("Size(gs://b/d/y.bin) = %d, %v, want 1", n, err)
	}
	if reqs, _ := w.seen(); len(reqs) != 3 {
		t.Errorf("two Size calls and one List after them made requests %q, want a metadata call for each and one listing", reqs)
	}

	// Failures name what was missing and wrap the standard sentinels.
	for _, tt := range []struct {
		op   string
		err  error
		want string
		is   []error
	}{
		{"Open", second(g.Open(ctx, "gs://b/d/nope.npy")), "open gs://b/d/nope.npy: object not found", []error{fs.ErrNotExist, storage.ErrObjectNotExist}},
		{"OpenRange", second(g.OpenRange(ctx, "gs://b/d/nope.npy", 5, 5)), "open gs://b/d/nope.npy: object not found", []error{fs.ErrNotExist}},
		{"Size", second(g.Size(ctx, "gs://b/d/nope.npy")), "stat gs://b/d/nope.npy: object not found", []error{fs.ErrNotExist, storage.ErrObjectNotExist}},
		{"Open", second(g.Open(ctx, "gs://nobucket/x.npy")), "open gs://nobucket/x.npy: bucket gs://nobucket not found", []error{fs.ErrNotExist, storage.ErrBucketNotExist}},
		{"Open", second(g.Open(ctx, "gs://b/d/")), "open gs://b/d/: names a bucket or prefix, not an object", []error{fs.ErrInvalid}},
		{"Open", second(g.Open(ctx, "gs://b")), "open gs://b: names a bucket or prefix, not an object", []error{fs.ErrInvalid}},
		{"Open", second((&GCS{}).Open(ctx, name)), name + ": gs:// sources need the GCS backend", []error{ErrNeedGCS}},
		{"Open", second(g.Open(ctx, filepath.Join(t.TempDir(), "nope"))), "no such file", []error{fs.ErrNotExist}},
	} {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("%s = %v, want %q", tt.op, tt.err, tt.want)
		}
		for _, is := range tt.is {
			if !errors.Is(tt.err, is) {
				t.Errorf("%s = %v, want it to wrap %v", tt.op, tt.err, is)
			}
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestGCSDenied checks refusals from GCS itself, which the emulator does not
// make, so the wire answers as GCS would.
func TestGCSDenied(t *testing.T) {
	ctx := context.Background()
	g, w := fakeGCS(t, map[string][]byte{"x.npy": []byte("x")})
	w.answer = func(r *http.Request) (*http.Response, error) {
		body := `{"error":{"code":403,"message":"kiln-ci@p.iam.gserviceaccount.com does not have storage.objects.list access to the Google Cloud Storage bucket.","errors":[{"reason":"forbidden"}]}}`
		return &http.Response{StatusCode: 403, Status: "403 Forbidden", Request: r,
			Header: http.Header{"Content-Type": {"application/json"}, "X-Secret": {"token"}},
			Body:   io.NopCloser(strings.NewReader(body))}, nil
	}
	_, err := g.List(ctx, "gs://b/calib/")
	want := "list gs://b/calib/: permission denied (HTTP 403: kiln-ci@p.iam.gserviceaccount.com does not have storage.objects.list access"
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, fs.ErrPermission) {
		t.Errorf("List(denied) = %v, want %q... wrapping fs.ErrPermission", err, want)
	}
	_, err = g.Open(ctx, "gs://b/x.npy")
	if want := "open gs://b/x.npy: permission denied (HTTP 403: Forbidden)"; err == nil || err.Error() != want || !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Open(denied) = %v, want %q wrapping fs.ErrPermission", err, want)
	}

	// A transport failure keeps its cause but loses the URL's query.
	w.answer = func(r *http.Request) (*http.Response, error) { return nil, errors.New("tls: handshake refused") }
	_, err = g.Size(ctx, "gs://b/x.npy")
	if err == nil || !strings.Contains(err.Error(), "stat gs://b/x.npy: Get ") || !strings.Contains(err.Error(), "tls: handshake refused") || strings.Contains(err.Error(), "?") {
		t.Errorf("Size(transport failure) = %v, want the cause without a query string", err)
	}
}

func TestSafeMessage(t *testing.T) {
	signed := &url.Error{Op: "Get", URL: "https://user:pw@storage.googleapis.com/b/o?X-Goog-Signature=abc123&X-Goog-Credential=sa%40p", Err: errors.New("EOF")}
	got := (&gcsError{op: "read", name: "gs://b/o", err: signed}).Error()
	if want := `read gs://b/o: Get "https://storage.googleapis.com/b/o": EOF`; got != want {
		t.Errorf("gcsError{signed URL}.Error() = %q, want %q", got, want)
	}
}

// TestGCSDataset opens the same files locally and from the emulator and
// expects the same samples.
func TestGCSDataset(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	objects := map[string][]byte{}
	put := func(rel string, b []byte) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		objects["data/"+rel] = b
	}
	for i := range 3 {
		var buf bytes.Buffer
		vals := []float32{float32(i), float32(i) + 0.5, -float32(i), 42}
		if err := WriteNpy(&buf, mustTensor(t, "x", []int64{2, 2}, vals)); err != nil {
			t.Fatal(err)
		}
		put("npy/"+itoa(i)+".npy", buf.Bytes())
	}
	var buf bytes.Buffer
	x := mustTensor(t, "x", []int64{4, 2}, []float32{0, 1, 2, 3, 4, 5, 6, 7})
	y := mustTensor(t, "y", []int64{4}, []int64{10, 11, 12, 13})
	if err := WriteNpz(&buf, map[string]*onnx.Tensor{"x": x, "y": y}); err != nil {
		t.Fatal(err)
	}
	put("stacked.npz", buf.Bytes())
	solid := func(v uint8) []byte {
		return pngOf(t, 4, 4, func(x, y int) color.NRGBA { return color.NRGBA{v, v, v, 255} })
	}
	put("tfr/calib-00000-of-00002", tfrecordOf(t, imageExample(t, solid(10), 3), imageExample(t, solid(20), 4)))
	put("tfr/calib-00001-of-00002", tfrecordOf(t, imageExample(t, solid(30), 5)))
	put("tfr/README.txt", []byte("ignored"))
	objects["data/tfr/"] = nil
	g, _ := fakeGCS(t, objects)

	for _, tt := range []struct {
		rel  string
		sig  []onnx.ValueInfo
		want int
	}{
		{"npy", []onnx.ValueInfo{floatInput("x", -1, 2, 2)}, 3},
		{"stacked.npz", nil, 4},
		{"tfr", []onnx.ValueInfo{floatInput("input_1", -1, 2, 2, 3)}, 3},
	} {
		t.Run(tt.rel, func(t *testing.T) {
			local, err := Open(ctx, Spec{Path: filepath.Join(dir, tt.rel), Inputs: tt.sig}, nil)
			if err != nil {
				t.Fatal(err)
			}
			remote, err := Open(ctx, Spec{Path: "gs://b/data/" + tt.rel, Inputs: tt.sig}, g)
			if err != nil {
				t.Fatal(err)
			}
			// The same GCS value serves local paths too.
			routed, err := Open(ctx, Spec{Path: filepath.Join(dir, tt.rel), Inputs: tt.sig}, g)
			if err != nil {
				t.Fatal(err)
			}
			if local.Len() != tt.want || remote.Len() != tt.want || routed.Len() != tt.want {
				t.Fatalf("Len() = %d local, %d gs://, %d routed, want %d", local.Len(), remote.Len(), routed.Len(), tt.want)
			}
			for i := range tt.want {
				l, err := local.Sample(ctx, i)
				if err != nil {
					t.Fatal(err)
				}
				r, err := remote.Sample(ctx, i)
				if err != nil {
					t.Fatal(err)
				}
				wantID := "gs://b/data/" + filepath.ToSlash(strings.TrimPrefix(l.ID, dir+string(filepath.Separator)))
				if r.ID != wantID || r.Label != l.Label || len(r.Tensors) != len(l.Tensors) {
					t.Errorf("Sample(%d) = %s label %d, %d tensors, want %s label %d, %d tensors", i, r.ID, r.Label, len(r.Tensors), wantID, l.Label, len(l.Tensors))
				}
				for k, lt := range l.Tensors {
					if rt := r.Tensors[k]; rt == nil || !sameTensor(lt, rt) {
						t.Errorf("Sample(%d)[%q] = %v, want %v", i, k, rt, lt)
					}
				}
			}
		})
	}
}

// TestGCSStreaming checks that indexing reads a TFRecord object once and a
// sample reads only its record, starting at its offset.
func TestGCSStreaming(t *testing.T) {
	ctx := context.Background()
	img := pngOf(t, 2, 2, func(x, y int) color.NRGBA { return color.NRGBA{1, 2, 3, 255} })
	var recs [][]byte
	for i := range 4 {
		// Padding makes each record far larger than any buffer on the way.
		pad := bytes.Repeat([]byte{byte(i)}, 256<<10)
		recs = append(recs, Example{"image/encoded": {Bytes: [][]byte{img}}, "image/class/label": {Int64s: []int64{int64(i)}}, "pad": {Bytes: [][]byte{pad}}}.Marshal())
	}
	file := tfrecordOf(t, recs...)
	var offsets []int64
	off := int64(0)
	for _, r := range recs {
		offsets = append(offsets, off)
		off += int64(len(r)) + 16 // length, its CRC, data, data CRC
	}
	recLen := int64(len(file)) - offsets[3]
	g, w := fakeGCS(t, map[string][]byte{"big/calib.tfrecord": file})

	src, err := Open(ctx, Spec{Path: "gs://b/big/calib.tfrecord"}, g)
	if err != nil {
		t.Fatal(err)
	}
	if reqs, n := w.seen(); n != int64(len(file)) || len(reqs) != 2 {
		t.Errorf("Open read %d bytes in requests %q, want one metadata call and one read of %d bytes", n, reqs, len(file))
	}

	w.reset()
	s, err := src.Sample(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	reqs, n := w.seen()
	if s.Label != 2 || s.ID != "gs://b/big/calib.tfrecord#2" {
		t.Errorf("Sample(2) = %s label %d, want gs://b/big/calib.tfrecord#2 label 2", s.ID, s.Label)
	}
	if want := "GET /b/big/calib.tfrecord bytes=" + strconv.FormatInt(offsets[2], 10) + "-"; len(reqs) != 1 || reqs[0] != want {
		t.Errorf("Sample(2) sent %q, want [%q]", reqs, want)
	}
	if n != recLen {
		t.Errorf("Sample(2) read %d bytes, want its record's %d of the object's %d", n, recLen, len(file))
	}

	// OpenRange of one record asks for exactly that record.
	w.reset()
	rc, err := g.OpenRange(ctx, "gs://b/big/calib.tfrecord", offsets[1], recLen)
	if err != nil {
		t.Fatal(err)
	}
	got, err := NewTFRecordReader(rc).Next()
	rc.Close()
	reqs, n = w.seen()
	if err != nil || !bytes.Equal(got, recs[1]) || n != recLen || len(reqs) != 1 || !strings.HasSuffix(reqs[0], "bytes="+strconv.FormatInt(offsets[1], 10)+"-"+strconv.FormatInt(offsets[1]+recLen-1, 10)) {
		t.Errorf("OpenRange(record 1) = %d bytes, %v; read %d bytes in %q, want record 1 of %d bytes in one ranged GET", len(got), err, n, reqs, recLen)
	}

	// Open streams: reading the first bytes does not fetch the object.
	w.reset()
	rc, err = g.Open(ctx, "gs://b/big/calib.tfrecord")
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 12)
	if _, err := io.ReadFull(rc, head); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, n := w.seen(); n > 64<<10 {
		t.Errorf("reading 12 bytes through Open took %d bytes off the wire, want a streamed read", n)
	}
}

// TestNewGCSEmulator follows the documented path: the storage library finds
// an emulator through STORAGE_EMULATOR_HOST, here on loopback.
func TestNewGCSEmulator(t *testing.T) {
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		// PublicHost makes the emulator serve path-style XML downloads
		// (host:port/bucket/object), which is how the library reads.
		Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1",
		InitialObjects: []fakestorage.Object{{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: "b", Name: "p/x.npy"}, Content: []byte("hello")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(srv.URL(), "http://"))
	ctx := context.Background()
	g, err := NewGCS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	names, err := g.List(ctx, "gs://b/p")
	if err != nil || !reflect.DeepEqual(names, []string{"gs://b/p/x.npy"}) {
		t.Fatalf("List(gs://b/p) = %q, %v", names, err)
	}
	rc, err := g.Open(ctx, names[0])
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, err := io.ReadAll(rc); err != nil || string(b) != "hello" {
		t.Errorf("Open(%s) = %q, %v, want hello", names[0], b, err)
	}
}
