package pack

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/iterator"

	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
)

const testBucket = "kiln-test"

// gcsServer is a GCS emulator a test talks to: its client and its address.
type gcsServer struct {
	client *storage.Client
	host   string // host:port, as STORAGE_EMULATOR_HOST takes it
}

// inProcessGCS starts fakestorage on loopback with the test bucket.
func inProcessGCS(t *testing.T) gcsServer {
	t.Helper()
	s, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", Writer: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: testBucket})
	return gcsServer{client: s.Client(), host: strings.TrimPrefix(s.URL(), "http://")}
}

// emulatorBinary is fake-gcs-server as make servers installs it.
func emulatorBinary(t testing.TB) string {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("..", ".bin", "fake-gcs-server"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("fake-gcs-server is not installed at %s: run make servers", bin)
	}
	return bin
}

// emulator is fake-gcs-server running as its own process.
type emulator struct {
	bin, host, root string
	cmd             *exec.Cmd
}

// startEmulator runs fake-gcs-server on a free loopback port, in memory
// or (root not empty) on a filesystem backend that outlives the process.
func startEmulator(t testing.TB, root string) *emulator {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	e := &emulator{bin: emulatorBinary(t), host: host, root: root}
	e.start(t)
	t.Cleanup(e.kill)
	c := emulatorClient(t, host)
	if err := c.Bucket(testBucket).Create(context.Background(), "kiln", nil); err != nil {
		t.Fatalf("creating bucket %s: %v", testBucket, err)
	}
	return e
}

func (e *emulator) start(t testing.TB) {
	t.Helper()
	_, port, _ := net.SplitHostPort(e.host)
	args := []string{"-scheme", "http", "-host", "127.0.0.1", "-port", port, "-public-host", e.host,
		"-external-url", "http://" + e.host, "-log-level", "warn"}
	if e.root != "" {
		args = append(args, "-backend", "filesystem", "-filesystem-root", e.root)
	} else {
		args = append(args, "-backend", "memory")
	}
	e.cmd = exec.Command(e.bin, args...)
	e.cmd.Stderr = os.Stderr
	if err := e.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", e.bin, err)
	}
	for i := 0; ; i++ { // wait until it answers (a readiness poll, not an assertion)
		resp, err := http.Get("http://" + e.host + "/storage/v1/b")
		if err == nil {
			resp.Body.Close()
			return
		}
		if i == 300 {
			t.Fatalf("fake-gcs-server on %s did not answer: %v", e.host, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the emulator and waits for it.
func (e *emulator) kill() {
	if e.cmd != nil && e.cmd.Process != nil {
		e.cmd.Process.Kill()
		e.cmd.Wait()
		e.cmd = nil
	}
}

// emulatorClient reaches host the standard way: STORAGE_EMULATOR_HOST.
func emulatorClient(t testing.TB, host string) *storage.Client {
	t.Helper()
	t.Setenv("STORAGE_EMULATOR_HOST", host)
	c, err := storage.NewClient(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// addFile writes n pseudo-random bytes (seeded) at rel below the model
// directory of repo and records the file in kiln.json.
func addFile(t testing.TB, repo, rel string, n int64, seed uint64) {
	t.Helper()
	model := "tinynet_onnx_fp32"
	p := filepath.Join(repo, model, filepath.FromSlash(rel))
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))
	buf := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(buf)) {
		for i := 0; i+8 <= len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], r.Uint64())
		}
		if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	d, size, err := manifest.DigestFile(p)
	if err != nil {
		t.Fatal(err)
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	m := man.Model(model)
	kept := m.Files[:0]
	for _, f := range m.Files {
		if f.Path != rel {
			kept = append(kept, f)
		}
	}
	m.Files = append(kept, manifest.File{Path: rel, Size: size, Digest: d})
	if err := writeManifest(repo, man); err != nil {
		t.Fatal(err)
	}
}

// listing is every object of the test bucket under prefix, by name below it.
func listing(t testing.TB, c *storage.Client, prefix string) map[string]*storage.ObjectAttrs {
	t.Helper()
	objs := map[string]*storage.ObjectAttrs{}
	it := c.Bucket(testBucket).Objects(context.Background(), &storage.Query{Prefix: prefix})
	for {
		a, err := it.Next()
		if err == iterator.Done {
			return objs
		}
		if err != nil {
			t.Fatalf("listing gs://%s/%s: %v", testBucket, prefix, err)
		}
		objs[strings.TrimPrefix(a.Name, prefix)] = a
	}
}

// fileCRC is the CRC32C of a file.
func fileCRC(t testing.TB, p string) uint32 {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return h.Sum32()
}

// uploads records the bytes each upload task reports, by task.
type uploads struct {
	mu     sync.Mutex
	totals map[string]int64
	done   map[string]int64
	hook   func(progress.Event)
}

func (u *uploads) report(e progress.Event) {
	u.mu.Lock()
	if u.totals == nil {
		u.totals, u.done = map[string]int64{}, map[string]int64{}
	}
	u.totals[e.Task] += e.Total * boolInt(e.State == progress.Started)
	u.done[e.Task] = e.Done
	hook := u.hook
	u.mu.Unlock()
	if hook != nil {
		hook(e)
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// sent is the bytes upload tasks started with, and resets the record.
func (u *uploads) sent() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var n int64
	for task, total := range u.totals {
		if strings.HasPrefix(task, "upload ") {
			n += total
		}
	}
	u.totals, u.done = nil, nil
	return n
}

func (s gcsServer) String() string { return fmt.Sprintf("gcs@%s", s.host) }
