package workflows_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// shScripts are the /bin/sh -c scripts of the containers in a manifest,
// each with the line its text starts on.
func shScripts(n *yaml.Node) (scripts []string, lines []int) {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "command" && v.Kind == yaml.SequenceNode && len(v.Content) == 3 && v.Content[0].Value == "/bin/sh" && v.Content[1].Value == "-c" {
				scripts, lines = append(scripts, v.Content[2].Value), append(lines, blockStart(v.Content[2]))
			}
		}
	}
	for _, c := range n.Content {
		s, l := shScripts(c)
		scripts, lines = append(scripts, s...), append(lines, l...)
	}
	return scripts, lines
}

// Every kiln command line in the manifests kiln plan and kiln deploy
// generate (their golden files, which the generator tests hold equal to
// what is generated) parses with the real command tree.
func TestGeneratedManifestInvocations(t *testing.T) {
	files, err := filepath.Glob("testdata/*/*.golden")
	more, _ := filepath.Glob("testdata/*/*/*.golden")
	files = append(files, more...)
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden manifests (%v)", err)
	}
	vars := map[string]string{"KILN_CACHE": "gs://my-bucket/kiln-cache", "KILN_SOURCE": "gs://my-bucket/models/resnet50.onnx",
		"JOB_COMPLETION_INDEX": "0", "CLOUD_RUN_TASK_INDEX": "0", "KILN_SERVE_FLAGS": "--data gs://my-bucket/val --window 500ms"}
	var invs []invocation
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc yaml.Node
			if err := dec.Decode(&doc); err != nil {
				break
			}
			scripts, lines := shScripts(&doc)
			for i, s := range scripts {
				in, _, err := scriptInvocations(file, s, lines[i], vars)
				if err != nil {
					t.Fatal(err)
				}
				invs = append(invs, in...)
			}
		}
	}
	checkAll(t, invs, 12)
	wantCommands(t, "the plan manifests", invs, "convert", "pack", "serve")
}

// An unquoted expansion splits into fields; an empty one adds no word.
func TestShellFieldSplitting(t *testing.T) {
	cmds, err := shellCommands("kiln serve r $A ${B:-} x$C\n", 1, map[string]string{"A": " --window 1s ", "B": "", "C": "y z"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kiln", "serve", "r", "--window", "1s", "xy", "z"}
	if len(cmds) != 1 || !slices.Equal(cmds[0].words, want) {
		t.Errorf("commands = %+v, want the words %q", cmds, want)
	}
}
