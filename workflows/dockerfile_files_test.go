package workflows_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/kiln-ml/kiln/cmd"
)

// tensorRTContainer is the TensorRT release in NVIDIA's TensorRT containers
// (nvcr.io/nvidia/tensorrt:<release>-py3), from NVIDIA's TensorRT Container
// Release Notes ("TensorRT Release 24.08": TensorRT 10.3.0).
var tensorRTContainer = map[string]string{"24.08": "10.3"}

// dockerfile is workflows/Dockerfile read with BuildKit's parser.
type dockerfile struct {
	stages []instructions.Stage
	args   map[string]string // global ARG defaults
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile: %s", w.Short)
	}
	stages, meta, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	d := dockerfile{stages: stages, args: map[string]string{}}
	for _, a := range meta {
		for _, kv := range a.Args {
			d.args[kv.Key] = kv.ValueString()
		}
	}
	return d
}

func (d dockerfile) stage(t *testing.T, name string) instructions.Stage {
	t.Helper()
	for _, s := range d.stages {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("Dockerfile has no stage %q", name)
	return instructions.Stage{}
}

var argRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expand replaces global ARGs by their defaults.
func (d dockerfile) expand(s string) string {
	return argRE.ReplaceAllStringFunc(s, func(m string) string { return d.args[strings.Trim(m, "${}")] })
}

// runtimeImage checks what both kiln images need: KILN_ORT_LIB names the
// copied ONNX Runtime library, the binary is on PATH, kiln is the
// entrypoint in exec form.
func runtimeImage(t *testing.T, s instructions.Stage, buildStage string) {
	t.Helper()
	var ortLib, entry string
	var copies []*instructions.CopyCommand
	for _, c := range s.Commands {
		switch c := c.(type) {
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				if kv.Key == "KILN_ORT_LIB" {
					ortLib = kv.Value
				}
			}
		case *instructions.CopyCommand:
			copies = append(copies, c)
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Errorf("stage %s: ENTRYPOINT in shell form; signals would go to the shell", s.Name)
			}
			entry = strings.Join(c.CmdLine, " ")
		}
	}
	if !strings.HasSuffix(ortLib, "/libonnxruntime.so.1") {
		t.Errorf("stage %s: KILN_ORT_LIB = %q, want the path of libonnxruntime.so.1", s.Name, ortLib)
	}
	if !slices.ContainsFunc(copies, func(c *instructions.CopyCommand) bool { return c.From == "ort" && c.DestPath == ortLib }) {
		t.Errorf("stage %s: no COPY --from=ort of the library to KILN_ORT_LIB (%s)", s.Name, ortLib)
	}
	if !slices.ContainsFunc(copies, func(c *instructions.CopyCommand) bool {
		return c.From == buildStage && c.DestPath == "/usr/local/bin/kiln"
	}) {
		t.Errorf("stage %s: no COPY --from=%s of the binary to /usr/local/bin/kiln", s.Name, buildStage)
	}
	if entry != "kiln" {
		t.Errorf("stage %s: ENTRYPOINT %q, want [\"kiln\"]", s.Name, entry)
	}
}

func TestDockerfile(t *testing.T) {
	d := readDockerfile(t)
	names := map[string]bool{}
	for _, s := range d.stages {
		names[s.Name] = true
		for _, c := range s.Commands {
			cp, ok := c.(*instructions.CopyCommand)
			if !ok {
				continue
			}
			if cp.From != "" && !names[cp.From] {
				t.Errorf("stage %s: COPY --from=%s names no earlier stage", s.Name, cp.From)
			}
			for _, src := range cp.SourcePaths {
				if _, err := os.Stat("../" + src); cp.From == "" && err != nil {
					t.Errorf("stage %s: COPY %s: not in the repository (the build context is its root)", s.Name, src)
				}
			}
		}
	}
	runtimeImage(t, d.stage(t, "kiln"), "build")
	runtimeImage(t, d.stage(t, "kiln-gpu"), "build-gpu")
	if base := d.expand(d.stage(t, "kiln").BaseName); !strings.HasPrefix(base, "debian:") || !strings.HasSuffix(base, "-slim") {
		t.Errorf("stage kiln: base %q, want a slim Debian", base)
	}
	for _, name := range []string{"build", "build-gpu"} {
		if !slices.ContainsFunc(d.stage(t, name).Commands, func(c instructions.Command) bool {
			r, ok := c.(*instructions.RunCommand)
			return ok && strings.Contains(strings.Join(r.CmdLine, " "), "GOEXPERIMENT=simd") &&
				strings.Contains(strings.Join(r.CmdLine, " "), "go build") && strings.Contains(strings.Join(r.CmdLine, " "), "./cmd/kiln")
		}) {
			t.Errorf("stage %s: no RUN GOEXPERIMENT=simd go build ./cmd/kiln", name)
		}
	}
	gpu := d.stage(t, "kiln-gpu")
	base := d.expand(gpu.BaseName)
	release, ok := strings.CutPrefix(base, "nvcr.io/nvidia/tensorrt:")
	if !ok || !strings.HasSuffix(release, "-py3") {
		t.Fatalf("stage kiln-gpu: base %q, want nvcr.io/nvidia/tensorrt:<release>-py3", base)
	}
	trt := tensorRTContainer[strings.TrimSuffix(release, "-py3")]
	if def := flagDefault(t, "calibrate", "trt-version"); trt == "" || !strings.HasPrefix(def, trt+".") && def != trt {
		t.Errorf("stage kiln-gpu: %s has TensorRT %q, kiln's default --trt-version is %s", base, trt, def)
	}
	if !slices.ContainsFunc(gpu.Commands, func(c instructions.Command) bool {
		r, ok := c.(*instructions.RunCommand)
		return ok && strings.Contains(strings.Join(r.CmdLine, " "), "command -v trtexec")
	}) {
		t.Error("stage kiln-gpu: no RUN that checks trtexec is on PATH")
	}
	if !slices.ContainsFunc(gpu.Commands, func(c instructions.Command) bool {
		cp, ok := c.(*instructions.CopyCommand)
		return ok && slices.Equal(cp.SourcePaths, []string{"workflows/gpu-build.sh"}) && cp.DestPath == "/usr/local/bin/kiln-gpu-build"
	}) {
		t.Error("stage kiln-gpu: gpu-build.sh is not installed as /usr/local/bin/kiln-gpu-build (the GPU job's --command)")
	}
	checkPins(t, d)
}

// checkPins checks the Dockerfile's versions against the repository's: ONNX
// Runtime's version and sha256 against the Makefile, Go against go.mod.
func checkPins(t *testing.T, d dockerfile) {
	t.Helper()
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for arg, mkVar := range map[string]string{"ORT_VERSION": "ORT_VER", "ORT_SHA256": "ORT_SHA"} {
		m := regexp.MustCompile(`(?m)^` + mkVar + `\s*:=\s*(\S+)`).FindSubmatch(mk)
		if m == nil || d.args[arg] != string(m[1]) {
			t.Errorf("Dockerfile ARG %s=%s, the Makefile's %s is %q", arg, d.args[arg], mkVar, m)
		}
	}
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if m == nil || d.args["GO_VERSION"] != string(m[1]) {
		t.Errorf("Dockerfile ARG GO_VERSION=%s, go.mod needs %q", d.args["GO_VERSION"], m)
	}
}

// flagDefault is the default of a flag of a kiln command.
func flagDefault(t *testing.T, command, flag string) string {
	t.Helper()
	c, _, err := cmd.New().Find([]string{command})
	if err != nil {
		t.Fatal(err)
	}
	f := c.Flags().Lookup(flag)
	if f == nil {
		t.Fatalf("kiln %s has no --%s", command, flag)
	}
	return f.DefValue
}
