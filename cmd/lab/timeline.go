package main

import (
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// A timeline records who believed they held the lock when, what happened
// to the lock (an expiry, a crash), who asked for it and was refused, and
// the writes made under it. Two bars over one moment are the bug the lock
// exists to prevent; -svg DIR draws them.
//
// Each event is a step, and each step has the time of the experiment's
// clock when it happened. Most experiments move Redis' clock by hand, so
// several events often share one instant (A's key expires, B takes the
// lock, C asks): the picture spaces events half by their order and half
// by their time, so that those stay apart and a long wait still looks
// long.
type timeline struct {
	clock string               // what the time axis measures, for its caption
	now   func() time.Duration // that clock, since the experiment began
	at    []time.Duration      // at[step]: the clock when step happened
	lanes []string             // everyone who appears, in order of appearance
	open  map[string]int       // holder -> step it took the lock
	lapse map[string]int       // holder -> step its key expired under it
	holds []hold
	notes []note
	marks []mark
}

// A hold is one stretch in which who believed it held the lock. From
// lapsed on (0: never) its key was gone, though who did not know.
type hold struct {
	who              string
	from, to, lapsed int
}

// A note is an event on the lock itself: an expiry, a crash.
type note struct {
	at   int
	text string
}

// A mark is something one lane did at one step, other than holding.
type mark struct {
	who  string
	at   int
	kind markKind
	text string
}

type markKind int

const (
	refused    markKind = iota // asked for the lock and was told no
	wrote                      // wrote under the lock it held
	staleWrite                 // wrote after losing the lock, and the storage took it: the damage
	fencedOff                  // wrote after losing the lock, and the storage refused it
)

// Names of the clocks the experiments time their events by, for the time
// axis' caption.
const (
	handClockName = "Redis' clock, as the lab moves it"
	realClockName = "real time"
)

// newTimeline starts a timeline at now() = 0. clock says what now
// measures: handClockName, realClockName, or the like.
func newTimeline(clock string, now func() time.Duration) *timeline {
	start := now()
	return &timeline{
		clock: clock,
		now:   func() time.Duration { return now() - start },
		at:    []time.Duration{0},
		open:  map[string]int{},
		lapse: map[string]int{},
	}
}

// since is a real-time clock for newTimeline, counting from start.
func since(start time.Time) func() time.Duration {
	return func() time.Duration { return time.Since(start) }
}

// tick moves to the next step, at the clock's time, and returns it.
func (t *timeline) tick() int {
	t.at = append(t.at, max(t.now(), t.at[len(t.at)-1]))
	return len(t.at) - 1
}

func (t *timeline) step() int { return len(t.at) - 1 }

// lane gives who a lane, the next one down, if it has none yet.
func (t *timeline) lane(who string) {
	if !slices.Contains(t.lanes, who) {
		t.lanes = append(t.lanes, who)
	}
}

// take: who now holds the lock, as far as it knows.
func (t *timeline) take(who string) {
	t.lane(who)
	t.open[who] = t.tick()
}

// drop: who stopped holding it (released, or learned it lost it).
func (t *timeline) drop(who string) {
	s := t.tick()
	t.close(who, s)
}

func (t *timeline) close(who string, s int) {
	if from, ok := t.open[who]; ok {
		t.holds = append(t.holds, hold{who, from, s, t.lapse[who]})
		delete(t.open, who)
		delete(t.lapse, who)
	}
}

// lapsed: who's key expired at the last event, and who does not know
// it: who goes on as the holder, drawn hatched from there on.
func (t *timeline) lapsed(who string) { t.lapsedSince(who, t.step()) }

// lapsedSince is lapsed from an earlier step: the expiry found out later.
func (t *timeline) lapsedSince(who string, step int) {
	if _, ok := t.open[who]; ok {
		t.lapse[who] = step
	}
}

// expire notes that who's key expired (text says how) and ends who's hold
// there: who, paused, is not working under the lock any more.
func (t *timeline) expire(who, text string) {
	s := t.tick()
	t.notes = append(t.notes, note{s, text})
	t.close(who, s)
}

// mark notes an event on the lock (an expiry, a crash) at the next step.
func (t *timeline) mark(text string) {
	t.notes = append(t.notes, note{t.tick(), text})
}

// refuse: who asked for the lock and was refused. text, if any, is
// written beside the mark.
func (t *timeline) refuse(who, text string) {
	t.lane(who)
	t.marks = append(t.marks, mark{who, t.tick(), refused, text})
}

// write: who wrote to the storage, with what outcome (wrote, staleWrite
// or fencedOff).
func (t *timeline) write(who string, kind markKind, text string) {
	t.lane(who)
	t.marks = append(t.marks, mark{who, t.tick(), kind, text})
}

// end closes every hold still open: the experiment is over. The holds
// run on two steps past the last event, to show they were still held.
func (t *timeline) end() {
	t.tick()
	s := t.tick()
	for _, who := range t.lanes {
		t.close(who, s)
	}
	t.tick()
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

// has reports whether the timeline shows a mark of kind.
func (t *timeline) has(kind markKind) bool {
	return slices.ContainsFunc(t.marks, func(m mark) bool { return m.kind == kind })
}

// writeSVGs writes DIR/<name>.svg for every report with timelines: the
// broken variant above the fixed one, each with a lane per holder, a time
// axis and its damage in red, and a legend below both.
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

// The picture's geometry, in pixels. Text is measured at charWidth per
// character: SVG cannot measure it, and a little room to spare is enough.
const (
	svgWidth   = 820
	laneHeight = 26
	labelWidth = 120 // the lanes' names, left of the plot
	plotRight  = svgWidth - 24
	panelGap   = 28
	lineHeight = 13
	charWidth  = 6
)

// Colours. Blue is a holder, red is damage, green is a guard that held.
const (
	holdColour   = "#4a7fc1"
	damageColour = "#d62728"
	guardColour  = "#2ca02c"
	inkColour    = "#333"
	noteColour   = "#777"
)

// defs is what the marks are drawn with, once per picture: a hatch for a
// hold whose key expired, a diamond for a write, a cross for a refusal.
const defs = `<defs>
<pattern id="lapsed" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#dce6f3"/><line x1="0" y1="0" x2="0" y2="6" stroke="` + holdColour + `" stroke-width="2"/>
</pattern>
</defs>
`

func drawSVG(w io.Writer, r report) error {
	var b strings.Builder
	y := 34
	panels := []struct {
		variant, colour string
		o               outcome
	}{{"broken", damageColour, r.Broken}, {"fixed", guardColour, r.Fixed}}
	for _, p := range panels {
		fmt.Fprintf(&b, "<g class=\"panel %s\">\n", p.variant)
		fmt.Fprintf(&b, "<text x=\"10\" y=\"%d\"><tspan font-weight=\"bold\" fill=\"%s\">%s:</tspan> %s</text>\n",
			y+14, p.colour, p.variant, html.EscapeString(p.o.summary))
		y = drawPanel(&b, p.o.timeline, y+24)
		b.WriteString("</g>\n")
		y += panelGap
	}
	y = drawLegend(&b, r, y-panelGap+10)
	_, err := fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">
<title>%s</title>
<rect width="100%%" height="100%%" fill="white"/>
%s<text x="10" y="20" font-size="14" font-weight="bold">%s. %s: %s</text>
%s</svg>
`, svgWidth, y, html.EscapeString(r.Name), defs, r.Number, html.EscapeString(r.Name), html.EscapeString(r.Title), b.String())
	return err
}

// drawPanel draws one variant's timeline from y down: its lanes, the
// events on the lock, and a time axis. It returns where it ends.
func drawPanel(b *strings.Builder, t *timeline, y int) int {
	x := t.xScale()
	top := y
	laneY := map[string]int{}
	for i, who := range t.lanes {
		ly := y + i*laneHeight
		laneY[who] = ly
		fmt.Fprintf(b, "<text x=\"10\" y=\"%d\">%s</text>\n", ly+17, html.EscapeString(who))
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", labelWidth, ly+laneHeight-2, plotRight, ly+laneHeight-2)
	}
	for _, h := range t.holds {
		ly := laneY[h.who]
		until := h.to
		if h.lapsed > 0 {
			until = h.lapsed
			fmt.Fprintf(b, "<rect class=\"lapsed\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"url(#lapsed)\" stroke=\"%s\"/>\n",
				x(h.lapsed), ly+4, x(h.to)-x(h.lapsed), laneHeight-10, holdColour)
		}
		fmt.Fprintf(b, "<rect class=\"hold\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>\n",
			x(h.from), ly+4, x(until)-x(h.from), laneHeight-10, holdColour)
	}
	bottom := y + len(t.lanes)*laneHeight
	for _, o := range t.overlaps() {
		fmt.Fprintf(b, "<rect class=\"overlap\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" fill-opacity=\"0.3\" stroke=\"%s\"/>\n",
			x(o[0]), top, x(o[1])-x(o[0]), bottom-top, damageColour, damageColour)
	}
	// Words hang below the lanes, a line each in the order of events,
	// where they cover nothing: a note's from a dashed line across the
	// lanes at its moment, a mark's from a dotted one under the mark.
	type caption struct {
		at, from      int
		text, colour  string
		class, dashes string
	}
	var captions []caption
	for _, n := range t.notes {
		captions = append(captions, caption{n.at, top, n.text, "#555", "note", "3,3"})
	}
	for _, m := range t.marks {
		my := laneY[m.who] + laneHeight/2 - 1
		drawMark(b, m.kind, x(m.at), my)
		if m.text != "" {
			captions = append(captions, caption{m.at, my + 9, m.text, markColour(m.kind), "leader", "1,2"})
		}
	}
	slices.SortStableFunc(captions, func(a, b caption) int { return a.at - b.at })
	for i, c := range captions {
		fmt.Fprintf(b, "<line class=\"%s\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"%s\"/>\n",
			c.class, x(c.at), c.from, x(c.at), bottom+lineHeight*(i+1)-9, noteColour, c.dashes)
	}
	// The words go over the lines, with a white halo: a later event's line
	// passes behind an earlier one's words, not through them.
	for i, c := range captions {
		drawLabel(b, x(c.at), bottom+lineHeight*(i+1), c.text, c.colour)
	}
	return drawAxis(b, t, x, bottom+lineHeight*len(captions)+8)
}

// xScale returns where each step goes across the plot: half its place in
// the order of events, half its time on the clock (see timeline).
func (t *timeline) xScale() func(step int) int {
	steps := max(t.step(), 1)
	total := t.at[len(t.at)-1]
	width := float64(plotRight - labelWidth)
	return func(step int) int {
		f := float64(step) / float64(steps)
		if total > 0 {
			f = f/2 + float64(t.at[step])/float64(total)/2
		}
		return labelWidth + int(f*width+0.5)
	}
}

// drawAxis draws the time axis at y: a tick at every step whose time
// differs from the last one's, labelled where there is room, and a
// caption saying which clock and which unit. It returns where it ends.
func drawAxis(b *strings.Builder, t *timeline, x func(int) int, y int) int {
	total := t.at[len(t.at)-1]
	unit, scale := time.Millisecond, "ms"
	if total >= 2*time.Second {
		unit, scale = time.Second, "s"
	}
	decimals := 0 // "301 ms"; "1.4 ms" where the whole picture is shorter than 10 units
	if total < 10*unit {
		decimals = 1
	}
	b.WriteString("<g class=\"axis\">\n")
	fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\"/>\n", labelWidth, y, plotRight, y, inkColour)
	lastTick, lastLabel := "", -1000 // the last tick's label, and where the last label drawn ended
	for s := range t.at {
		label := strconv.FormatFloat(float64(t.at[s])/float64(unit), 'f', decimals, 64) + " " + scale
		if label == lastTick {
			continue // no time passed, as far as this axis can tell
		}
		lastTick = label
		xs := x(s)
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\"/>\n", xs, y, xs, y+4, inkColour)
		half := charWidth * utf8.RuneCountInString(label) / 2
		lx := min(xs, svgWidth-4-half) // the last one stays inside the picture
		if lx-half < lastLabel+6 {
			continue // too close to the last label: its tick says enough
		}
		fmt.Fprintf(b, "<text class=\"tick\" x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n", lx, y+15, label)
		lastLabel = lx + half
	}
	fmt.Fprintf(b, "<text class=\"caption\" x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555\">time in %s: %s (events at one instant are drawn apart, in their order)</text>\n",
		labelWidth, y+28, scale, html.EscapeString(t.clock))
	b.WriteString("</g>\n")
	return y + 32
}

// drawLabel writes text beside x at y, to the right of it, or to its left
// where it would run off the picture.
func drawLabel(b *strings.Builder, x, y int, text, colour string) {
	anchor, tx := "start", x+3
	if tx+charWidth*utf8.RuneCountInString(text) > svgWidth-4 {
		anchor, tx = "end", x-3
	}
	fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\" fill=\"%s\" font-size=\"10\" text-anchor=\"%s\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">%s</text>\n",
		tx, y, colour, anchor, html.EscapeString(text))
}

func markColour(k markKind) string {
	switch k {
	case staleWrite:
		return damageColour
	case fencedOff:
		return guardColour
	}
	return inkColour
}

// markClass names each kind of mark in the SVG (and in its legend).
var markClass = map[markKind]string{refused: "refused", wrote: "wrote", staleWrite: "stale-write", fencedOff: "fenced-off"}

// drawMark draws a mark of kind centred on x, y: a crossed circle for a
// refusal, a diamond for a write, red if it did damage, struck through in
// green if the storage refused it.
func drawMark(b *strings.Builder, kind markKind, x, y int) {
	fmt.Fprintf(b, "<g class=\"%s\">", markClass[kind])
	switch kind {
	case refused:
		fmt.Fprintf(b, "<circle cx=\"%d\" cy=\"%d\" r=\"6\" fill=\"white\" stroke=\"%s\"/>", x, y, inkColour)
		fmt.Fprintf(b, "<path d=\"M%d %dl6 6m0 -6l-6 6\" stroke=\"%s\" stroke-width=\"1.5\"/>", x-3, y-3, inkColour)
	case wrote:
		fmt.Fprintf(b, "<path d=\"M%d %dl6 6l-6 6l-6 -6z\" fill=\"%s\"/>", x, y-6, inkColour)
	case staleWrite:
		fmt.Fprintf(b, "<path d=\"M%d %dl8 8l-8 8l-8 -8z\" fill=\"%s\" stroke=\"#7a0000\"/>", x, y-8, damageColour)
	case fencedOff:
		fmt.Fprintf(b, "<path d=\"M%d %dl8 8l-8 8l-8 -8z\" fill=\"white\" stroke=\"%s\" stroke-width=\"1.5\"/>", x, y-8, guardColour)
		fmt.Fprintf(b, "<path d=\"M%d %dl20 -20\" stroke=\"%s\" stroke-width=\"2.5\"/>", x-10, y+10, guardColour)
	}
	b.WriteString("</g>\n")
}

// drawLegend explains, below both panels, every kind of thing the picture
// shows. A hold and an overlap are always explained: a panel without red
// is the point of a fixed variant, and the reader should know what red
// would have meant. It returns where it ends.
func drawLegend(b *strings.Builder, r report, y int) int {
	ts := []*timeline{r.Broken.timeline, r.Fixed.timeline}
	shown := func(f func(*timeline) bool) bool { return slices.ContainsFunc(ts, f) }
	type entry struct {
		class, text string
		swatch      func(x, y int)
	}
	entries := []entry{
		{"hold", "holds the lock, as far as it knows", func(x, y int) {
			fmt.Fprintf(b, "<rect x=\"%d\" y=\"%d\" width=\"22\" height=\"12\" fill=\"%s\"/>", x, y-6, holdColour)
		}},
	}
	if shown(func(t *timeline) bool { return slices.ContainsFunc(t.holds, func(h hold) bool { return h.lapsed > 0 }) }) {
		entries = append(entries, entry{"lapsed", "its key has expired; it does not know", func(x, y int) {
			fmt.Fprintf(b, "<rect x=\"%d\" y=\"%d\" width=\"22\" height=\"12\" fill=\"url(#lapsed)\" stroke=\"%s\"/>", x, y-6, holdColour)
		}})
	}
	entries = append(entries, entry{"overlap", "two holders at once", func(x, y int) {
		fmt.Fprintf(b, "<rect x=\"%d\" y=\"%d\" width=\"22\" height=\"12\" fill=\"%s\" fill-opacity=\"0.3\" stroke=\"%s\"/>", x, y-6, damageColour, damageColour)
	}})
	for _, k := range []markKind{refused, wrote, staleWrite, fencedOff} {
		if !shown(func(t *timeline) bool { return t.has(k) }) {
			continue
		}
		text := map[markKind]string{
			refused:    "asks for the lock: refused",
			wrote:      "writes, holding the lock",
			staleWrite: "writes after losing it: accepted (damage)",
			fencedOff:  "writes after losing it: refused by the storage",
		}[k]
		entries = append(entries, entry{markClass[k], text, func(x, y int) { drawMark(b, k, x+11, y) }})
	}
	if shown(func(t *timeline) bool { return len(t.notes) > 0 }) {
		entries = append(entries, entry{"note", "an event on the lock", func(x, y int) {
			fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"3,3\"/>", x+11, y-8, x+11, y+8, noteColour)
		}})
	}

	// Entries flow left to right, onto a new row where one would not fit.
	b.WriteString("<g class=\"legend\">\n")
	fmt.Fprintf(b, "<line x1=\"10\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", y, svgWidth-10, y)
	fmt.Fprintf(b, "<text x=\"10\" y=\"%d\" font-weight=\"bold\">Legend</text>\n", y+22)
	x, row := 70, y+18
	for _, e := range entries {
		wid := 22 + 6 + charWidth*utf8.RuneCountInString(e.text) + 18
		if x+wid > svgWidth-10 {
			x, row = 70, row+22
		}
		fmt.Fprintf(b, "<g class=\"legend-%s\">", e.class)
		e.swatch(x, row)
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\">%s</text></g>\n", x+28, row+4, html.EscapeString(e.text))
		x += wid
	}
	b.WriteString("</g>\n")
	return row + 18
}
