// Package archtest keeps the rules of STYLE.md true, each as a check that
// a test proves can fail: cmd wires stages, stages use building blocks and
// never each other, only cmd imports cobra, pflag and the progress-bar
// library, only ort imports the cgo binding of ONNX Runtime (and no kiln
// package has cgo of its own), manifest imports the standard library only,
// only pack and dataset import cloud SDKs; and the code stays readable: no
// hand-written function over 100 lines, no file over 600.
package archtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kiln-ml/kiln"

type pkg struct {
	ImportPath string
	Imports    []string
	CgoFiles   []string
	Standard   bool
}

// stages are the top-level packages that are pipeline stages; a stage's
// sub-packages (convert/fp16) belong to it. pbtxt is a building block.
var stages = []string{"calibrate", "convert", "pack", "serve", "savedmodel"}

// tools are commands of the repository that are not kiln itself (benchmark
// drivers, generators): they may use any package.
func isTool(path string) bool {
	return strings.HasPrefix(path, module+"/bench/") || strings.HasPrefix(path, module+"/internal/testmodels/gen")
}

// top returns the first path element below the module ("convert" for
// convert/fp16), or "" for a package outside it.
func top(path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	first, _, _ := strings.Cut(rest, "/")
	return first
}

// rule is one dependency rule: it returns what p does that breaks it.
type rule struct {
	name  string
	check func(p pkg, std map[string]bool) []string
}

// onlyImportedBy says that the packages matching prefixes are imported only
// from the listed top-level packages.
func onlyImportedBy(what string, prefixes []string, owners ...string) func(pkg, map[string]bool) []string {
	return func(p pkg, _ map[string]bool) []string {
		if slices.Contains(owners, top(p.ImportPath)) || isTool(p.ImportPath) {
			return nil
		}
		var out []string
		for _, imp := range p.Imports {
			for _, pre := range prefixes {
				if imp == pre || strings.HasPrefix(imp, pre+"/") {
					out = append(out, fmt.Sprintf("%s imports %s; only %s may use %s", p.ImportPath, imp, strings.Join(owners, " and "), what))
				}
			}
		}
		return out
	}
}

var rules = []rule{
	{"cli libraries", onlyImportedBy("the CLI libraries",
		[]string{"github.com/spf13/cobra", "github.com/spf13/pflag", "github.com/schollz/progressbar", "golang.org/x/term"}, "cmd")},
	{"ONNX Runtime binding", onlyImportedBy("ONNX Runtime's cgo binding", []string{"github.com/yalue/onnxruntime_go"}, "ort")},
	{"cloud SDKs", onlyImportedBy("cloud SDKs",
		[]string{"cloud.google.com", "google.golang.org/api", "golang.org/x/oauth2", "github.com/google/go-containerregistry"}, "pack", "dataset")},
	{"cgo", func(p pkg, _ map[string]bool) []string {
		if len(p.CgoFiles) > 0 {
			return []string{fmt.Sprintf("%s has cgo files %v; kiln reaches C only through ort's binding", p.ImportPath, p.CgoFiles)}
		}
		return nil
	}},
	{"manifest is standard library only", func(p pkg, std map[string]bool) []string {
		if top(p.ImportPath) != "manifest" {
			return nil
		}
		var out []string
		for _, imp := range p.Imports {
			if !std[imp] {
				out = append(out, fmt.Sprintf("%s imports %s; manifest uses the standard library only", p.ImportPath, imp))
			}
		}
		return out
	}},
	{"nothing imports cmd", func(p pkg, _ map[string]bool) []string {
		var out []string
		for _, imp := range p.Imports {
			if top(imp) == "cmd" && top(p.ImportPath) != "cmd" {
				out = append(out, fmt.Sprintf("%s imports %s; cmd is imported by nothing but its main", p.ImportPath, imp))
			}
		}
		return out
	}},
	{"stages hand each other files", func(p pkg, _ map[string]bool) []string {
		from := top(p.ImportPath)
		var out []string
		for _, imp := range p.Imports {
			to := top(imp)
			switch {
			case to == "" || to == from || from == "cmd" || isTool(p.ImportPath):
			case slices.Contains(stages, from) && slices.Contains(stages, to):
				out = append(out, fmt.Sprintf("stage %s imports stage %s (%s); stages hand each other files, not calls", from, to, imp))
			case slices.Contains(stages, to):
				out = append(out, fmt.Sprintf("building block %s imports stage %s (%s)", p.ImportPath, to, imp))
			}
		}
		return out
	}},
}

// listPackages runs `go list -json` over patterns.
func listPackages(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, patterns...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

// standard returns the import paths of the standard library.
func standard(t *testing.T) map[string]bool {
	t.Helper()
	std := map[string]bool{}
	for _, p := range listPackages(t, "std") {
		std[p.ImportPath] = true
	}
	return std
}

func TestDependencyRules(t *testing.T) {
	std := standard(t)
	pkgs := listPackages(t, module+"/...")
	for _, r := range rules {
		for _, p := range pkgs {
			for _, v := range r.check(p, std) {
				t.Errorf("%s: %s", r.name, v)
			}
		}
	}
	// The rules see the real imports: the owners do use what they own, so
	// a rule cannot hold merely because a path is misspelled.
	uses := map[string]string{"cmd": "github.com/spf13/cobra", "ort": "github.com/yalue/onnxruntime_go", "dataset": "cloud.google.com/go/storage"}
	for owner, imp := range uses {
		found := false
		for _, p := range pkgs {
			found = found || (p.ImportPath == module+"/"+owner && slices.Contains(p.Imports, imp))
		}
		if !found {
			t.Errorf("%s does not import %s: the rule that owns it checks nothing", owner, imp)
		}
	}
}

// ruleCase is a package that breaks a rule and one that keeps it.
type ruleCase struct {
	rule      string
	violating pkg
	keeping   pkg
}

// Every rule fires on a package that breaks it, and not on one that keeps it.
func TestDependencyRulesFire(t *testing.T) {
	std := map[string]bool{"fmt": true, "os": true}
	cases := []ruleCase{
		{"cli libraries", pkg{ImportPath: module + "/convert", Imports: []string{"github.com/spf13/cobra"}},
			pkg{ImportPath: module + "/cmd", Imports: []string{"github.com/spf13/cobra", "github.com/schollz/progressbar/v3"}}},
		{"cli libraries", pkg{ImportPath: module + "/pbtxt", Imports: []string{"github.com/schollz/progressbar/v3"}},
			pkg{ImportPath: module + "/bench/peakmem", Imports: []string{"github.com/spf13/pflag"}}},
		{"ONNX Runtime binding", pkg{ImportPath: module + "/calibrate", Imports: []string{"github.com/yalue/onnxruntime_go"}},
			pkg{ImportPath: module + "/ort", Imports: []string{"github.com/yalue/onnxruntime_go"}}},
		{"cloud SDKs", pkg{ImportPath: module + "/convert", Imports: []string{"cloud.google.com/go/storage"}},
			pkg{ImportPath: module + "/dataset", Imports: []string{"cloud.google.com/go/storage", "google.golang.org/api/option"}}},
		{"cloud SDKs", pkg{ImportPath: module + "/serve", Imports: []string{"github.com/google/go-containerregistry/pkg/v1"}},
			pkg{ImportPath: module + "/pack", Imports: []string{"github.com/google/go-containerregistry/pkg/v1"}}},
		{"cgo", pkg{ImportPath: module + "/onnx", CgoFiles: []string{"fast.go"}},
			pkg{ImportPath: module + "/ort", Imports: []string{"github.com/yalue/onnxruntime_go"}}},
		{"manifest is standard library only", pkg{ImportPath: module + "/manifest", Imports: []string{"fmt", module + "/internal/atomicfile"}},
			pkg{ImportPath: module + "/manifest", Imports: []string{"fmt", "os"}}},
		{"nothing imports cmd", pkg{ImportPath: module + "/serve", Imports: []string{module + "/cmd"}},
			pkg{ImportPath: module + "/cmd/kiln", Imports: []string{module + "/cmd"}}},
		{"stages hand each other files", pkg{ImportPath: module + "/convert", Imports: []string{module + "/calibrate"}},
			pkg{ImportPath: module + "/convert", Imports: []string{module + "/convert/fp16", module + "/pbtxt", module + "/manifest"}}},
		{"stages hand each other files", pkg{ImportPath: module + "/convert/fp16", Imports: []string{module + "/serve"}},
			pkg{ImportPath: module + "/cmd", Imports: []string{module + "/calibrate", module + "/convert"}}},
		{"stages hand each other files", pkg{ImportPath: module + "/pbtxt", Imports: []string{module + "/convert"}},
			pkg{ImportPath: module + "/pbtxt", Imports: []string{module + "/onnx", module + "/manifest"}}},
	}
	for _, c := range cases {
		i := slices.IndexFunc(rules, func(r rule) bool { return r.name == c.rule })
		if i < 0 {
			t.Fatalf("no rule %q", c.rule)
		}
		if v := rules[i].check(c.violating, std); len(v) == 0 {
			t.Errorf("rule %q does not fire on %+v", c.rule, c.violating)
		}
		if v := rules[i].check(c.keeping, std); len(v) != 0 {
			t.Errorf("rule %q fires on %+v: %v", c.rule, c.keeping, v)
		}
	}
	for _, r := range rules {
		if !slices.ContainsFunc(cases, func(c ruleCase) bool { return c.rule == r.name }) {
			t.Errorf("rule %q has no case that proves it fires", r.name)
		}
	}
}
