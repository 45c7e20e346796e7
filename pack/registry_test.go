package pack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/manifest"
)

// distributionBinary is distribution v3's registry as `make servers`
// installs it, else one on PATH; "" when there is none.
func distributionBinary() string {
	if p, err := filepath.Abs(filepath.Join("..", ".bin", "registry")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("registry"); err == nil {
		return p
	}
	return ""
}

// distributionRegistry starts distribution's registry as a separate
// process on a free loopback port, storing blobs below root, and returns
// its host:port. tb is skipped when the binary is absent.
func distributionRegistry(tb testing.TB, root string) string {
	tb.Helper()
	bin := distributionBinary()
	if bin == "" {
		tb.Skip("distribution's registry not found (run `make servers` to install it into .bin/)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := filepath.Join(tb.TempDir(), "registry.yml")
	yml := fmt.Sprintf("version: 0.1\nlog: {level: error}\nstorage:\n  filesystem: {rootdirectory: %q}\n  delete: {enabled: true}\nhttp: {addr: %q}\n", root, addr)
	if err := os.WriteFile(cfg, []byte(yml), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", bin, err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("registry on %s did not answer /v2/ (%v); its log:\n%s", addr, err, logs.String())
		}
	}
}

// Against distribution's registry run as its own process: push twice (the
// same digest), read the labels back, pull the repository back.
func TestPushPullDistribution(t *testing.T) {
	host := distributionRegistry(t, t.TempDir())
	ctx := context.Background()
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	reg := Registry{Insecure: true}
	for _, comp := range []Compression{Gzip, Zstd} {
		t.Run(string(comp), func(t *testing.T) {
			ref := host + "/kiln/tinynet:" + string(comp)
			cfg := Config{Repo: repo, To: []Destination{dest(t, "image:"+ref)}, Base: "scratch", Compression: comp}
			first, err := Run(ctx, cfg, WithRegistry(reg))
			if err != nil {
				t.Fatal(err)
			}
			second, err := Run(ctx, cfg, WithRegistry(reg))
			if err != nil {
				t.Fatal(err)
			}
			if first[0].Digest != second[0].Digest || first[0].Digest.Validate() != nil {
				t.Fatalf("digests %s then %s, want one valid digest twice", first[0].Digest, second[0].Digest)
			}
			img, err := reg.image(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Config.Labels[KeyModels] != "tinynet_onnx_fp32" || !strings.Contains(cf.Config.Labels[KeyChecks], "pass@serve") {
				t.Errorf("labels = %v, want the model and its verdict", cf.Config.Labels)
			}
			out := filepath.Join(t.TempDir(), "back")
			got, err := Pull(ctx, dest(t, "image:"+ref), out, WithRegistry(reg))
			if err != nil || got != first[0].Digest {
				t.Fatalf("Pull = %s, %v; want %s", got, err, first[0].Digest)
			}
			sameFiles(t, repo, out)
		})
	}
}
