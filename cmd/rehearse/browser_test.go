package main

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"seckill/internal/testenv"
)

// TestReportInBrowser opens a report, made with -compare against an
// earlier run, in headless Chromium (as TestLivePage does the live page)
// and looks at it: the verdict strip shows every check, and every chart
// is drawn: its picture has ink on it, in more than its frame's colours.
// Screenshots are saved in the test's directory.
func TestReportInBrowser(t *testing.T) {
	browser := testenv.Browser(t)
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	var out bytes.Buffer
	earlier := filepath.Join(dir, "earlier")
	if err := run(t.Context(), append([]string{"-base", srv.URL, "-out", earlier}, quick...), &out, &out); err != nil {
		t.Fatal(err, out.String())
	}
	srv = newFakeServer(t, func(f *fakeServer) { f.stallFrom, f.stallTo = 0, 300*time.Millisecond })
	report := filepath.Join(dir, "report")
	if err := run(t.Context(), append([]string{"-base", srv.URL, "-out", report, "-compare", earlier + ".json"}, quick...), &out, &out); err != nil {
		t.Fatal(err, out.String())
	}

	if _, err := browse(browser, chromedp.Navigate("file://"+report+".html")); err != nil {
		t.Fatal(err)
	}
	n, err := browse(browser, chromedp.Evaluate[int](`document.querySelectorAll("#verdicts .verdict.pass").length`))
	if err != nil {
		t.Fatal(err)
	}
	if n < 7 { // six invariants, the generator (on time on an idle machine: counted if so) and the sale
		t.Logf("%d verdicts pass (the generator's may warn on a busy machine)", n)
	}
	if n < 6 {
		t.Errorf("%d verdicts shown as passing, want the six invariants at least", n)
	}
	strip := shoot(t, browser, "#verdicts", filepath.Join(dir, "verdicts.png"))
	if inked(strip) < 0.2 {
		t.Errorf("the verdict strip is mostly blank (%.0f%% ink)", 100*inked(strip))
	}
	for _, id := range []string{"answers", "answers-earlier", "latency-ok", "latency-refused", "arrivals", "in-flight", "lateness", "fairness"} {
		img := shoot(t, browser, `svg[data-chart="`+id+`"]`, filepath.Join(dir, id+".png"))
		if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 150 {
			t.Errorf("chart %s is %dx%d pixels", id, b.Dx(), b.Dy())
		}
		if ink := inked(img); ink < 0.02 {
			t.Errorf("chart %s is blank (%.1f%% ink)", id, 100*ink)
		}
		// Its series take room on the screen: the browser laid them out
		// as something wider or taller than a point.
		drawn, err := browse(browser, chromedp.Evaluate[int](`Array.from(document.querySelectorAll('svg[data-chart="`+id+`"] g.series')).
			filter(g => { const b = g.getBBox(); return b.width + b.height > 2 }).length`))
		if err != nil {
			t.Fatal(err)
		}
		if drawn == 0 {
			t.Errorf("chart %s: none of its series is drawn", id)
		}
	}
	page, err := browse(browser, chromedp.FullScreenshot(80))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.jpg"), page, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
}

// browse runs one action on the browser, bounded.
func browse[T any](ctx context.Context, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, a)
}

// shoot takes a screenshot of the element sel, saves it at path and
// returns it.
func shoot(t *testing.T, browser context.Context, sel, path string) image.Image {
	t.Helper()
	b, err := browse(browser, chromedp.Screenshot(sel))
	if err != nil {
		t.Fatalf("screenshot of %s: %v", sel, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot of %s: %v", sel, err)
	}
	return img
}

// inked is the share of img's pixels that are not white.
func inked(img image.Image) float64 {
	b := img.Bounds()
	n := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r < 0xf000 || g < 0xf000 || bl < 0xf000 {
				n++
			}
		}
	}
	return float64(n) / float64(b.Dx()*b.Dy())
}
