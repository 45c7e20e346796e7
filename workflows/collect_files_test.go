package workflows_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kiln-ml/kiln/cmd"
)

// invocation is one kiln command line found in a file.
type invocation struct {
	file    string
	line    int
	args    []string // after "kiln"
	unknown []string // variables the line used that have no plausible value here
}

func (inv invocation) String() string {
	return fmt.Sprintf("%s:%d: kiln %s", inv.file, inv.line, strings.Join(inv.args, " "))
}

// checkInvocation parses a kiln command line with the real command tree:
// the subcommand must exist, every flag must be one it has and its value
// must parse (enumerations, sizes, durations and lists are checked while
// flags are read), and the positional arguments and required flags must
// satisfy the command.
func checkInvocation(inv invocation) error {
	if len(inv.unknown) > 0 {
		return fmt.Errorf("uses variables with no plausible value in the test: %s", strings.Join(inv.unknown, ", "))
	}
	root := cmd.New()
	c, rest, err := root.Find(inv.args)
	if err != nil {
		return err
	}
	if c == root {
		return fmt.Errorf("no kiln command in %q", inv.args)
	}
	if err := c.ParseFlags(rest); err != nil {
		return fmt.Errorf("%s: %w", c.CommandPath(), err)
	}
	if err := c.ValidateArgs(c.Flags().Args()); err != nil {
		return fmt.Errorf("%s: %w", c.CommandPath(), err)
	}
	if err := c.ValidateRequiredFlags(); err != nil {
		return fmt.Errorf("%s: %w", c.CommandPath(), err)
	}
	if err := c.ValidateFlagGroups(); err != nil {
		return fmt.Errorf("%s: %w", c.CommandPath(), err)
	}
	return nil
}

// scriptInvocations are the kiln commands of a shell script.
func scriptInvocations(file, script string, first int, vars map[string]string) ([]invocation, []shellCmd, error) {
	cmds, err := shellCommands(script, first, vars)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	var invs []invocation
	for _, c := range cmds {
		w := commandWords(c.words)
		if len(w) > 0 && isKiln(w[0]) {
			invs = append(invs, invocation{file: file, line: c.line, args: w[1:], unknown: c.unknown})
		}
	}
	return invs, cmds, nil
}

// blockStart is the first line of a YAML scalar's text: a block scalar
// (| or >) starts on the line after its indicator.
func blockStart(n *yaml.Node) int {
	if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Line + 1
	}
	return n.Line
}

// mapValue is the value of key in a YAML mapping node, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// readYAML parses a YAML file into its document node.
func readYAML(path string) (*yaml.Node, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a YAML mapping", path)
	}
	return doc.Content[0], nil
}

// cloudBuildBuiltins are the substitutions Cloud Build itself provides,
// with plausible values.
var cloudBuildBuiltins = map[string]string{
	"PROJECT_ID": "my-project", "PROJECT_NUMBER": "123456789012", "BUILD_ID": "b0c1d2e3",
	"LOCATION": "us-central1", "COMMIT_SHA": "0123456789abcdef0123456789abcdef01234567",
	"SHORT_SHA": "0123456", "REPO_NAME": "kiln", "BRANCH_NAME": "main", "TAG_NAME": "v1",
	"REVISION_ID": "0123456789abcdef", "SERVICE_ACCOUNT_EMAIL": "builder@my-project.iam.gserviceaccount.com",
}

var cloudBuildVarRE = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// cloudBuildSubst applies Cloud Build's substitutions to s: $$ is a
// literal $, $NAME and ${NAME} a user substitution (_NAME) or a built-in;
// any other name is an error, as Cloud Build makes it.
func cloudBuildSubst(s string, subs map[string]string) (string, error) {
	var bad []string
	out := cloudBuildVarRE.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		name := strings.Trim(m, "${}")
		if v, ok := subs[name]; ok {
			return v
		}
		if v, ok := cloudBuildBuiltins[name]; ok {
			return v
		}
		bad = append(bad, name)
		return m
	})
	if len(bad) > 0 {
		return "", fmt.Errorf("substitutions Cloud Build does not define: %s", strings.Join(bad, ", "))
	}
	return out, nil
}

// cloudBuildSubstitutions are the file's substitutions with their defaults
// expanded (dynamicSubstitutions: values may use other substitutions).
func cloudBuildSubstitutions(root *yaml.Node) (map[string]string, error) {
	subs := map[string]string{}
	n := mapValue(root, "substitutions")
	if n == nil {
		return subs, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		subs[n.Content[i].Value] = n.Content[i+1].Value
	}
	for range 4 { // values refer at most a few levels deep
		for k, v := range subs {
			if strings.Contains(v, "$") {
				if e, err := cloudBuildSubst(v, subs); err == nil {
					subs[k] = e
				}
			}
		}
	}
	for k, v := range subs {
		if _, err := cloudBuildSubst(v, subs); err != nil || strings.Contains(v, "${") {
			return nil, fmt.Errorf("substitution %s = %q does not resolve", k, v)
		}
	}
	return subs, nil
}

// cloudBuildStep is what the tests read of one build step.
type cloudBuildStep struct {
	id, name, entrypoint string
	args                 []string
	argLines             []int
	scriptLine           int // first line of args[1] when the step runs bash -c
}

// cloudBuildSteps reads the steps of a cloudbuild.yaml with every
// substitution applied.
func cloudBuildSteps(file string, root *yaml.Node, subs map[string]string) ([]cloudBuildStep, error) {
	seq := mapValue(root, "steps")
	if seq == nil || seq.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s: no steps", file)
	}
	var steps []cloudBuildStep
	for _, n := range seq.Content {
		var s cloudBuildStep
		for key, dst := range map[string]*string{"id": &s.id, "name": &s.name, "entrypoint": &s.entrypoint} {
			if v := mapValue(n, key); v != nil {
				e, err := cloudBuildSubst(v.Value, subs)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %w", file, v.Line, err)
				}
				*dst = e
			}
		}
		if a := mapValue(n, "args"); a != nil {
			for _, v := range a.Content {
				e, err := cloudBuildSubst(v.Value, subs)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %w", file, v.Line, err)
				}
				s.args = append(s.args, e)
				s.argLines = append(s.argLines, blockStart(v))
			}
		}
		if len(s.argLines) > 1 {
			s.scriptLine = s.argLines[1]
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// shellStep says whether a step runs its second argument as a shell script.
func (s cloudBuildStep) shellStep() bool {
	return (s.entrypoint == "bash" || s.entrypoint == "sh") && len(s.args) == 2 && s.args[0] == "-c"
}

// cloudBuildInvocations are the kiln commands a build runs: steps in the
// kiln image without an entrypoint of their own, steps whose entrypoint is
// kiln, and the kiln lines of bash -c scripts; plus every shell command.
func cloudBuildInvocations(file string, steps []cloudBuildStep, kilnImage string) ([]invocation, []shellCmd, error) {
	var invs []invocation
	var all []shellCmd
	for _, s := range steps {
		switch {
		case (s.name == kilnImage && s.entrypoint == "") || isKiln(s.entrypoint):
			line := 0
			if len(s.argLines) > 0 {
				line = s.argLines[0]
			}
			invs = append(invs, invocation{file: file, line: line, args: s.args})
		case s.shellStep():
			in, cmds, err := scriptInvocations(file, s.args[1], s.scriptLine, nil)
			if err != nil {
				return nil, nil, err
			}
			invs = append(invs, in...)
			all = append(all, cmds...)
		}
	}
	return invs, all, nil
}

var ghExprRE = regexp.MustCompile(`\$\{\{\s*([^}]*?)\s*\}\}`)

// ghExpressions are plausible values of the expressions the GitHub
// workflow uses; workflow inputs with a default take it from the file.
var ghExpressions = map[string]string{
	"vars.GCP_PROJECT": "my-project", "vars.GCP_REGION": "us-central1",
	"vars.GCS_BUCKET": "my-bucket", "vars.AR_REPO": "kiln",
	"inputs.source": "gs://my-bucket/src/resnet50", "inputs.calib_data": "gs://my-bucket/data/calib",
	"github.run_id": "1234567890", "github.sha": "0123456789abcdef0123456789abcdef01234567",
}

// ghRunnerEnv is what a GitHub-hosted runner sets for every step.
var ghRunnerEnv = map[string]string{
	"GITHUB_WORKSPACE": "/home/runner/work/kiln/kiln", "RUNNER_TEMP": "/home/runner/work/_temp",
	"GITHUB_PATH": "/home/runner/work/_temp/_runner_file_commands/add_path",
	"GITHUB_ENV":  "/home/runner/work/_temp/_runner_file_commands/set_env",
}

// ghSubst replaces ${{ expr }} with a plausible value.
func ghSubst(s string, exprs map[string]string) (string, error) {
	var bad []string
	out := ghExprRE.ReplaceAllStringFunc(s, func(m string) string {
		e := ghExprRE.FindStringSubmatch(m)[1]
		if v, ok := exprs[e]; ok {
			return v
		}
		bad = append(bad, e)
		return m
	})
	if len(bad) > 0 {
		return "", fmt.Errorf("expressions with no plausible value in the test: %s", strings.Join(bad, ", "))
	}
	return out, nil
}
