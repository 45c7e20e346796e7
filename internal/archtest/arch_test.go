// Package archtest keeps the dependency rules of STYLE.md true: cmd wires
// stages, stages use building blocks and never each other, only cmd imports
// cobra and the progress-bar library, only ort uses cgo, only pack and
// dataset import cloud SDKs.
package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kiln-ml/kiln"

type pkg struct {
	ImportPath string
	Imports    []string
	CgoFiles   []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
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

var stages = map[string]bool{"calibrate": true, "convert": true, "pbtxt": true, "pack": true, "serve": true, "savedmodel": true}

// allowedStageEdges are the stage-to-stage imports the issues ask for:
// convert writes Triton configs through pbtxt.
var allowedStageEdges = map[[2]string]bool{{"convert", "pbtxt"}: true}

// top returns the first path element below the module ("onnx" for onnx/onnxpb).
func top(path string) string {
	rest := strings.TrimPrefix(path, module+"/")
	if i := strings.Index(rest, "/"); i >= 0 {
		return rest[:i]
	}
	return rest
}

func TestDependencyDirection(t *testing.T) {
	for _, p := range listPackages(t) {
		from := top(p.ImportPath)
		isTool := strings.HasPrefix(p.ImportPath, module+"/bench/") || strings.HasPrefix(p.ImportPath, module+"/internal/testmodels/gen")
		for _, imp := range p.Imports {
			switch {
			case imp == "github.com/spf13/cobra" || strings.HasPrefix(imp, "github.com/schollz/progressbar"):
				if from != "cmd" {
					t.Errorf("%s imports %s; only cmd may", p.ImportPath, imp)
				}
			case strings.HasPrefix(imp, "cloud.google.com/") || strings.HasPrefix(imp, "google.golang.org/api"):
				if from != "pack" && from != "dataset" {
					t.Errorf("%s imports %s; only pack and dataset may use cloud SDKs", p.ImportPath, imp)
				}
			case strings.HasPrefix(imp, module+"/"):
				to := top(imp)
				if to == "cmd" && from != "cmd" {
					t.Errorf("%s imports cmd", p.ImportPath)
				}
				if stages[from] && stages[to] && from != to && !allowedStageEdges[[2]string{from, to}] {
					t.Errorf("stage %s imports stage %s (%s); stages hand each other files, not calls", from, to, imp)
				}
				if !stages[from] && from != "cmd" && !isTool && stages[to] {
					t.Errorf("building block %s imports stage %s", p.ImportPath, imp)
				}
			}
		}
		if len(p.CgoFiles) > 0 && from != "ort" {
			t.Errorf("%s uses cgo; only ort may", p.ImportPath)
		}
	}
}
