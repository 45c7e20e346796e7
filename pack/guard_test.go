package pack

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
)

func TestGuard(t *testing.T) {
	plan := &manifest.Build{Tool: "trtexec", TensorRT: "10.3.0", ComputeCapability: "8.9"}
	failed := &check.Record{Verdict: check.VerdictFail, By: "serve", Reason: "cosine 0.5 < 0.99", Checked: time.Unix(1, 0)}
	byConvert := &check.Record{Verdict: check.VerdictPass, By: "convert", Checked: time.Unix(1, 0)}
	trt, _ := manifest.ParseTRTSpec("10.3")
	trt8, _ := manifest.ParseTRTSpec("8.6")
	cases := []struct {
		name    string
		runtime manifest.Runtime
		build   *manifest.Build
		rec     *check.Record
		target  Target
		allow   bool
		want    string // "" passes
	}{
		{"plan matches", manifest.RuntimeTRT, plan, passed(), Target{TRT: trt, ComputeCapability: "8.9"}, false, ""},
		{"plan other trt", manifest.RuntimeTRT, plan, passed(), Target{TRT: trt8}, false, "plan built with TensorRT 10.3.0, target is TensorRT 8.6"},
		{"plan other gpu", manifest.RuntimeTRT, plan, passed(), Target{ComputeCapability: "8.6"}, false, "target is compute capability 8.6"},
		{"failed verdict", manifest.RuntimeONNX, nil, failed, Target{}, false, "verdict is fail: cosine 0.5"},
		{"failed verdict, allowed", manifest.RuntimeONNX, nil, failed, Target{}, true, "verdict is fail"},
		{"no verdict", manifest.RuntimeONNX, nil, nil, Target{}, false, "kiln serve has not checked it"},
		{"convert only", manifest.RuntimeONNX, nil, byConvert, Target{}, false, "kiln serve has not checked it"},
		{"no verdict, allowed", manifest.RuntimeONNX, nil, nil, Target{}, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			repo := testRepo(t, c.runtime, c.build, c.rec)
			out := filepath.Join(t.TempDir(), "copy")
			_, err := Run(context.Background(), Config{Repo: repo, To: []Destination{dest(t, "dir:"+out)}, Target: c.target, AllowUnchecked: c.allow})
			var re *RefusedError
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Run = %v, want success", err)
			case c.want != "" && (!errors.As(err, &re) || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Run = %v, want a refusal with %q", err, c.want)
			}
		})
	}
}

// The base image's TensorRT comes from its environment, else its Triton release.
func TestBaseTRT(t *testing.T) {
	cases := []struct {
		ref  string
		env  []string
		want string
	}{
		{"nvcr.io/nvidia/tritonserver:24.08-py3", nil, "10.3.0"},
		{"nvcr.io/nvidia/tritonserver:22.11-py3", nil, "8.5.1"},
		{"registry:5000/triton:mine", []string{"TRT_VERSION=10.8.0.43"}, "10.8.0"},
		{"registry:5000/triton:mine", []string{"NVIDIA_TRITON_SERVER_VERSION=24.12"}, "10.7.0"},
		{"busybox:latest", nil, ""},
	}
	for _, c := range cases {
		got := baseTRT(c.ref, &v1.ConfigFile{Config: v1.Config{Env: c.env}})
		if (got == nil) != (c.want == "") || (got != nil && got.String() != c.want) {
			t.Errorf("baseTRT(%s, %v) = %v, want %q", c.ref, c.env, got, c.want)
		}
	}
	plan := &manifest.Build{Tool: "trtexec", TensorRT: "10.3.0"}
	repo := testRepo(t, manifest.RuntimeTRT, plan, passed())
	man, _ := manifest.Read(repo)
	v := manifest.TRTVersion{Major: 10, Minor: 8}
	if err := guard(man, Target{}, &v, false); err == nil || !strings.Contains(err.Error(), "the base image has TensorRT 10.8.0") {
		t.Errorf("guard with a 10.8 base = %v, want a refusal", err)
	}
}
