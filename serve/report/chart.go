package report

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The charts of the HTML page, laid out here in Go and drawn by the template
// as inline SVG: no script, so the page reads the same in a mail client, an
// artifact viewer or a browser with JavaScript off.

// chart is one SVG chart, every coordinate in pixels.
type chart struct {
	ID, Title, Desc string
	W, H            float64
	// Plot area.
	X0, Y0, X1, Y1 float64
	XLabel, YLabel string
	XTicks, YTicks []tick
	// NoData is the message drawn instead of data.
	NoData string
	Lines  []line
	Marks  []mark
	Bars   []bar
	Rules  []rule
	Labels []label
	Legend []legendItem
}

type tick struct {
	Pos   float64
	Label string
}

// line is one series' polyline; its points are marks.
type line struct {
	Model, Metric, Color, Dash, Points string
}

// mark and bar are the data elements: they carry data-model and
// data-value, and a tooltip.
type mark struct {
	Model, Metric, Value, Color, Tip string
	X, Y                             float64
}

type bar struct {
	Model, Metric, Value, Color, Tip string
	X, Y, W, H                       float64
	// Text is printed after the bar's end.
	Text string
}

// rule is a threshold mark across one bar.
type rule struct {
	Model, Value   string
	X1, Y1, X2, Y2 float64
}

type label struct {
	Text, Full, Anchor string
	X, Y               float64
}

// legendItem is a colour swatch, drawn as a line when Line is set and as
// a threshold's upright tick when Tick is.
type legendItem struct {
	Label, Color, Dash string
	Line, Tick         bool
	X, Y               float64
}

// Okabe–Ito colours, distinguishable with the common colour-vision
// deficiencies; yellow is left out, it does not show on white.
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000"}

const (
	chartW        = 960.0
	plotH         = 220.0
	barH          = 13.0
	legendRow     = 18.0
	missColor     = "#D55E00"
	unjudgedColor = "#8c959f"
)

// niceStep is a step of 1, 2 or 5 × 10^k close to span/n.
func niceStep(span float64, n int) float64 {
	if span <= 0 || math.IsNaN(span) || math.IsInf(span, 0) {
		return 1
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

// axisTicks lists ticks from lo to hi by step, mapped to pixels by pos.
func axisTicks(lo, hi, step float64, pos func(float64) float64, format func(float64) string) []tick {
	var ts []tick
	for i := 0; i <= 1000; i++ {
		v := lo + float64(i)*step
		if v > hi+step*1e-9 {
			break
		}
		ts = append(ts, tick{Pos: pos(v), Label: format(v)})
	}
	return ts
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func full(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// latencyChart draws p50 (solid) and p99 (dashed) latency against
// concurrency, one colour per model, at each model's smallest batch size.
func latencyChart(r *Report) chart {
	c := chart{ID: "chart-latency", Title: "Latency vs concurrency",
		Desc:   "p50 (solid) and p99 (dashed) latency per request at each concurrency, one colour per model, smallest batch size measured",
		XLabel: "concurrency (requests in flight)", W: chartW}
	var concs []int
	maxUS := 0.0
	for _, m := range r.Models {
		if m.Perf == nil {
			continue
		}
		b := m.Perf.smallestBatch()
		for _, p := range m.Perf.Points {
			if p.Batch != b || !finite(p.LatencyP50US) || !finite(p.LatencyP99US) {
				continue
			}
			if !slices.Contains(concs, p.Concurrency) {
				concs = append(concs, p.Concurrency)
			}
			maxUS = max(maxUS, p.LatencyP50US, p.LatencyP99US)
		}
	}
	slices.Sort(concs)
	c.X0, c.Y0, c.X1, c.Y1 = 70, 20, chartW-20, 20+plotH
	if len(concs) == 0 {
		c.NoData = "no data: no model was measured"
		c.H = c.Y1 + 50
		return c
	}
	unit, div := "µs", 1.0
	if maxUS >= 2000 {
		unit, div = "ms", 1000
	}
	c.YLabel = "latency (" + unit + ")"
	step := niceStep(maxUS/div, 5)
	top := math.Ceil(maxUS/div/step) * step
	if top == 0 {
		top = step
	}
	yPos := func(v float64) float64 { return c.Y1 - v/top*(c.Y1-c.Y0) }
	c.YTicks = axisTicks(0, top, step, yPos, func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) })
	xPos := func(i int) float64 {
		if len(concs) == 1 {
			return (c.X0 + c.X1) / 2
		}
		return c.X0 + 30 + float64(i)*(c.X1-c.X0-60)/float64(len(concs)-1)
	}
	for i, cc := range concs {
		c.XTicks = append(c.XTicks, tick{Pos: xPos(i), Label: strconv.Itoa(cc)})
	}
	for i, m := range r.Models {
		if m.Perf == nil {
			continue
		}
		color := palette[i%len(palette)]
		pts := slices.Clone(m.Perf.Points)
		slices.SortStableFunc(pts, func(a, b PerfPoint) int { return cmp.Compare(a.Concurrency, b.Concurrency) })
		b := m.Perf.smallestBatch()
		series := []struct {
			metric, dash string
			get          func(PerfPoint) float64
		}{
			{"p50", "", func(p PerfPoint) float64 { return p.LatencyP50US }},
			{"p99", "6 4", func(p PerfPoint) float64 { return p.LatencyP99US }},
		}
		drawn := false
		for _, s := range series {
			l := line{Model: m.Name, Metric: s.metric, Color: color, Dash: s.dash}
			for _, p := range pts {
				if p.Batch != b || !finite(p.LatencyP50US) || !finite(p.LatencyP99US) {
					continue
				}
				x, y := xPos(slices.Index(concs, p.Concurrency)), yPos(s.get(p)/div)
				l.Points += fmt.Sprintf("%.1f,%.1f ", x, y)
				c.Marks = append(c.Marks, mark{Model: m.Name, Metric: s.metric, Value: full(s.get(p)), Color: color,
					X: x, Y: y, Tip: fmt.Sprintf("%s %s at concurrency %d: %s", m.Name, s.metric, p.Concurrency, latency(s.get(p)))})
				drawn = true
			}
			c.Lines = append(c.Lines, l)
		}
		if drawn {
			c.Legend = append(c.Legend, legendItem{Label: ellipsize(m.Name, 40), Color: color, Line: true})
		}
	}
	c.Legend = append(c.Legend, legendItem{Label: "p50", Color: "#444", Line: true}, legendItem{Label: "p99", Color: "#444", Dash: "6 4", Line: true})
	c.layoutLegend(c.Y1 + 48)
	return c
}

// layoutLegend places the legend items in rows of up to three, from y.
func (c *chart) layoutLegend(y float64) {
	col := (c.W - c.X0) / 3
	for i := range c.Legend {
		c.Legend[i].X = c.X0 + float64(i%3)*col
		c.Legend[i].Y = y + float64(i/3)*legendRow
	}
	rows := (len(c.Legend) + 2) / 3
	c.H = y + float64(rows)*legendRow + 4
}

// hbar is one horizontal bar of a bar chart before layout.
type hbar struct {
	model, metric string
	value         float64
	threshold     float64 // 0: none
	color, text   string
	miss          bool
}

// hbarChart lays out rows of horizontal bars (one row per model, one or
// two bars per row) over the axis [lo, hi], with ticks in format (none when
// format is nil: the caller labels the axis itself).
func hbarChart(c chart, rows [][]hbar, lo, hi float64, format func(float64) string) chart {
	maxName := 0
	for _, row := range rows {
		maxName = max(maxName, utf8.RuneCountInString(row[0].model))
	}
	c.X0 = min(280, 16+7*float64(min(maxName, 38)))
	c.X1, c.Y0 = c.W-90, 12
	xPos := func(v float64) float64 { return c.X0 + (v-lo)/(hi-lo)*(c.X1-c.X0) }
	y := c.Y0
	for _, row := range rows {
		h := barH + 1
		rowH := float64(len(row))*h + 8
		c.Labels = append(c.Labels, label{Text: ellipsize(row[0].model, 38), Full: row[0].model,
			Anchor: "end", X: c.X0 - 8, Y: y + rowH/2 + 4})
		for j, b := range row {
			by := y + 4 + float64(j)*h
			v := min(max(b.value, lo), hi)
			c.Bars = append(c.Bars, bar{Model: b.model, Metric: b.metric, Value: full(b.value), Color: b.color,
				X: c.X0, Y: by, W: max(xPos(v)-c.X0, 1), H: h - 1, Text: b.text,
				Tip: fmt.Sprintf("%s %s: %s", b.model, b.metric, b.text)})
			if b.threshold != 0 && b.threshold >= lo && b.threshold <= hi {
				x := xPos(b.threshold)
				c.Rules = append(c.Rules, rule{Model: b.model, Value: full(b.threshold), X1: x, X2: x, Y1: by - 2, Y2: by + h + 1})
			}
		}
		y += rowH
	}
	c.Y1 = y + 4
	if format != nil {
		step := niceStep(hi-lo, 5)
		c.XTicks = axisTicks(math.Ceil(lo/step-1e-9)*step, hi, step, xPos, format)
	}
	return c
}

func ellipsize(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// accuracyChart draws each model's worst-sample cosine (the lowest over its
// outputs) with the threshold it was held to, and its top-1 agreement where
// it has one. The axis starts just below the lowest value: the differences
// that matter sit between 0.98 and 1.
func accuracyChart(r *Report) chart {
	c := chart{ID: "chart-accuracy", Title: "Accuracy vs the reference",
		Desc: "worst-sample cosine similarity per model (lowest over its outputs) with its threshold marked, and top-1 agreement where the output is a classifier",
		W:    chartW}
	var rows [][]hbar
	lo := 1.0
	anyTop1, anyUnjudged := false, false
	for i := range r.Models {
		m := &r.Models[i]
		o := lowestCosine(m)
		if o == nil || !finite(o.WorstCosine) {
			continue
		}
		t := cosineThreshold(m, o.Output)
		// Data that cannot judge the model (random data for int8) draws its
		// numbers grey: a miss there says nothing about the model.
		unjudged := m.Verdict == NotJudged
		anyUnjudged = anyUnjudged || unjudged
		miss := t != 0 && o.WorstCosine < t
		row := []hbar{{model: m.Name, metric: "worst_cosine", value: o.WorstCosine, threshold: t,
			color: barColor(unjudged, miss, "#0072B2"), text: num(o.WorstCosine), miss: miss}}
		lo = min(lo, o.WorstCosine)
		if t != 0 {
			lo = min(lo, t)
		}
		if top1, ok := lowestTop1(m); ok && finite(top1) {
			mt := m.Thresholds[o.Output].MinTop1
			miss1 := mt != 0 && top1 < mt
			row = append(row, hbar{model: m.Name, metric: "top1_agreement", value: top1, threshold: mt,
				color: barColor(unjudged, miss1, "#56B4E9"), text: num(top1), miss: miss1})
			lo = min(lo, top1)
			anyTop1 = true
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		c.X0, c.Y0, c.X1, c.Y1 = 70, 12, chartW-20, 72
		c.NoData = "no data: no model was compared with a reference"
		c.H = c.Y1 + 40
		return c
	}
	span := max(1-lo, 1e-4)
	step := niceStep(span, 4)
	lo = max(math.Floor((lo-step/2)/step)*step, -1)
	c = hbarChart(c, rows, lo, 1, func(v float64) string { return strconv.FormatFloat(v, 'f', decimals(step), 64) })
	c.XLabel = fmt.Sprintf("similarity to the reference (1 = identical; axis starts at %s)", strconv.FormatFloat(lo, 'f', decimals(step), 64))
	c.Legend = []legendItem{{Label: "worst-sample cosine", Color: "#0072B2"}}
	if anyTop1 {
		c.Legend = append(c.Legend, legendItem{Label: "top-1 agreement", Color: "#56B4E9"})
	}
	c.Legend = append(c.Legend, legendItem{Label: "below its threshold", Color: missColor})
	if anyUnjudged {
		c.Legend = append(c.Legend, legendItem{Label: "not judged (data cannot judge it)", Color: unjudgedColor})
	}
	c.Legend = append(c.Legend, legendItem{Label: "threshold", Color: "#1f2328", Tick: true})
	c.layoutLegend(c.Y1 + 46)
	return c
}

// decimals is how many decimals show a multiple of step exactly.
func decimals(step float64) int {
	return max(0, int(math.Ceil(-math.Log10(step)-1e-9)))
}

func barColor(unjudged, miss bool, color string) string {
	switch {
	case unjudged:
		return unjudgedColor
	case miss:
		return missColor
	default:
		return color
	}
}

// sizeChart draws each model's file size.
func sizeChart(r *Report) chart {
	c := chart{ID: "chart-size", Title: "Size per model", Desc: "size of each model's file or engine", W: chartW}
	var rows [][]hbar
	maxB := int64(0)
	for _, m := range r.Models {
		if m.Size <= 0 {
			continue
		}
		rows = append(rows, []hbar{{model: m.Name, metric: "size_bytes", value: float64(m.Size), color: "#009E73", text: bytesIEC(m.Size)}})
		maxB = max(maxB, m.Size)
	}
	if len(rows) == 0 {
		c.X0, c.Y0, c.X1, c.Y1 = 70, 12, chartW-20, 72
		c.NoData = "no data: no model size is known"
		c.H = c.Y1 + 40
		return c
	}
	unit, div := "B", 1.0
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if float64(maxB)/div < 1024*2 {
			break
		}
		unit, div = u, div*1024
	}
	step := niceStep(float64(maxB)/div, 5)
	top := math.Ceil(float64(maxB)/div/step) * step
	// Bars are laid out in bytes; ticks are labelled in the unit.
	c = hbarChart(c, rows, 0, top*div, nil)
	xPos := func(v float64) float64 { return c.X0 + v/top*(c.X1-c.X0) }
	c.XTicks = axisTicks(0, top, step, xPos, func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) })
	c.XLabel = "size (" + unit + ")"
	c.H = c.Y1 + 44
	return c
}
