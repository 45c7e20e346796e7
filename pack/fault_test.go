package pack

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-ml/kiln/manifest"
)

// writeRepo writes a repository of n ONNX models of size bytes each of
// weight-like data (float32 from a normal distribution, seeded by the
// model's index), with a kiln.json whose digests are the files' own and a
// passing check record, and returns the total size of the weights.
func writeRepo(tb testing.TB, dir string, n int, size int64) int64 {
	tb.Helper()
	rec, _ := json.Marshal(passed())
	man := manifest.New("kiln test")
	for i := range n {
		name := fmt.Sprintf("model%02d_onnx_fp32", i)
		m := &manifest.Model{Name: name, Variant: manifest.Variant{Runtime: manifest.RuntimeONNX, Precision: manifest.FP32},
			Version: 1, Status: manifest.StatusOK, Checks: rec}
		weights := filepath.Join(dir, name, "1", "model.onnx")
		if err := os.MkdirAll(filepath.Dir(weights), 0o755); err != nil {
			tb.Fatal(err)
		}
		d := writeWeights(tb, weights, size, uint64(i))
		cfg := []byte(fmt.Sprintf("name: %q\nbackend: \"onnxruntime\"\n", name))
		if err := os.WriteFile(filepath.Join(dir, name, "config.pbtxt"), cfg, 0o644); err != nil {
			tb.Fatal(err)
		}
		m.Source = d
		m.Files = []manifest.File{{Path: "1/model.onnx", Size: size, Digest: d},
			{Path: "config.pbtxt", Size: int64(len(cfg)), Digest: manifest.DigestBytes(cfg)}}
		man.PutSource(&manifest.Source{Name: name, Path: name + ".onnx", Format: "onnx", Digest: d, Size: size})
		man.Put(m)
	}
	data, err := man.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644); err != nil {
		tb.Fatal(err)
	}
	return int64(n) * size
}

// writeWeights writes size bytes of float32 weights to file and returns
// their digest.
func writeWeights(tb testing.TB, file string, size int64, seed uint64) manifest.Digest {
	f, err := os.Create(file)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := manifest.NewHash()
	w := io.MultiWriter(f, h)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6e))
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		for i := 0; i+4 <= len(buf); i += 4 {
			binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(float32(rng.NormFloat64()*0.02)))
		}
		if _, err := w.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			tb.Fatal(err)
		}
	}
	return manifest.HashDigest(h)
}

// resetProxy forwards TCP connections to target and resets a connection
// once the client has sent more than after bytes on it, the first times
// connections that do.
type resetProxy struct {
	target string
	after  int64
	left   atomic.Int64 // resets still to do
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func startResetProxy(t *testing.T, target string, after int64, times int) (*resetProxy, string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &resetProxy{target: target, after: after, conns: map[net.Conn]bool{}}
	p.left.Store(int64(times))
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.conns { // the client's idle keep-alive connections
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns[c] = true
			p.mu.Unlock()
			go p.serve(c)
		}
	}()
	return p, l.Addr().String()
}

func (p *resetProxy) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	go io.Copy(client, server)
	buf := make([]byte, 32<<10)
	var sent int64
	for {
		n, err := client.Read(buf)
		sent += int64(n)
		if sent > p.after && p.left.Add(-1) >= 0 {
			// A reset, not a clean close: what a lost link or a proxy
			// that gives up looks like to the client.
			client.(*net.TCPConn).SetLinger(0)
			return
		}
		if n > 0 {
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A connection reset in the middle of the layer's upload, once and then
// more often than go-containerregistry retries an upload by itself: kiln
// retries, and what the registry holds is the complete image, verified by
// digest and pulled back file by file.
func TestPushSurvivesDroppedConnection(t *testing.T) {
	registries := map[string]func(*testing.T) string{
		"in-process":   testRegistry,
		"distribution": func(t *testing.T) string { return distributionRegistry(t, t.TempDir()) },
	}
	for name, start := range registries {
		for _, times := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/%d resets", name, times), func(t *testing.T) {
				repo := filepath.Join(t.TempDir(), "repo")
				size := writeRepo(t, repo, 2, 3<<20)
				host := start(t)
				proxy, via := startResetProxy(t, host, size/2, times)
				reg := Registry{Insecure: true, Backoff: remote.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 4}}
				ctx := context.Background()
				pubs, err := Run(ctx, Config{Repo: repo, To: []Destination{dest(t, "image:"+via+"/kiln/big:1")}, Base: "scratch"}, WithRegistry(reg))
				if err != nil {
					t.Fatalf("Run through a proxy that resets the upload %d times = %v, want a retried push", times, err)
				}
				if left := proxy.left.Load(); left > 0 {
					t.Fatalf("the proxy reset %d connections, want %d", int64(times)-left, times)
				}
				got, err := Pull(ctx, dest(t, "image:"+host+"/kiln/big:1"), filepath.Join(t.TempDir(), "back"), WithRegistry(reg))
				if err != nil || got != pubs[0].Digest {
					t.Fatalf("Pull from the registry itself = %s, %v; want %s", got, err, pubs[0].Digest)
				}
			})
		}
	}
}
