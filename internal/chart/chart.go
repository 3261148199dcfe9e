// Package chart draws the project's pictures as SVG: a plot of lines or
// stacked bars over a numeric x axis, with axes that say their unit, a
// legend that names every series, and vertical marks for moments worth
// pointing at (the sale opens, the stock runs out).
//
// The reports that use it (cmd/rehearse's; cmd/lab's timelines could) are files
// a team opens long after the run, often offline: the pictures are drawn
// here, in Go, rather than by a charting script fetched from elsewhere.
// The SVG is plain text, so a test can read what was drawn (every element
// carries a class: "series", "legend", "axis", "mark") and a diff shows
// what changed.
package chart

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A Chart is one picture. The zero value of every field but Series has a
// sensible default.
type Chart struct {
	// ID names the chart in its SVG (data-chart), for tests and links.
	ID    string
	Title string
	X, Y  Axis
	// Kind is how Series are drawn: Lines, or Bars stacked on each other
	// at each x (one bar per x, BarWidth wide).
	Kind     Kind
	BarWidth float64
	Series   []Series
	Marks    []Mark
	// Width and Height are the plot's size in pixels (660 by 260); the
	// legend adds rows below.
	Width, Height int
	// Note is a line of small print under the legend: how to read the
	// chart, or why it is empty.
	Note string
}

// An Axis is a labelled scale. Label should name the unit: "latency (ms)".
// Min and Max bound it; where both are 0 they are taken from the data
// (for Y, from 0).
type Axis struct {
	Label    string
	Min, Max float64
}

// Kind is how a chart draws its series.
type Kind int

const (
	Lines Kind = iota
	Bars       // stacked, in the order of Series, the first at the bottom
)

// A Series is one named set of points, in one colour.
type Series struct {
	Name   string
	Colour string // any SVG colour; "" takes the next of Palette
	Points []Point
	Dashed bool // an earlier run drawn beside this one, say
}

// A Point is a place on the chart, in the axes' units.
type Point struct{ X, Y float64 }

// A Mark is a vertical line at X across the plot, named in the legend.
type Mark struct {
	X      float64
	Label  string
	Colour string
}

// Palette holds colours that stay apart on a screen and in print, in the
// order series take them (Tableau's ten, which most charting tools use).
var Palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// The picture's furniture: margins around the plot, in pixels, and the
// width of a character of the 11-pixel font, which SVG cannot measure for
// us (a little too wide is better than labels that touch).
const (
	marginLeft   = 64
	marginRight  = 16
	marginTop    = 28
	marginBottom = 40
	charWidth    = 6.2
	legendRow    = 18
	Ink          = "#333"
	Faint        = "#ddd"
)

// SVG returns the chart as an <svg> element, ready to be written into an
// HTML page or a file of its own.
func (c Chart) SVG() string {
	w, h := c.Width, c.Height
	if w == 0 {
		w = 660
	}
	if h == 0 {
		h = 260
	}
	series := c.coloured()
	legend := legendRows(series, c.Marks, w)
	plotH := h - marginTop - marginBottom
	total := h + len(legend)*legendRow + 6
	if c.Note != "" {
		total += 16
	}

	xmin, xmax, ymin, ymax := c.bounds(series)
	px := func(x float64) float64 { return marginLeft + (x-xmin)/(xmax-xmin)*float64(w-marginLeft-marginRight) }
	py := func(y float64) float64 { return marginTop + float64(plotH) - (y-ymin)/(ymax-ymin)*float64(plotH) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="%s" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		esc(c.ID), w, total, w, total)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text class="title" x="%d" y="16" font-size="13" font-weight="bold">%s</text>`+"\n", marginLeft, esc(c.Title))

	// Grid and axes first, so that the data is drawn over them.
	b.WriteString(`<g class="axis y">` + "\n")
	for _, t := range Ticks(ymin, ymax, max(2, plotH/40)) {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`, marginLeft, y, w-marginRight, y, Faint)
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginLeft-4, y+4, Format(t))
	}
	fmt.Fprintf(&b, `<text class="label" transform="translate(12 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", marginTop+plotH/2, esc(c.Y.Label))
	b.WriteString("</g>\n")
	b.WriteString(`<g class="axis x">` + "\n")
	base := marginTop + plotH
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s"/>`+"\n", marginLeft, base, w-marginRight, base, Ink)
	for _, t := range Ticks(xmin, xmax, max(2, (w-marginLeft-marginRight)/70)) {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`, x, base, x, base+4, Ink)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, base+15, Format(t))
	}
	fmt.Fprintf(&b, `<text class="label" x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", marginLeft+(w-marginLeft-marginRight)/2, base+32, esc(c.X.Label))
	b.WriteString("</g>\n")

	// The data, clipped to the plot: a value past a fixed Max is cut, not
	// drawn over the legend.
	fmt.Fprintf(&b, `<clipPath id="plot-%s"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath>`+"\n",
		esc(c.ID), marginLeft, marginTop, w-marginLeft-marginRight, plotH)
	fmt.Fprintf(&b, `<g clip-path="url(#plot-%s)">`+"\n", esc(c.ID))
	switch c.Kind {
	case Bars:
		c.drawBars(&b, series, px, py)
	default:
		for _, s := range series {
			drawLine(&b, s, px, py)
		}
	}
	b.WriteString("</g>\n")
	for _, m := range c.Marks {
		if m.X < xmin || m.X > xmax {
			continue
		}
		x := px(m.X)
		// Named in the legend, not beside the line: marks are often close
		// together (the sale opens, and sells out a moment later).
		fmt.Fprintf(&b, `<g class="mark"><title>%s</title><line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5" stroke-dasharray="4,3"/></g>`+"\n",
			esc(m.Label), x, marginTop, x, base, markColour(m))
	}

	// The legend, under the x axis: a swatch and a name for every series
	// and mark, so that no colour has to be guessed.
	b.WriteString(`<g class="legend">` + "\n")
	y := h + 2
	for _, row := range legend {
		x := float64(marginLeft)
		for _, e := range row {
			fmt.Fprintf(&b, `<g class="legend-entry">`)
			switch {
			case e.mark:
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-dasharray="4,3"/>`, x+9, y-6, x+9, y+6, e.colour)
			case c.Kind == Bars:
				fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="18" height="10" fill="%s"/>`, x, y-5, e.colour)
			default:
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"%s/>`, x, y, x+18, y, e.colour, dash(e.dashed))
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text></g>`+"\n", x+24, y+4, esc(e.text))
			x += e.width
		}
		y += legendRow
	}
	b.WriteString("</g>\n")
	if c.Note != "" {
		fmt.Fprintf(&b, `<text class="note" x="%d" y="%d" font-size="10" fill="#666">%s</text>`+"\n", marginLeft, y+4, esc(c.Note))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// coloured returns the series with a colour each, from Palette where none
// was given.
func (c Chart) coloured() []Series {
	out := make([]Series, len(c.Series))
	next := 0
	for i, s := range c.Series {
		if s.Colour == "" {
			s.Colour = Palette[next%len(Palette)]
			next++
		}
		out[i] = s
	}
	return out
}

// bounds returns the axes' ranges: as given, or from the data. A range of
// nothing is widened, so that a flat line is drawn mid-plot and nothing
// divides by zero.
func (c Chart) bounds(series []Series) (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = c.X.Min, c.X.Max, c.Y.Min, c.Y.Max
	fromData := func(min0, max0 float64) bool { return min0 == 0 && max0 == 0 }
	xData, yData := fromData(xmin, xmax), fromData(ymin, ymax)
	if xData {
		xmin, xmax = math.Inf(1), math.Inf(-1)
	}
	if yData {
		ymin, ymax = 0, math.Inf(-1)
	}
	stacks := map[float64]float64{}
	for _, s := range series {
		for _, p := range s.Points {
			if xData {
				xmin, xmax = math.Min(xmin, p.X), math.Max(xmax, p.X)
			}
			y := p.Y
			if c.Kind == Bars {
				stacks[p.X] += p.Y
				y = stacks[p.X]
			}
			if yData {
				ymax = math.Max(ymax, y)
			}
		}
	}
	if xData {
		for _, m := range c.Marks {
			xmin, xmax = math.Min(xmin, m.X), math.Max(xmax, m.X)
		}
		if c.Kind == Bars {
			xmax += c.BarWidth
		}
	}
	if math.IsInf(xmin, 0) || math.IsInf(xmax, 0) {
		xmin, xmax = 0, 1
	}
	if math.IsInf(ymax, 0) || ymax <= ymin {
		ymax = ymin + 1
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if yData {
		ymax = niceCeil(ymax)
	}
	return xmin, xmax, ymin, ymax
}

func drawLine(b *strings.Builder, s Series, px, py func(float64) float64) {
	fmt.Fprintf(b, `<g class="series" data-series="%s">`, esc(s.Name))
	if len(s.Points) == 1 { // a line of one point is invisible: a dot
		p := s.Points[0]
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, px(p.X), py(p.Y), s.Colour)
	} else if len(s.Points) > 1 {
		b.WriteString(`<polyline fill="none" stroke-width="1.6" stroke-linejoin="round" stroke="` + s.Colour + `"` + dash(s.Dashed) + ` points="`)
		for i, p := range s.Points {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(b, "%.1f,%.1f", px(p.X), py(p.Y))
		}
		b.WriteString(`"/>`)
	}
	b.WriteString("</g>\n")
}

// drawBars stacks the series at each x, in order: the first series at the
// bottom. A bar spans [x, x+BarWidth).
func (c Chart) drawBars(b *strings.Builder, series []Series, px, py func(float64) float64) {
	stacks := map[float64]float64{}
	for _, s := range series {
		fmt.Fprintf(b, `<g class="series" data-series="%s" fill="%s">`, esc(s.Name), s.Colour)
		for _, p := range s.Points {
			if p.Y <= 0 {
				continue
			}
			from := stacks[p.X]
			stacks[p.X] = from + p.Y
			x0, x1 := px(p.X), px(p.X+c.BarWidth)
			y0, y1 := py(from), py(from+p.Y)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x0, y1, math.Max(x1-x0-0.5, 0.5), y0-y1)
		}
		b.WriteString("</g>\n")
	}
}

type legendEntry struct {
	text, colour string
	dashed, mark bool
	width        float64
}

// legendRows lays the legend's entries out left to right, onto a new row
// where one would run past the picture's edge.
func legendRows(series []Series, marks []Mark, width int) [][]legendEntry {
	var entries []legendEntry
	for _, s := range series {
		entries = append(entries, legendEntry{text: s.Name, colour: s.Colour, dashed: s.Dashed})
	}
	seen := map[string]bool{}
	for _, m := range marks {
		if !seen[m.Label] {
			seen[m.Label] = true
			entries = append(entries, legendEntry{text: m.Label, colour: markColour(m), mark: true})
		}
	}
	var rows [][]legendEntry
	x := float64(marginLeft)
	for _, e := range entries {
		e.width = 24 + charWidth*float64(utf8.RuneCountInString(e.text)) + 16
		if len(rows) == 0 || x+e.width > float64(width-marginRight) {
			rows = append(rows, nil)
			x = marginLeft
		}
		rows[len(rows)-1] = append(rows[len(rows)-1], e)
		x += e.width
	}
	return rows
}

func markColour(m Mark) string {
	if m.Colour != "" {
		return m.Colour
	}
	return "#555"
}

func dash(on bool) string {
	if on {
		return ` stroke-dasharray="5,3"`
	}
	return ""
}

func esc(s string) string { return html.EscapeString(s) }

// Ticks returns round values (1, 2 or 5 times a power of ten apart) from
// lo to hi, about n of them: where an axis is labelled.
func Ticks(lo, hi float64, n int) []float64 {
	if !(hi > lo) || n < 1 {
		return []float64{lo}
	}
	step := niceStep((hi - lo) / float64(n))
	var out []float64
	for k := math.Ceil(lo/step - 1e-9); k*step <= hi+step*1e-9; k++ {
		// Rounded to 12 significant digits: 3 × 0.1 is 0.30000000000000004.
		v, _ := strconv.ParseFloat(strconv.FormatFloat(k*step, 'g', 12, 64), 64)
		out = append(out, v+0) // +0: no "-0"
	}
	return out
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// niceCeil rounds v up to a value the y axis can end on: its top tick.
func niceCeil(v float64) float64 {
	step := niceStep(v / 5)
	return math.Ceil(v/step-1e-9) * step
}

// Format writes a tick's value short: 0.25, 3, 1.5k, 20k, 1.2M.
func Format(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}
