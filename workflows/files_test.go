// Tests of the workflow files: no Docker engine, Cloud Build or GitHub
// runner is here, so every file is parsed, every kiln command line in it is
// parsed by the real command tree (cmd.New), and the Dockerfile's stages are
// checked with BuildKit's own parser.
package workflows_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kiln-ml/kiln/cmd"
)

// l4Regions are the regions where Cloud Run offers NVIDIA L4s
// (../shared/reference/deploy-rules.md §2; asia-south1 is by invitation).
var l4Regions = []string{"asia-southeast1", "europe-west1", "europe-west4", "us-central1", "us-east4"}

func checkAll(t *testing.T, invs []invocation, min int) {
	t.Helper()
	if len(invs) < min {
		t.Errorf("found %d kiln invocations, want at least %d: %v", len(invs), min, invs)
	}
	for _, inv := range invs {
		if err := checkInvocation(inv); err != nil {
			t.Errorf("%s\n\t%v", inv, err)
		}
	}
	t.Logf("%d kiln invocations checked", len(invs))
}

// kilnCommands is the set of kiln subcommands the invocations run.
func kilnCommands(invs []invocation) map[string]bool {
	m := map[string]bool{}
	for _, inv := range invs {
		if len(inv.args) > 0 {
			m[inv.args[0]] = true
		}
	}
	return m
}

func wantCommands(t *testing.T, file string, invs []invocation, want ...string) {
	t.Helper()
	got := kilnCommands(invs)
	for _, w := range want {
		if !got[w] {
			t.Errorf("%s runs no kiln %s (it runs %v)", file, w, slices.Sorted(maps.Keys(got)))
		}
	}
}

// findCommand is the first shell command whose words start with prefix.
func findCommand(cmds []shellCmd, prefix ...string) []string {
	for _, c := range cmds {
		w := commandWords(c.words)
		if len(w) >= len(prefix) && slices.Equal(w[:len(prefix)], prefix) {
			return w
		}
	}
	return nil
}

// flagValue is the value of --name in words (--name v or --name=v).
func flagValue(words []string, name string) (string, bool) {
	for i, w := range words {
		if w == name && i+1 < len(words) {
			return words[i+1], true
		}
		if v, ok := strings.CutPrefix(w, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// checkGPUJob checks a `gcloud run jobs deploy` of the GPU step: one L4, a
// region that has them, the kiln-gpu image and its kiln-gpu-build script.
func checkGPUJob(t *testing.T, file string, cmds []shellCmd, gpuImage string) {
	t.Helper()
	deploy := findCommand(cmds, "gcloud", "run", "jobs", "deploy")
	if deploy == nil {
		t.Fatalf("%s: no gcloud run jobs deploy", file)
	}
	for flag, want := range map[string]string{"--gpu": "1", "--gpu-type": "nvidia-l4", "--image": gpuImage, "--command": "kiln-gpu-build"} {
		if got, _ := flagValue(deploy, flag); got != want {
			t.Errorf("%s: gcloud run jobs deploy %s = %q, want %q", file, flag, got, want)
		}
	}
	if r, _ := flagValue(deploy, "--region"); !slices.Contains(l4Regions, r) {
		t.Errorf("%s: the GPU job's region %q has no Cloud Run L4s (%v)", file, r, l4Regions)
	}
	if env, _ := flagValue(deploy, "--set-env-vars"); !strings.HasPrefix(env, "^@^") && strings.Contains(env, "fp16,") {
		t.Errorf("%s: --set-env-vars %q holds a comma list without a ^@^ delimiter", file, env)
	}
	if findCommand(cmds, "gcloud", "run", "jobs", "execute") == nil {
		t.Errorf("%s: the GPU job is deployed but never executed", file)
	}
}

func TestCloudBuild(t *testing.T) {
	const file = "cloudbuild.yaml"
	root, err := readYAML(file)
	if err != nil {
		t.Fatal(err)
	}
	subs, err := cloudBuildSubstitutions(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"_REGION", "_BUCKET", "_AR_REPO", "_KILN_IMAGE", "_KILN_GPU_IMAGE"} {
		if subs[k] == "" {
			t.Errorf("%s: no substitution %s", file, k)
		}
	}
	if !slices.Contains(l4Regions, subs["_REGION"]) {
		t.Errorf("%s: _REGION %q has no Cloud Run L4s (%v)", file, subs["_REGION"], l4Regions)
	}
	steps, err := cloudBuildSteps(file, root, subs)
	if err != nil {
		t.Fatal(err)
	}
	invs, cmds, err := cloudBuildInvocations(file, steps, subs["_KILN_IMAGE"])
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, invs, 6)
	wantCommands(t, file, invs, "import", "calibrate", "convert", "serve", "pack")
	for _, inv := range invs {
		if inv.args[0] == "convert" {
			if rt, _ := flagValue(inv.args, "--runtime"); rt != "onnx" {
				t.Errorf("%s: the CPU steps' convert builds --runtime %q, want onnx (engines are the GPU job's)", inv, rt)
			}
		}
		if inv.args[0] == "pack" {
			if !slices.ContainsFunc(inv.args, func(a string) bool { return strings.HasPrefix(a, "gs://") }) ||
				!slices.ContainsFunc(inv.args, func(a string) bool { return strings.HasPrefix(a, "image:"+subs["_REGION"]+"-docker.pkg.dev/") }) {
				t.Errorf("%s: pack should publish to gs:// and to Artifact Registry in _REGION", inv)
			}
		}
	}
	checkGPUJob(t, file, cmds, subs["_KILN_GPU_IMAGE"])
	ids := map[string]bool{}
	for _, s := range steps {
		if s.id != "" {
			ids[s.id] = true
		}
	}
	for _, n := range mapValue(root, "steps").Content {
		wait := mapValue(n, "waitFor")
		if wait == nil {
			continue
		}
		for _, w := range wait.Content {
			if !ids[w.Value] && w.Value != "-" {
				t.Errorf("%s:%d: waitFor %q names no step", file, w.Line, w.Value)
			}
		}
	}
}

func TestGitHubActions(t *testing.T) {
	const file = "github-actions.yml"
	root, err := readYAML(file)
	if err != nil {
		t.Fatal(err)
	}
	exprs := maps.Clone(ghExpressions)
	inputs := mapValue(mapValue(mapValue(root, "on"), "workflow_dispatch"), "inputs")
	if inputs == nil {
		t.Fatalf("%s: no workflow_dispatch inputs", file)
	}
	for i := 0; i+1 < len(inputs.Content); i += 2 {
		if d := mapValue(inputs.Content[i+1], "default"); d != nil {
			exprs["inputs."+inputs.Content[i].Value] = d.Value
		}
	}
	env := maps.Clone(ghRunnerEnv)
	if err := addEnv(env, mapValue(root, "env"), exprs); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	jobs := mapValue(root, "jobs")
	if jobs == nil || len(jobs.Content) == 0 {
		t.Fatalf("%s: no jobs", file)
	}
	var invs []invocation
	var cmds []shellCmd
	for j := 0; j+1 < len(jobs.Content); j += 2 {
		job := jobs.Content[j+1]
		if mapValue(job, "runs-on") == nil {
			t.Errorf("%s:%d: job %s has no runs-on", file, job.Line, jobs.Content[j].Value)
		}
		jobEnv := maps.Clone(env)
		if err := addEnv(jobEnv, mapValue(job, "env"), exprs); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		steps := mapValue(job, "steps")
		if steps == nil {
			t.Fatalf("%s:%d: job %s has no steps", file, job.Line, jobs.Content[j].Value)
		}
		for _, step := range steps.Content {
			run := mapValue(step, "run")
			if run == nil {
				continue
			}
			stepEnv := maps.Clone(jobEnv)
			if err := addEnv(stepEnv, mapValue(step, "env"), exprs); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			script, err := ghSubst(run.Value, exprs)
			if err != nil {
				t.Fatalf("%s:%d: %v", file, run.Line, err)
			}
			in, c, err := scriptInvocations(file, script, blockStart(run), stepEnv)
			if err != nil {
				t.Fatal(err)
			}
			invs, cmds = append(invs, in...), append(cmds, c...)
		}
	}
	checkAll(t, invs, 7)
	wantCommands(t, file, invs, "import", "calibrate", "convert", "serve", "pack")
	checkGPUJob(t, file, cmds, env["KILN_GPU_IMAGE"])
}

// addEnv adds a workflow env: mapping, its expressions replaced.
func addEnv(env map[string]string, n *yaml.Node, exprs map[string]string) error {
	if n == nil {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		v, err := ghSubst(n.Content[i+1].Value, exprs)
		if err != nil {
			return err
		}
		env[n.Content[i].Value] = v
	}
	return nil
}

func TestShellScripts(t *testing.T) {
	// What the callers set (cloudbuild.yaml's GPU job, the VM's metadata);
	// everything else takes the script's own defaults.
	vars := map[string]string{
		"KILN_STAGE": "/mnt/bucket/kiln/b0c1d2e3/stage", "KILN_MODEL": "resnet50",
		"KILN_REPO": "gs://my-bucket/kiln/b0c1d2e3/onnx", "KILN_DEST_GCS": "gs://my-bucket/models/resnet50",
		"KILN_DEST_IMAGE": "us-central1-docker.pkg.dev/my-project/kiln/resnet50-triton:b0c1d2e3",
	}
	files, err := filepath.Glob("*.sh")
	if err != nil || len(files) == 0 {
		t.Fatalf("no shell scripts here (%v)", err)
	}
	counts := map[string]int{}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "#!") {
			t.Errorf("%s: no #! line", file)
		}
		if st, err := os.Stat(file); err == nil && st.Mode()&0o111 == 0 {
			t.Errorf("%s: not executable", file)
		}
		invs, _, err := scriptInvocations(file, string(b), 1, vars)
		if err != nil {
			t.Fatal(err)
		}
		checkAll(t, invs, 0)
		counts[file] = len(invs)
	}
	b, err := os.ReadFile("gpu-build.sh")
	if err != nil {
		t.Fatal(err)
	}
	invs, _, _ := scriptInvocations("gpu-build.sh", string(b), 1, vars)
	wantCommands(t, "gpu-build.sh", invs, "pack", "convert", "serve")
	var devCuda bool
	for _, inv := range invs {
		if rt, _ := flagValue(inv.args, "--runtime"); inv.args[0] == "convert" && rt != "trt" {
			t.Errorf("%s: the GPU step's convert builds --runtime %q, want trt", inv, rt)
		}
		if d, _ := flagValue(inv.args, "--device"); inv.args[0] == "serve" && d == "cuda" {
			devCuda = true
		}
	}
	if !devCuda {
		t.Error("gpu-build.sh runs no kiln serve --device cuda")
	}
	vm, err := os.ReadFile("gpu-vm-startup.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := shellCommands(string(vm), 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(cmds, func(c shellCmd) bool {
		w := commandWords(c.words)
		return len(w) > 2 && w[0] == "docker" && w[1] == "run" && slices.Contains(w, "kiln-gpu-build")
	}) {
		t.Error("gpu-vm-startup.sh does not run kiln-gpu-build in a container")
	}
	t.Logf("kiln invocations per script: %v", counts)
}

// notYetInREADME are commands other work is adding to the CLI while the
// README may already show them (kiln run, init, deploy, plan); their lines
// are skipped while this build has no such command, and checked like every
// other once it has.
var notYetInREADME = []string{"run", "init", "deploy", "plan"}

func missingCommand(name string) bool {
	if !slices.Contains(notYetInREADME, name) {
		return false
	}
	for _, c := range cmd.New().Commands() {
		if c.Name() == name {
			return false
		}
	}
	return true
}

// codeBlocks are README's fenced blocks in sh, bash or no language, each
// with the line its text starts on.
func codeBlocks(text string) (blocks []string, lines []int) {
	var cur []string
	in, keep, start := false, false, 0
	for i, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "```") {
			if in && keep {
				cur = append(cur, l)
			}
			continue
		}
		if in {
			if keep {
				blocks, lines = append(blocks, strings.Join(cur, "\n")+"\n"), append(lines, start)
			}
			in, cur = false, nil
			continue
		}
		lang := strings.TrimPrefix(l, "```")
		in, keep, start = true, lang == "sh" || lang == "bash" || lang == "", i+2
	}
	return blocks, lines
}

func TestREADMEInvocations(t *testing.T) {
	const file = "../README.md"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var invs []invocation
	blocks, lines := codeBlocks(string(b))
	for i, block := range blocks {
		in, _, err := scriptInvocations("README.md", block, lines[i], nil)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		invs = append(invs, in...)
	}
	root := map[string]bool{}
	for _, inv := range invs {
		if len(inv.args) > 0 && missingCommand(inv.args[0]) {
			root[inv.args[0]] = true
			continue
		}
		if err := checkInvocation(inv); err != nil {
			t.Errorf("%s\n\t%v", inv, err)
		}
	}
	t.Logf("%d kiln lines in README.md checked", len(invs))
	if len(invs) < 10 {
		t.Errorf("found %d kiln lines in README.md's sh blocks, want more", len(invs))
	}
	if len(root) > 0 {
		t.Logf("skipped commands not in this build yet: %v", slices.Sorted(maps.Keys(root)))
	}
}
