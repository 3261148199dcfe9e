package chart

import (
	"encoding/xml"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 10, 5, []float64{0, 2, 4, 6, 8, 10}},
		{0, 1, 4, []float64{0, 0.5, 1}},
		{-3, 7, 5, []float64{-2, 0, 2, 4, 6}},
		{0, 0.3, 3, []float64{0, 0.1, 0.2, 0.3}},
		{5, 5, 3, []float64{5}},
	} {
		if got := Ticks(tc.lo, tc.hi, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("Ticks(%g, %g, %d) = %v, want %v", tc.lo, tc.hi, tc.n, got, tc.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.25: "0.25", 3: "3", 1500: "1500", 20000: "20k", 1.5e6: "1.5M", -2: "-2"} {
		if got := Format(v); got != want {
			t.Errorf("Format(%g) = %q, want %q", v, got, want)
		}
	}
}

// TestSVG draws a chart of each kind and reads it back as XML: it must
// parse, carry a series group and a legend entry per series, the marks,
// labelled axes, and bars stacked to the sum of their series.
func TestSVG(t *testing.T) {
	lines := Chart{
		ID: "lat", Title: "Latency", X: Axis{Label: "time (s)"}, Y: Axis{Label: "latency (ms)"},
		Series: []Series{
			{Name: "p50", Points: []Point{{0, 1}, {1, 2}, {2, 3}}},
			{Name: "p99", Points: []Point{{0, 5}, {1, 40}, {2, 7}}},
			{Name: "p99 before", Points: []Point{{0, 4}}, Dashed: true},
		},
		Marks: []Mark{{X: 1, Label: "open"}},
	}
	bars := Chart{
		ID: "codes", Kind: Bars, BarWidth: 1, X: Axis{Label: "time (s)"}, Y: Axis{Label: "answers/s"},
		Series: []Series{
			{Name: "200", Points: []Point{{0, 10}, {1, 5}}},
			{Name: "409 sold_out", Points: []Point{{0, 30}, {1, 100}}},
		},
	}
	for _, c := range []Chart{lines, bars} {
		t.Run(c.ID, func(t *testing.T) {
			svg := c.SVG()
			classes := elementClasses(t, svg)
			if got := classes["series"]; got != len(c.Series) {
				t.Errorf("%d series drawn, want %d", got, len(c.Series))
			}
			if got := classes["legend-entry"]; got != len(c.Series)+len(c.Marks) {
				t.Errorf("%d legend entries, want %d", got, len(c.Series)+len(c.Marks))
			}
			if got := classes["mark"]; got != len(c.Marks) {
				t.Errorf("%d marks, want %d", got, len(c.Marks))
			}
			for _, label := range []string{c.X.Label, c.Y.Label} {
				if !strings.Contains(svg, ">"+label+"<") {
					t.Errorf("axis label %q missing", label)
				}
			}
		})
	}
	// The bars' y axis reaches the tallest stack (105), not the tallest
	// bar (100): its top tick is at least 105.
	svg := bars.SVG()
	if !strings.Contains(svg, ">120<") && !strings.Contains(svg, ">150<") {
		t.Errorf("bars' y axis does not reach the stack of 105:\n%s", svg)
	}
}

// elementClasses parses svg and counts the elements of each class.
func elementClasses(t *testing.T, svg string) map[string]int {
	t.Helper()
	out := map[string]int{}
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if a.Name.Local == "class" {
					for _, c := range strings.Fields(a.Value) {
						out[c]++
					}
				}
			}
		}
	}
}
