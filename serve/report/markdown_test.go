package report

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

func fixtures() map[string]*Report {
	return map[string]*Report{"tinynet": tinynet(), "random": randomData(), "empty": empty(), "hostile": hostile()}
}

func TestWriteMarkdown(t *testing.T) {
	for name, r := range fixtures() {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteMarkdown(&b, r); err != nil {
				t.Fatalf("WriteMarkdown: %v", err)
			}
			testutil.GoldenFile(t, filepath.Join("testdata", "TestWriteMarkdown", name+".golden"), b.Bytes())
		})
	}
}

func TestWriteMarkdownSays(t *testing.T) {
	tests := []struct {
		name string
		r    *Report
		want []string
	}{
		{"tinynet", tinynet(), []string{
			"# FAIL: .cache/demo/repo — 4 models: 1 failed, 1 not checked, 2 passed\n",
			"| tinynet_onnx_int8 | onnx/int8 | **fail** | logits worst_cosine 0.981 < 0.99 (images/cat_012.png) |",
			"| tinynet_onnx_fp16 | onnx/fp16 | pass | logits worst_cosine 0.99998 ≥ 0.999 (images/dog_003.png) |",
			"| tinynet_onnx_fp32 | onnx/fp32 | pass | reference | 812 µs / 1.38 ms |",
			"- tinynet_onnx_int8: output logits, worst_cosine 0.981 < 0.99, worst sample images/cat_012.png\n",
			"- tinynet_trt_fp16 (not-checked): needs GPU/TensorRT (trtexec not found)\n",
		}},
		{"random", randomData(), []string{
			"inputs: seeded random data (seed 42) — accuracy of int8 not judged",
			"# NOT JUDGED:",
			"- tinynet_onnx_int8 (not-judged): needs real data",
			"| tinynet_onnx_int8 | onnx/int8 | not-judged | logits worst_cosine 0.981 < 0.99 (images/cat_012.png) |",
		}},
		{"empty", empty(), []string{"# NOT CHECKED: gs://models-prod/tinynet — no models", "No models were checked."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteMarkdown(&b, tt.r); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("WriteMarkdown(%s) has no %q in\n%s", tt.name, w, b.String())
				}
			}
		})
	}
}

func TestMarkdownGroupsByReference(t *testing.T) {
	r := tinynet()
	other := r.Models[0]
	other.Name, other.Reference = "resnet_onnx_fp32", ""
	r.Models = append(r.Models, other, Model{Name: "resnet_onnx_fp16", Reference: "resnet_onnx_fp32", Verdict: Pass})
	r.Summarize()
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	i, j := strings.Index(s, "## Compared with tinynet_onnx_fp32"), strings.Index(s, "## Compared with resnet_onnx_fp32")
	if i < 0 || j < i || strings.Index(s, "| resnet_onnx_fp16 |") < j || strings.Index(s, "| tinynet_trt_fp16 |") > j {
		t.Errorf("WriteMarkdown: want a table per reference, got\n%s", s)
	}
}

func TestMd(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"tinynet_onnx_fp32", "tinynet_onnx_fp32"},
		{"_em_ x", `\_em\_ x`},
		{"a|b", `a\|b`},
		{"<script>", "&lt;script>"},
		{"0.981 < 0.99 & more", "0.981 < 0.99 & more"},
		{"&amp;", "&amp;amp;"},
		{"[x](y) `c` *b*", "\\[x\\](y) \\`c\\` \\*b\\*"},
		{"line\nbreak", "line break"},
	} {
		if got := md(tt.in); got != tt.want {
			t.Errorf("md(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
