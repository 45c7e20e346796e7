package report

import (
	"bytes"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

func writeHTML(t testing.TB, r *Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	return b.String()
}

func TestWriteHTML(t *testing.T) {
	for name, r := range fixtures() {
		t.Run(name, func(t *testing.T) {
			testutil.GoldenFile(t, filepath.Join("testdata", "TestWriteHTML", name+".golden"), []byte(writeHTML(t, r)))
		})
	}
}

// wantData is the number of data elements each chart must have for r,
// counted from the report rather than from the charts' code.
func wantData(r *Report) map[string]int {
	n := map[string]int{"chart-latency": 0, "chart-accuracy": 0, "chart-size": 0}
	for _, m := range r.Models {
		if m.Perf != nil {
			for _, p := range m.Perf.Points {
				if p.Batch == m.Perf.smallestBatch() {
					n["chart-latency"] += 2 // p50 and p99
				}
			}
		}
		if len(m.Outputs) > 0 {
			n["chart-accuracy"]++
			for _, o := range m.Outputs {
				if o.Top1 != nil {
					n["chart-accuracy"]++
					break
				}
			}
		}
		if m.Size > 0 {
			n["chart-size"]++
		}
	}
	return n
}

var svgRE = regexp.MustCompile(`(?s)<svg id="([a-z-]+)".*?</svg>`)

func TestHTMLCharts(t *testing.T) {
	for name, r := range fixtures() {
		t.Run(name, func(t *testing.T) {
			page := writeHTML(t, r)
			svgs := map[string]string{}
			for _, m := range svgRE.FindAllStringSubmatch(page, -1) {
				svgs[m[1]] = m[0]
			}
			for id, want := range wantData(r) {
				svg, ok := svgs[id]
				if !ok {
					t.Errorf("no <svg id=%q>", id)
					continue
				}
				if got := strings.Count(svg, " data-value="); got != want {
					t.Errorf("%s has %d data elements, want %d", id, got, want)
				}
				if !strings.Contains(svg, "<title id=") || !strings.Contains(svg, "<desc") {
					t.Errorf("%s has no <title> and <desc>", id)
				}
				if hasNoData := strings.Contains(svg, `class="nodata"`); hasNoData != (want == 0) {
					t.Errorf("%s: \"no data\" shown = %v with %d data elements", id, hasNoData, want)
				}
				if want > 0 && !strings.Contains(svg, `class="legend"`) && id != "chart-size" {
					t.Errorf("%s has no legend", id)
				}
			}
		})
	}
}

func TestHTMLThresholds(t *testing.T) {
	page := writeHTML(t, tinynet())
	for _, want := range []string{
		`data-threshold="0.99" data-for="tinynet_onnx_int8"`,
		`data-threshold="0.999" data-for="tinynet_onnx_fp16"`,
		`fill="#D55E00" data-model="tinynet_onnx_int8" data-metric="worst_cosine" data-value="0.981"`,
		`<header id="verdict" class="banner v-fail"><strong>FAIL</strong>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("WriteHTML(tinynet) has no %s", want)
		}
	}
	if page := writeHTML(t, randomData()); !strings.Contains(page, `<p id="data" class="data random">inputs: seeded random data (seed 42) — accuracy of int8 not judged`) {
		t.Errorf("WriteHTML(random) does not call out random data")
	}
}

// TestHTMLSelfContained: nothing to fetch, nothing to run.
func TestHTMLSelfContained(t *testing.T) {
	page := writeHTML(t, tinynet())
	for _, bad := range []string{"<script", "src=", "url(", "@import", "<link rel=\"stylesheet", "http://", "https://"} {
		if strings.Contains(page, bad) {
			t.Errorf("WriteHTML output contains %q", bad)
		}
	}
}

func TestHTMLEscapes(t *testing.T) {
	page := writeHTML(t, hostile())
	for _, bad := range []string{"<script>", "<img", "<iframe", "<b>cat", "onerror=alert(1)>", "& </svg>"} {
		if strings.Contains(page, bad) {
			t.Errorf("WriteHTML(hostile) has unescaped %q", bad)
		}
	}
	if !strings.Contains(page, "&lt;img src=x onerror=alert(1)&gt;") {
		t.Errorf("WriteHTML(hostile): model name not shown escaped")
	}
	if got, want := strings.Count(page, "</svg>"), 3; got != want {
		t.Errorf("WriteHTML(hostile) closes %d svgs, want %d", got, want)
	}
}

// TestNonFinite: a hand-made report with NaN and Inf still renders (check
// never makes one, but the renderers do not trust that), and WriteJSON
// says why it cannot encode it.
func TestNonFinite(t *testing.T) {
	r := tinynet()
	nan, inf := math.NaN(), math.Inf(1)
	r.Models[1].Outputs[0].WorstCosine = nan
	r.Models[2].Outputs[0].Top1 = &inf
	r.Models[0].Perf.Points[2].LatencyP99US = inf
	page := writeHTML(t, r)
	for _, id := range []string{"chart-latency", "chart-accuracy", "chart-size"} {
		if !strings.Contains(page, `<svg id="`+id+`"`) {
			t.Errorf("no %s", id)
		}
	}
	if strings.Contains(page, `data-value="NaN"`) || strings.Contains(page, `data-value="+Inf"`) {
		t.Errorf("WriteHTML drew a non-finite value")
	}
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "logits worst_cosine NaN < 0.999") {
		t.Errorf("WriteMarkdown does not show the NaN cosine as a miss:\n%s", b.String())
	}
	if err := WriteJSON(&b, r); err == nil || !strings.Contains(err.Error(), "encoding report of .cache/demo/repo") {
		t.Errorf("WriteJSON(NaN) error = %v, want one naming the report", err)
	}
}
