package cmd

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// commands returns every command of the tree below c, c first.
func commands(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		if sub.Name() == "help" {
			continue
		}
		out = append(out, commands(sub)...)
	}
	return out
}

// goldenName is a command's golden file name: its path below kiln, joined by _.
func goldenName(c *cobra.Command) string {
	path := strings.Fields(c.CommandPath())
	if len(path) == 1 {
		return path[0]
	}
	return strings.Join(path[1:], "_")
}

// Every command's --help is a golden file, so that a change to what users
// see is a change to a file in review.
func TestHelpGolden(t *testing.T) {
	for _, c := range commands(New()) {
		args := append(strings.Fields(c.CommandPath())[1:], "--help")
		out, errOut, code := run(t, args...)
		if code != 0 {
			t.Fatalf("kiln %v = exit %d: %s", args, code, errOut)
		}
		testutil.Golden(t, goldenName(c), []byte(out))
	}
}

// The flag vocabulary of README.md holds for every command: one flag per
// concept with one type, positive boolean names, no synonyms.
func TestFlagVocabulary(t *testing.T) {
	// The commands that print a result and the ones that may run long.
	wantFormat := []string{"kiln calibrate", "kiln convert", "kiln deploy", "kiln import", "kiln inspect", "kiln pack", "kiln pbtxt lint", "kiln plan", "kiln run", "kiln serve", "kiln version"}
	wantProgress := []string{"kiln calibrate", "kiln convert", "kiln inspect", "kiln pack", "kiln pbtxt lint", "kiln run"}
	types := map[string]string{
		"format": "text|json", "progress": "auto|bar|plain|json|none", "device": "cpu|cuda|tensorrt",
		"trt-version": "version", "compute-capability": "cc", "gpus": "ids", "server-gpus": "ids", "gpu-count": "int",
		"model-version": "int64", "trt-workspace": "size", "log-format": "text|json", "data-format": "images|numpy|pb|tfrecord|json",
	}
	// Names other tools use for these concepts, which kiln does not.
	banned := []string{"out", "workspace", "trt-workspace-bytes", "target", "version", "max-queue-delay-us"}
	var haveFormat, haveProgress []string
	for _, c := range commands(New()) {
		if strings.HasPrefix(c.CommandPath(), "kiln completion") {
			continue // cobra's own command, with cobra's flag names
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			where := c.CommandPath() + " --" + f.Name
			if strings.HasPrefix(f.Name, "no-") || slices.Contains(banned, f.Name) {
				t.Errorf("%s: not a name of kiln's vocabulary", where)
			}
			if want, ok := types[f.Name]; ok && f.Value.Type() != want {
				t.Errorf("%s has type %s, want %s", where, f.Value.Type(), want)
			}
			if f.Name == "output" && f.Shorthand != "o" {
				t.Errorf("%s has shorthand %q, want -o", where, f.Shorthand)
			}
			if f.Shorthand == "o" && f.Name != "output" {
				t.Errorf("%s has -o, which is --output", where)
			}
		})
		if c.LocalFlags().Lookup("format") != nil {
			haveFormat = append(haveFormat, c.CommandPath())
		}
		if c.LocalFlags().Lookup("progress") != nil {
			haveProgress = append(haveProgress, c.CommandPath())
		}
	}
	slices.Sort(haveFormat)
	slices.Sort(haveProgress)
	if !slices.Equal(haveFormat, wantFormat) {
		t.Errorf("commands with --format = %v, want %v", haveFormat, wantFormat)
	}
	if !slices.Equal(haveProgress, wantProgress) {
		t.Errorf("commands with --progress = %v, want %v", haveProgress, wantProgress)
	}
}

// A wrong enumerated value is a usage error naming the flag and the values
// it takes, before any work is done.
func TestFlagValuesCheckedAtParse(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"inspect", "--device", "gpu", tinynetPath}, `invalid argument "gpu" for "--device" flag: want one of cpu, cuda, tensorrt`},
		{[]string{"calibrate", tinynetPath, "--progress", "fancy"}, `"--progress" flag: want one of auto, bar, plain, json, none`},
		{[]string{"calibrate", tinynetPath, "--data-format", "csv"}, `"--data-format" flag: want one of images, numpy, pb, tfrecord, json`},
		{[]string{"pbtxt", "lint", "--format", "yaml", "x"}, `"--format" flag: want one of text, json`},
		{[]string{"pbtxt", "gen", tinynetPath, "--trt-workspace", "4GB"}, `"--trt-workspace" flag: want a size with a binary unit`},
		{[]string{"pbtxt", "gen", tinynetPath, "--kind", "tpu"}, `"--kind" flag: want one of auto, gpu, cpu, model`},
		{[]string{"pbtxt", "gen", tinynetPath, "--version-policy", "newest"}, `"--version-policy" flag`},
		{[]string{"pbtxt", "gen", tinynetPath, "--max-queue-delay", "1ns"}, `"--max-queue-delay" flag: want a duration that is a whole number of 1µs`},
		{[]string{"--log-format", "xml", "version"}, `"--log-format" flag: want one of text, json`},
		{[]string{"convert", tinynetPath, "--repo", "r", "--precision", "fp8"}, `invalid argument "fp8" for "--precision" flag`},
		{[]string{"convert", tinynetPath, "--repo", "r", "--max-batch", "-2"}, `invalid argument "-2" for "--max-batch" flag`},
		{[]string{"convert", tinynetPath, "--repo", "r", "--hardware-compat", "hopper"}, `"--hardware-compat" flag: want one of none, ampere+, sameComputeCapability`},
		{[]string{"bogus"}, `unknown command "bogus" for "kiln"`},
		{[]string{"pbtxt", "linter"}, `unknown command "linter" for "kiln pbtxt"; did you mean lint?`},
	}
	for _, c := range cases {
		_, errOut, code := run(t, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("kiln %v = exit %d, %q; want exit 2 with %q", c.args, code, errOut, c.want)
		}
	}
	for _, args := range [][]string{{}, {"pbtxt"}} {
		out, errOut, code := run(t, args...)
		if code != 0 || !strings.Contains(out, "Available Commands:") {
			t.Errorf("kiln %v = exit %d, %q %q; want the help", args, code, out, errOut)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "512MiB": 512 << 20, "4GiB": 4 << 30, "1.5GiB": 3 << 29, "64KiB": 64 << 10, "100B": 100, "2TiB": 2 << 40, " 8 MiB": 8 << 20} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v, want %d", in, got, err, want)
		}
		if back, err := parseSize(formatSize(got)); err != nil || back != got {
			t.Errorf("parseSize(formatSize(%d) = %q) = %d, %v", got, formatSize(got), back, err)
		}
	}
	for _, bad := range []string{"", "512", "4GB", "4 gb", "-1MiB", "1.5B", "MiB", "1e30TiB", "x"} {
		if got, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", bad, got)
		}
	}
	if got := formatSize(3 << 29); got != "1536MiB" {
		t.Errorf("formatSize(1.5 GiB) = %q, want 1536MiB", got)
	}
}
