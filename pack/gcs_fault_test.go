package pack

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/progress"
	"github.com/kiln-ml/kiln/manifest"
)

// dropProxy forwards TCP connections to target and drops the first one
// whose client has sent more than after bytes, once.
type dropProxy struct {
	l       net.Listener
	target  string
	after   int64
	dropped atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn // closed at the end: the client keeps idle ones open
}

func startDropProxy(t *testing.T, target string, after int64) *dropProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{l: l, target: target, after: after}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *dropProxy) host() string { return p.l.Addr().String() }

func (p *dropProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.forward(out, in); out.Close(); in.Close() }()
		go func() { defer p.wg.Done(); io.Copy(in, out); in.Close(); out.Close() }()
	}
}

// forward copies the client's bytes to the server until the drop.
func (p *dropProxy) forward(dst io.Writer, src io.Reader) {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n += int64(k)
			if n > p.after && p.dropped.CompareAndSwap(false, true) {
				return // mid-request: the server sees a truncated body
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A connection dropped in the middle of an upload is retried: the run
// succeeds and what arrived is complete and verified.
func TestGCSDroppedConnection(t *testing.T) {
	for _, name := range []string{"fakestorage", "fake-gcs-server"} {
		t.Run(name, func(t *testing.T) {
			var s gcsServer
			if name == "fakestorage" {
				s = inProcessGCS(t)
			} else {
				s.host = startEmulator(t, "").host
				s.client = emulatorClient(t, s.host)
			}
			proxy := startDropProxy(t, s.host, 12<<20)
			// Uploads go through the proxy; reads go straight to the
			// server (an emulator serves reads for its own host name only).
			c := emulatorClient(t, proxy.host())
			repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
			addFile(t, repo, "1/weights.bin", 40<<20, 3)
			to := "gs://" + testBucket + "/dropped"
			g := GCS{Client: c, Jobs: 2, ChunkSize: 8 << 20, RetryDeadline: 30 * time.Second}
			if _, err := publishGCS(t, repo, to, g); err != nil {
				t.Fatalf("publish through a dropping proxy: %v", err)
			}
			if !proxy.dropped.Load() {
				t.Fatal("the proxy never dropped a connection; the test proves nothing")
			}
			checkObjects(t, repo, s.client, "dropped/")
			if _, err := Pull(context.Background(), dest(t, to), filepath.Join(t.TempDir(), "back"), WithGCS(GCS{Client: s.client})); err != nil {
				t.Fatalf("Pull after the retried upload: %v", err)
			}
		})
	}
}

// Killing the emulator in the middle of a run fails it with an error
// naming the object, leaves no kiln.json under the prefix, and a rerun
// against the restarted emulator completes without sending again the
// objects that had arrived.
func TestGCSEmulatorKilled(t *testing.T) {
	e := startEmulator(t, t.TempDir())
	c := emulatorClient(t, e.host)
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	var files int64
	for i := range 8 {
		addFile(t, repo, "1/shard"+string(rune('0'+i))+".bin", 4<<20, uint64(10+i))
		files += 4 << 20
	}
	var up uploads
	var once sync.Once
	up.hook = func(ev progress.Event) {
		if strings.HasPrefix(ev.Task, "upload ") && ev.Done >= files/2 {
			once.Do(func() { go e.kill() })
		}
	}
	to := "gs://" + testBucket + "/killed"
	g := GCS{Client: c, Jobs: 1, ChunkSize: 1 << 20, RetryDeadline: 2 * time.Second, Progress: up.report}
	_, err := publishGCS(t, repo, to, g)
	if err == nil || !strings.Contains(err.Error(), to+"/tinynet_onnx_fp32/1/shard") {
		t.Fatalf("publish while the emulator dies = %v, want an error naming the object", err)
	}
	t.Logf("the error: %v", err)
	e.kill()
	e.start(t)
	before := listing(t, c, "killed/")
	if before[manifest.FileName] != nil {
		t.Fatal("kiln.json is under the prefix after a failed run")
	}
	var arrived int64
	for rel, a := range before {
		if strings.Contains(rel, "/shard") {
			arrived += a.Size
		}
	}
	if arrived == 0 || arrived >= files {
		t.Fatalf("%d of %d bytes arrived before the kill; want some but not all", arrived, files)
	}
	up.sent()
	up.hook = nil
	if _, err := publishGCS(t, repo, to, g); err != nil {
		t.Fatalf("rerun: %v", err)
	}
	if sent := up.sent(); sent > files-arrived+1<<20 {
		t.Errorf("rerun sent %d bytes; %d of %d had arrived", sent, arrived, files)
	}
	after := checkObjects(t, repo, c, "killed/")
	for rel, a := range before {
		if after[rel].Generation != a.Generation {
			t.Errorf("%s was sent again on the rerun", rel)
		}
	}
}
