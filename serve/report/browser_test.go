package report

import (
	"context"
	"flag"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

var screenshot = flag.String("screenshot", "", "write full-page PNGs of the HTML reports TestHTMLRendersInChromium opens: the tinynet one to this file, the others next to it with the case name added")

// chromium finds a Chromium-family browser, or skips the test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium not found: apt-get install chromium (CI installs it in .ci/run)")
	return ""
}

// browser starts a headless Chromium for the test. The flags are those a
// container needs: no sandbox (CI runs as root), no GPU, no /dev/shm.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1100, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first Run starts the browser and must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", chromium(t), err)
	}
	return ctx
}

// console records the console messages of ctx's tab at error level or
// worse until the returned func is called, which returns them.
func console(ctx context.Context) func() []chromedp.ConsoleMessage {
	cctx, cancel := context.WithCancel(ctx)
	msgs := chromedp.Console(cctx)
	var (
		mu   sync.Mutex
		errs []chromedp.ConsoleMessage
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				errs = append(errs, m)
				mu.Unlock()
			}
		}
	}()
	return func() []chromedp.ConsoleMessage {
		time.Sleep(200 * time.Millisecond) // let events sent before the last reply arrive
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return errs
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(path)}).String()
}

// rendered is what the page looks like to the browser.
type rendered struct {
	Verdict string  `json:"verdict"`
	Banner  string  `json:"banner"`
	Color   string  `json:"color"`
	Data    string  `json:"data"`
	Charts  []shape `json:"charts"`
}

type shape struct {
	ID     string  `json:"id"`
	Title  string  `json:"title"`
	Width  float64 `json:"width"`
	Height float64 `json:"height"`
	// Elements counts data elements; Invisible those with an empty box.
	Elements  int  `json:"elements"`
	Invisible int  `json:"invisible"`
	Legend    int  `json:"legend"`
	NoData    bool `json:"nodata"`
}

const measure = `(() => ({
  verdict: document.querySelector('#verdict strong').textContent,
  banner: document.querySelector('#verdict').textContent,
  color: getComputedStyle(document.querySelector('#verdict')).backgroundColor,
  data: document.querySelector('#data').textContent,
  charts: [...document.querySelectorAll('svg[id^="chart-"]')].map(svg => {
    const r = svg.getBoundingClientRect();
    const els = [...svg.querySelectorAll('[data-model][data-value]')];
    return {
      id: svg.id, title: svg.querySelector(':scope > title')?.textContent ?? '',
      width: r.width, height: r.height, elements: els.length,
      invisible: els.filter(e => { const b = e.getBoundingClientRect(); return !(b.width > 0 && b.height > 0); }).length,
      legend: svg.querySelectorAll('.legend').length, nodata: !!svg.querySelector('.nodata'),
    };
  }),
}))()`

func TestHTMLRendersInChromium(t *testing.T) {
	ctx := browser(t)
	tests := []struct {
		name, verdict, color string
		r                    *Report
	}{
		{"tinynet", "FAIL", "rgb(207, 34, 46)", tinynet()},
		{"random", "NOT JUDGED", "rgb(154, 103, 0)", randomData()},
		{"empty", "NOT CHECKED", "rgb(154, 103, 0)", empty()},
		{"hostile", "FAIL", "rgb(207, 34, 46)", hostile()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := writeFile(t, "report.html", writeHTML(t, tt.r))
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			errs := console(tctx)
			if err := chromedp.Do(tctx, chromedp.Navigate(page)); err != nil {
				t.Fatalf("opening %s: %v", page, err)
			}
			got, err := chromedp.Run(tctx, chromedp.Evaluate[rendered](measure))
			if err != nil {
				t.Fatalf("measuring the page: %v", err)
			}
			if *screenshot != "" {
				png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
				if err != nil {
					t.Fatalf("screenshot: %v", err)
				}
				path := *screenshot
				if tt.name != "tinynet" {
					ext := filepath.Ext(path)
					path = strings.TrimSuffix(path, ext) + "-" + tt.name + ext
				}
				if err := os.WriteFile(path, png, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, m := range errs() {
				t.Errorf("console: %s (%s:%d)", m, m.URL, m.Line)
			}
			if got.Verdict != tt.verdict || got.Color != tt.color {
				t.Errorf("banner %q in %s, want %q in %s", got.Verdict, got.Color, tt.verdict, tt.color)
			}
			if tt.r.Data.Label() != got.Data[:min(len(got.Data), len(tt.r.Data.Label()))] {
				t.Errorf("data label %q, want %q", got.Data, tt.r.Data.Label())
			}
			checkCharts(t, got.Charts, wantData(tt.r))
		})
	}
}

func checkCharts(t *testing.T, charts []shape, want map[string]int) {
	t.Helper()
	if len(charts) != len(want) {
		t.Errorf("page has %d charts, want %d", len(charts), len(want))
	}
	for _, c := range charts {
		n, ok := want[c.ID]
		switch {
		case !ok:
			t.Errorf("unexpected chart %s", c.ID)
		case c.Width <= 0 || c.Height <= 0:
			t.Errorf("%s renders %gx%g", c.ID, c.Width, c.Height)
		case c.Title == "":
			t.Errorf("%s has no <title>", c.ID)
		case c.Elements != n:
			t.Errorf("%s has %d data elements, want %d", c.ID, c.Elements, n)
		case c.Invisible > 0:
			t.Errorf("%s: %d of %d data elements render with an empty box", c.ID, c.Invisible, c.Elements)
		case c.NoData != (n == 0):
			t.Errorf("%s: \"no data\" shown = %v with %d data elements", c.ID, c.NoData, n)
		case n > 0 && c.ID != "chart-size" && c.Legend == 0:
			t.Errorf("%s has no legend", c.ID)
		}
	}
}

// TestChromiumSeesConsoleErrors shows the console check above can fail: a
// page that loads from outside breaks its own Content-Security-Policy, and
// the browser logs it as an error.
func TestChromiumSeesConsoleErrors(t *testing.T) {
	ctx := browser(t)
	page := writeFile(t, "bad.html", `<!DOCTYPE html><html><head>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
</head><body><img src="https://example.invalid/x.png" alt=""></body></html>`)
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	errs := console(tctx)
	if err := chromedp.Do(tctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("opening %s: %v", page, err)
	}
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[int](`1`)); err != nil {
		t.Fatal(err)
	}
	if got := errs(); len(got) == 0 {
		t.Errorf("no console error for an image the page's CSP blocks")
	}
}
