package workflows_test

import (
	"slices"
	"testing"
)

// The checker must refuse what kiln would refuse, or the file tests prove
// nothing.
func TestCheckInvocationRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"valid", []string{"convert", "m.onnx", "--repo", "r", "--runtime", "onnx,trt", "--max-batch", "16"}, true},
		{"valid pbtxt", []string{"pbtxt", "lint", "r"}, true},
		{"unknown command", []string{"bake", "m.onnx"}, false},
		{"unknown subcommand", []string{"pbtxt", "frob", "r"}, false},
		{"unknown flag", []string{"serve", "r", "--progress", "plain"}, false},
		{"bad enum", []string{"convert", "m.onnx", "--repo", "r", "--runtime", "gpu"}, false},
		{"bad size", []string{"calibrate", "m.onnx", "--data", "d", "-o", "c", "--memory-budget", "4GB"}, false},
		{"bad duration", []string{"serve", "r", "--window", "fast"}, false},
		{"bad int", []string{"pack", "r", "--to", "dir:x", "--jobs", "many"}, false},
		{"too many args", []string{"version", "extra"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkInvocation(invocation{args: tc.args})
			if (err == nil) != tc.ok {
				t.Errorf("checkInvocation(kiln %v) = %v, want ok %v", tc.args, err, tc.ok)
			}
		})
	}
	if err := checkInvocation(invocation{args: []string{"version"}, unknown: []string{"X"}}); err == nil {
		t.Error("checkInvocation with an unknown variable = nil, want an error")
	}
}

func TestShellCommands(t *testing.T) {
	script := `set -e  # comment
A=1 B="two words"
if [ "$A" = 1 ]; then kiln convert "$B" --name=${C:-dflt} \
    --repo '/r $A' 2>&1 >/dev/null | tee x; fi
cat > f <<'END'
kiln in a here-document
END
x=$(kiln version) && ./bin/kiln pack "${A}x" --to dir:y
`
	cmds, err := shellCommands(script, 10, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	var lines []int
	for _, c := range cmds {
		if w := commandWords(c.words); len(w) > 0 && isKiln(w[0]) {
			got, lines = append(got, w), append(lines, c.line)
		}
	}
	want := [][]string{
		{"kiln", "convert", "two words", "--name=dflt", "--repo", "/r $A"},
		{"./bin/kiln", "pack", "1x", "--to", "dir:y"},
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("kiln commands = %q, want %q", got, want)
	}
	if !slices.Equal(lines, []int{12, 17}) {
		t.Errorf("lines = %v, want [12 17]", lines)
	}
}
