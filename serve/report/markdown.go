package report

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/kiln-ml/kiln/internal/check"
)

// WriteMarkdown writes r as GitHub-flavoured Markdown, for a pull request
// comment or a CI job summary: the overall verdict and the data on top, a
// table per reference (the models compared with it), then every failure in
// full and why the other non-passing models did not pass. Text from the
// report (model names, paths, errors) is escaped, so it cannot break the
// tables or inject markup.
func WriteMarkdown(w io.Writer, r *Report) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# %s: %s — %s\n\n", verdictWord(r.Verdict), md(r.Subject), countLine(r))
	fmt.Fprintf(bw, "%s  \n", md(r.Data.Label()))
	if r.Data.Note != "" {
		fmt.Fprintf(bw, "%s  \n", md(r.Data.Note))
	}
	fmt.Fprintf(bw, "%s\n", md(provenance(r)))

	gs := groups(r)
	if len(gs) == 0 {
		fmt.Fprintf(bw, "\nNo models were checked.\n")
	}
	for _, g := range gs {
		if len(gs) == 1 {
			fmt.Fprintf(bw, "\n## Models (reference %s)\n\n", md(g.Reference))
		} else {
			fmt.Fprintf(bw, "\n## Compared with %s\n\n", md(g.Reference))
		}
		writeMarkdownTable(bw, g.Models)
	}

	if fs := failures(r); len(fs) > 0 {
		fmt.Fprintf(bw, "\n## Failures\n\n")
		for _, f := range fs {
			fmt.Fprintf(bw, "- %s\n", md(failureLine(f)))
		}
	}
	if rs := reasons(r); len(rs) > 0 {
		fmt.Fprintf(bw, "\n## Not passed for other reasons\n\n")
		for _, s := range rs {
			fmt.Fprintf(bw, "- %s\n", md(s))
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing Markdown report of %s: %w", r.Subject, err)
	}
	return nil
}

func writeMarkdownTable(w io.Writer, ms []*Model) {
	fmt.Fprintln(w, "| model | runtime/precision | verdict | worst metric | p50 / p99 latency (c1) | best throughput | size |")
	fmt.Fprintln(w, "|---|---|---|---|---|---:|---:|")
	for _, m := range ms {
		v := md(string(m.Verdict))
		if m.Verdict == Fail || m.Verdict == Errored {
			v = "**" + v + "**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", md(m.Name), md(runtimeCell(m)), v,
			md(worstCell(m)), latencyCell(m.Perf), throughputCell(m.Perf), sizeCell(m.Size))
	}
}

// worstCell is the headline metric of m in words: "logits worst_cosine
// 0.981 < 0.99 (images/cat_012.png)", "reference", or "—".
func worstCell(m *Model) string {
	h, ok := headlineOf(m)
	if !ok {
		if m.Reference == "" && m.Verdict == Pass {
			return "reference"
		}
		return "—"
	}
	s := h.Output + " " + h.Metric + " " + h.comparison()
	if h.Sample != "" {
		s += " (" + h.Sample + ")"
	}
	return s
}

// provenance is where and by what the checks ran.
func provenance(r *Report) string {
	parts := []string{}
	if r.Device != "" {
		parts = append(parts, "device "+r.Device)
	}
	if r.ORTVersion != "" {
		parts = append(parts, "onnxruntime "+r.ORTVersion)
	}
	if r.Tool != "" {
		parts = append(parts, r.Tool)
	}
	if !r.Created.IsZero() {
		parts = append(parts, r.Created.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, " · ")
}

// failureOf is one failure with the model it belongs to.
type failureOf struct {
	Model string
	check.Failure
}

func failures(r *Report) []failureOf {
	var fs []failureOf
	for _, m := range r.Models {
		for _, f := range m.Failures {
			fs = append(fs, failureOf{Model: m.Name, Failure: f})
		}
	}
	return fs
}

// reasons says why each model that did not pass, and has no failures to
// show for it, did not pass.
func reasons(r *Report) []string {
	var rs []string
	for _, m := range r.Models {
		if m.Verdict == Pass || len(m.Failures) > 0 && m.Reason == "" {
			continue
		}
		rs = append(rs, fmt.Sprintf("%s (%s): %s", m.Name, m.Verdict, orDash(m.Reason)))
	}
	return rs
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// verdictWord is a verdict as a headline shouts it.
func verdictWord(v Verdict) string {
	if v == "" {
		return "NOT SUMMARIZED"
	}
	return strings.ToUpper(strings.ReplaceAll(string(v), "-", " "))
}

// md escapes text for Markdown inline content and table cells. Newlines
// become spaces, so a multi-line error stays in its list item or cell. An
// underscore inside a word (tinynet_onnx_fp32) cannot start emphasis and is
// left alone, and so are '<' and '&' that start no markup, so the raw text
// stays readable in a CI log. '>' needs nothing: no cell or item starts with
// it.
func md(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i, c := range rs {
		switch c {
		case '\\', '`', '*', '[', ']', '|', '#', '~', '!':
			b.WriteRune('\\')
			b.WriteRune(c)
		case '_':
			if i == 0 || i == len(rs)-1 || !wordRune(rs[i-1]) || !wordRune(rs[i+1]) {
				b.WriteRune('\\')
			}
			b.WriteRune(c)
		case '<', '&':
			// Only "<tag", "</", "<!", "&name;" and "&#1;" are markup;
			// "0.981 < 0.99" stays as it reads.
			if i+1 < len(rs) && (unicode.IsLetter(rs[i+1]) || strings.ContainsRune("/!?#", rs[i+1])) {
				b.WriteString(map[rune]string{'<': "&lt;", '&': "&amp;"}[c])
			} else {
				b.WriteRune(c)
			}
		case '\r', '\n':
			b.WriteRune(' ')
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

func wordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r)
}
