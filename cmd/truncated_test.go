package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

// truncatedModel cuts the testdata model just short of its end, at the
// largest length that still parses but has lost its opset_import (which
// protobuf writers put last): the file a broken download leaves.
func truncatedModel(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(tinynetPath)
	if err != nil {
		t.Fatal(err)
	}
	for n := len(data) - 1; n > len(data)-64; n-- {
		m, err := onnx.Parse(data[:n], "")
		if err != nil || len(m.Proto.GetOpsetImport()) > 0 {
			continue
		}
		t.Logf("truncated %d bytes", len(data)-n)
		p := filepath.Join(t.TempDir(), "truncated.onnx")
		if err := os.WriteFile(p, data[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Fatal("no truncation of the testdata model parses without its opset_import")
	return ""
}

// Such a model is refused, with the reason, by every command that reads it.
func TestTruncatedModelRefused(t *testing.T) {
	model := truncatedModel(t)
	npy := writeSamples(t, t.TempDir(), 8)
	for _, args := range [][]string{
		{"inspect", model},
		{"convert", model, "--repo", filepath.Join(t.TempDir(), "repo"), "--progress", "none"},
		{"calibrate", model, "--data", npy, "-o", filepath.Join(t.TempDir(), "calib"), "--progress", "none"},
	} {
		_, errOut, code := run(t, args...)
		if code == 0 || !strings.Contains(errOut, "opset_import") {
			t.Errorf("kiln %s of a model without opset_import = exit %d (%s), want a refusal naming opset_import", args[0], code, errOut)
		}
	}
}
