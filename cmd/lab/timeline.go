package main

import (
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A timeline records who believed they held the lock when, in the steps of
// an experiment (not in seconds: the lab moves Redis' clock by hand, so
// the order of events is the story). Two bars over one step are the bug
// the lock exists to prevent; -svg DIR draws them.
type timeline struct {
	step  int
	open  map[string]int // holder -> step it took the lock
	holds []hold
	notes []note
}

type hold struct {
	who      string
	from, to int
}

type note struct {
	at   int
	text string
}

func newTimeline() *timeline { return &timeline{open: map[string]int{}} }

// take: who now holds the lock, as far as it knows.
func (t *timeline) take(who string) {
	t.step++
	t.open[who] = t.step
}

// drop: who stopped holding it (released, or learned it lost it).
func (t *timeline) drop(who string) {
	t.step++
	if from, ok := t.open[who]; ok {
		t.holds = append(t.holds, hold{who, from, t.step})
		delete(t.open, who)
	}
}

// mark notes an event on the lock (an expiry, a crash) at the next step.
func (t *timeline) mark(text string) {
	t.step++
	t.notes = append(t.notes, note{t.step, text})
}

// end closes every hold still open: the experiment is over.
func (t *timeline) end() {
	t.step += 2
	for who, from := range t.open {
		t.holds = append(t.holds, hold{who, from, t.step})
	}
	clear(t.open)
	t.step++
}

// overlaps returns the step ranges in which two or more holders overlap.
func (t *timeline) overlaps() [][2]int {
	var out [][2]int
	for i, a := range t.holds {
		for _, b := range t.holds[i+1:] {
			if from, to := max(a.from, b.from), min(a.to, b.to); from < to {
				out = append(out, [2]int{from, to})
			}
		}
	}
	return out
}

// writeSVGs writes DIR/<name>.svg for every report with timelines: the
// broken variant above the fixed one, a lane per holder, overlaps in red.
func writeSVGs(dir string, reports []report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range reports {
		if r.Broken.timeline == nil || r.Fixed.timeline == nil {
			continue
		}
		f, err := os.Create(filepath.Join(dir, r.Name+".svg"))
		if err != nil {
			return err
		}
		err = drawSVG(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s.svg: %w", r.Name, err)
		}
	}
	return nil
}

const (
	svgWidth   = 760
	laneHeight = 26
	labelWidth = 110
	panelGap   = 40
)

func drawSVG(w io.Writer, r report) error {
	var b strings.Builder
	y := 30
	panels := []struct {
		title string
		o     outcome
	}{{"broken: " + r.Broken.summary, r.Broken}, {"fixed: " + r.Fixed.summary, r.Fixed}}
	for _, p := range panels {
		y = drawPanel(&b, p.title, p.o.timeline, y) + panelGap
	}
	_, err := fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">
<title>%s</title>
<text x="10" y="18" font-size="14" font-weight="bold">%s: %s</text>
%s</svg>
`, svgWidth, y, html.EscapeString(r.Name), html.EscapeString(r.Name), html.EscapeString(r.Title), b.String())
	return err
}

// drawPanel draws one variant's timeline from y down and returns where it
// ends.
func drawPanel(b *strings.Builder, title string, t *timeline, y int) int {
	fmt.Fprintf(b, "<text x=\"10\" y=\"%d\">%s</text>\n", y+14, html.EscapeString(title))
	y += 22
	var lanes []string
	for _, h := range t.holds {
		if !slices.Contains(lanes, h.who) {
			lanes = append(lanes, h.who)
		}
	}
	steps := max(t.step, 1)
	x := func(step int) int { return labelWidth + step*(svgWidth-labelWidth-20)/steps }
	top := y
	for i, who := range lanes {
		ly := y + i*laneHeight
		fmt.Fprintf(b, "<text x=\"10\" y=\"%d\">%s</text>\n", ly+17, html.EscapeString(who))
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", labelWidth, ly+laneHeight-2, svgWidth-20, ly+laneHeight-2)
		for _, h := range t.holds {
			if h.who == who {
				fmt.Fprintf(b, "<rect class=\"hold\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#4a7fc1\"/>\n",
					x(h.from), ly+4, x(h.to)-x(h.from), laneHeight-10)
			}
		}
	}
	bottom := y + len(lanes)*laneHeight
	for _, o := range t.overlaps() {
		fmt.Fprintf(b, "<rect class=\"overlap\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"red\" fill-opacity=\"0.35\" stroke=\"red\"/>\n",
			x(o[0]), top, x(o[1])-x(o[0]), bottom-top)
	}
	for i, n := range t.notes {
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#888\" stroke-dasharray=\"3,3\"/>\n", x(n.at), top, x(n.at), bottom+12*(i+1)-9)
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\" fill=\"#555\" font-size=\"10\">%s</text>\n", x(n.at)+3, bottom+12*(i+1), html.EscapeString(n.text))
	}
	return bottom + 12*len(t.notes) + 8
}
