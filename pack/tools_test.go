package pack

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
)

// These tests check what kiln writes with tools nobody here wrote:
// skopeo (containers/image) and umoci (opencontainers' own layout tool).
// They skip where the tools are absent; CI installs both (.ci/run).

// tool finds name on PATH or skips tb.
func tool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Skipf("%s not found on PATH (apt-get install -y %s); skipping the check by an independent tool", name, name)
	}
	return p
}

// runTool runs a tool and returns its stdout, failing tb with its output.
func runTool(tb testing.TB, name string, args ...string) []byte {
	tb.Helper()
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// skopeoInfo is the part of `skopeo inspect` kiln checks.
type skopeoInfo struct {
	Digest string
	Labels map[string]string
	Layers []string
}

func skopeoInspect(t *testing.T, args ...string) skopeoInfo {
	t.Helper()
	var info skopeoInfo
	out := runTool(t, "skopeo", append([]string{"inspect"}, args...)...)
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("skopeo inspect %v: %v\n%s", args, err, out)
	}
	return info
}

// skopeo reads the pushed image (digest and labels) and copies it to a
// dir: whose manifest and blobs hash to the digests kiln recorded; it
// reads the OCI layout under its tag too.
func TestSkopeo(t *testing.T) {
	tool(t, "skopeo")
	ctx := context.Background()
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	host := distributionOrInProcess(t)
	tmp := t.TempDir()
	ref, lay := host+"/kiln/tinynet:1", filepath.Join(tmp, "layout")
	pubs, err := Run(ctx, Config{Repo: repo, To: []Destination{dest(t, "image:"+ref), dest(t, "oci-layout:"+lay+":v1")}, Base: "scratch"},
		WithRegistry(Registry{Insecure: true}))
	if err != nil {
		t.Fatal(err)
	}
	info := skopeoInspect(t, "--tls-verify=false", "docker://"+ref)
	if info.Digest != string(pubs[0].Digest) || info.Labels[KeyModels] != "tinynet_onnx_fp32" || len(info.Layers) != 1 {
		t.Errorf("skopeo inspect docker://%s = %+v, want digest %s, the model label and one layer", ref, info, pubs[0].Digest)
	}
	if got := skopeoInspect(t, "oci:"+lay+":v1"); got.Digest != string(pubs[1].Digest) {
		t.Errorf("skopeo inspect oci:%s:v1 digest = %s, want %s", lay, got.Digest, pubs[1].Digest)
	}
	dir := filepath.Join(tmp, "copy")
	runTool(t, "skopeo", "copy", "--src-tls-verify=false", "docker://"+ref, "dir:"+dir)
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if d := manifest.DigestBytes(data); d != pubs[0].Digest {
		t.Errorf("skopeo copy's manifest.json has digest %s, kiln pushed %s", d, pubs[0].Digest)
	}
	for _, l := range info.Layers {
		d, _, err := manifest.DigestFile(filepath.Join(dir, strings.TrimPrefix(l, "sha256:")))
		if err != nil || string(d) != l {
			t.Errorf("skopeo copy's layer %s has digest %s (%v)", l, d, err)
		}
	}
}

// umoci unpacks the OCI layout into a runtime bundle whose /models holds
// the repository's files byte for byte.
func TestUmoci(t *testing.T) {
	tool(t, "umoci")
	repo := testRepo(t, manifest.RuntimeONNX, nil, passed())
	tmp := t.TempDir()
	lay := filepath.Join(tmp, "layout")
	if _, err := Run(context.Background(), Config{Repo: repo, To: []Destination{dest(t, "oci-layout:"+lay+":v1")}, Base: "scratch"}); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(tmp, "bundle")
	runTool(t, "umoci", "unpack", "--rootless", "--image", lay+":v1", bundle)
	sameFiles(t, repo, filepath.Join(bundle, "rootfs", "models"))
}

// distributionOrInProcess is distribution's registry where it is
// installed, else go-containerregistry's in-process one.
func distributionOrInProcess(t *testing.T) string {
	if distributionBinary() != "" {
		return distributionRegistry(t, t.TempDir())
	}
	return testRegistry(t)
}
