package convert

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

// cancellation writes a model whose output, 100x - 99.9x, cancels almost
// everything its two products hold: in fp16 the products keep 11 bits, so
// the difference loses most of its own; relus pads the graph before it.
func cancellation(t *testing.T, relus int) string {
	t.Helper()
	b := testmodels.NewBuilder("cancel", 1)
	x := b.Input("x", onnx.Float, "N", 16)
	for range relus {
		x = b.Node("Relu", []string{x})
	}
	a := b.Node("Mul", []string{x, b.Init("a", []int64{1}, []float32{100})})
	c := b.Node("Mul", []string{x, b.Init("c", []int64{1}, []float32{99.9})})
	b.Node("Sub", []string{a, c})
	b.Rename("y")
	b.Output("y", onnx.Float, "N", 16)
	p := filepath.Join(t.TempDir(), "cancel.onnx")
	if err := (&onnx.Model{Proto: b.Model(17, 8)}).Save(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// An fp16 variant that misses its thresholds is rebuilt with the nodes
// nearest its failing output kept in fp32, and then passes, saying so; when
// that would take more than a quarter of the graph, it fails instead.
func TestRunFP16KeepsNodesNearFailingOutputs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		relus int
		ok    bool
	}{{"small share", 30, true}, {"most of the graph", 2, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Source: cancellation(t, tc.relus), Repo: filepath.Join(t.TempDir(), "repo"), FP16: fp16.Options{KeepIOTypes: true},
				Variants: variants(t, "onnx-fp16")}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			row := res.Rows[0]
			var ce *CheckError
			switch {
			case tc.ok && (row.Status != "ok" || !strings.Contains(row.Detail, "kept in fp32 to meet the thresholds")):
				t.Errorf("fp16 of a cancelling model = %s %q, want built with nodes kept in fp32", row.Status, row.Detail)
			case !tc.ok && (row.Status != "failed" || !errors.As(row.Err, &ce) || !strings.Contains(row.Detail, "no fp16 model")):
				t.Errorf("fp16 of a small cancelling model = %s %q, want failed: keeping a quarter in fp32 is no fp16 model", row.Status, row.Detail)
			}
		})
	}
}
