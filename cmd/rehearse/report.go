package main

import (
	"bytes"
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"seckill/internal/chart"
)

// The report: what analyse makes of a run, written as one HTML page that
// needs nothing else to open (the charts are SVG drawn by package chart,
// the style is inline, there is no script) and as JSON beside it.

// Analysis is every figure the page shows, computed from the Run alone.
type Analysis struct {
	Checks   []Check        `json:"checks"`
	Fairness Fairness       `json:"fairness"`
	Timeline Timeline       `json:"timeline"`
	Totals   map[string]int `json:"totals"` // answers by class
	Requests int            `json:"requests"`
	Wins     int            `json:"wins"`
	OK       Percentiles    `json:"ok"`      // latency of the presses answered 200
	Refused  Percentiles    `json:"refused"` // latency of the other presses
	Joins    Percentiles    `json:"joins"`   // latency of the waiting room's joins
	Late     Percentiles    `json:"late"`    // the generator's lateness
	// SoldOut is when the first sold_out was answered (nil: never);
	// LastWin when the last 200 was.
	SoldOut      *time.Duration `json:"sold_out"`
	LastWin      *time.Duration `json:"last_win"`
	PeakInFlight int            `json:"peak_in_flight"`
	PeakAnswers  float64        `json:"peak_answers_per_second"`
	Room         *RoomFigures   `json:"room,omitempty"`
	// Errors are the commonest reasons requests went unanswered.
	Errors []classCount `json:"errors,omitempty"`
}

// lateLimit is the generator lateness (p99) past which the report warns
// that the crowd left late: the server then saw a gentler crowd than the
// one planned, and its latencies, timed from the plan, include the wait.
const lateLimit = 10 * time.Millisecond

func analyse(r *Run, bin, delta time.Duration) Analysis {
	an := Analysis{
		Checks:   check(r),
		Fairness: fairness(r, delta),
		Timeline: timeline(r, bin),
		Totals:   map[string]int{},
		Requests: len(r.Attempts),
	}
	var ok, refused, joins, late []time.Duration
	errs := map[string]int{}
	for _, a := range r.Attempts {
		an.Totals[class(a)]++
		if a.Err != "" {
			errs[a.Err]++
		}
		late = append(late, a.lateness())
		switch {
		case a.Kind == "join":
			joins = append(joins, a.latency())
		case a.sold():
			an.Wins++
			ok = append(ok, a.latency())
			if an.LastWin == nil || a.Done > *an.LastWin {
				an.LastWin = &a.Done
			}
		default:
			refused = append(refused, a.latency())
			if a.Code == "sold_out" && (an.SoldOut == nil || a.Done < *an.SoldOut) {
				an.SoldOut = &a.Done
			}
		}
	}
	an.OK, an.Refused, an.Joins, an.Late = percentiles(ok), percentiles(refused), percentiles(joins), percentiles(late)
	for e, n := range errs {
		an.Errors = append(an.Errors, classCount{e, n})
	}
	slices.SortFunc(an.Errors, func(a, b classCount) int { return cmp.Or(cmp.Compare(b.N, a.N), cmp.Compare(a.Class, b.Class)) })
	an.Errors = an.Errors[:min(len(an.Errors), 5)]
	for _, b := range an.Timeline.Bins {
		an.PeakInFlight = max(an.PeakInFlight, b.InFlight)
		n := 0
		for _, c := range b.Answers {
			n += c
		}
		an.PeakAnswers = max(an.PeakAnswers, float64(n)/an.Timeline.Bin.Seconds())
	}
	if r.Room != nil {
		an.Room = roomFigures(r, an.Timeline)
	}
	return an
}

// output is what the JSON file holds: the run, and what was made of it
// (for a reader with jq; -compare and -merge read the run and compute
// the rest again).
type output struct {
	*Run
	Analysis Analysis `json:"analysis"`
}

// finish analyses r, writes the report and its JSON at c.out, and says
// in a few lines what they hold. It returns errInvariant when a check
// failed.
func finish(r *Run, earlier *Run, c config, stdout io.Writer) error {
	an := analyse(r, c.bin, c.delta)
	b, err := json.Marshal(output{r, an})
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.out+".json", b, 0o644); err != nil {
		return err
	}
	var page bytes.Buffer
	if err := writeReport(&page, r, an, earlier, c.bin, c.delta); err != nil {
		return err
	}
	if err := os.WriteFile(c.out+".html", page.Bytes(), 0o644); err != nil {
		return err
	}
	failed := false
	fmt.Fprintf(stdout, "rehearsal of voucher %s (%s): %d requests, %d orders of %d\n", r.Voucher.ID, r.Label, an.Requests, an.Wins, r.Voucher.Stock)
	for _, ch := range an.Checks {
		fmt.Fprintf(stdout, "  %-7s %s: %s\n", strings.ToUpper(ch.Verdict), ch.Name, ch.Figures)
		failed = failed || ch.Verdict == fail
	}
	f := an.Fairness
	fmt.Fprintf(stdout, "  fairness: %.2f of the first %d clickers won; a winner clicked before a loser with chance %.2f (1: first come first served, 0.5: a lottery)\n",
		f.Precision, f.FirstS, f.AUC)
	fmt.Fprintf(stdout, "  latency p99: %s for 200s, %s for refusals; the generator's lateness p99 %s, max %s\n", ms(an.OK.P99), ms(an.Refused.P99), ms(an.Late.P99), ms(an.Late.Max))
	fmt.Fprintf(stdout, "  report: %s.html (data: %s.json)\n", c.out, c.out)
	if failed {
		return errInvariant
	}
	return nil
}

//go:embed report.html
var reportHTML string

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":     ms,
	"secs":   secs,
	"pct":    func(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) },
	"mul100": func(f float64) float64 { return 100 * f },
	"f2":     func(f float64) string { return fmt.Sprintf("%.2f", f) },
	"dur":    func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"opt": func(d *time.Duration) string {
		if d == nil {
			return "never"
		}
		return secs(*d)
	},
}).Parse(reportHTML))

// page is what report.html is given.
type page struct {
	Run      *Run
	An       Analysis
	Earlier  *Run
	EarlyAn  *Analysis
	Classes  []classCount
	Charts   []template.HTML
	Fair     template.HTML
	RoomSVG  []template.HTML
	Compare  []compareRow
	Generate generator
}

type classCount struct {
	Class string `json:"what"`
	N     int    `json:"n"`
}

type compareRow struct{ Name, Now, Then string }

// generator is the verdict on the generator itself.
type generator struct {
	Late      bool // it fell behind: figures understate the crowd
	CPU, Wall time.Duration
	Cores     int
	Share     float64 // of the machine's cores
}

func writeReport(w io.Writer, r *Run, an Analysis, earlier *Run, bin, delta time.Duration) error {
	p := page{Run: r, An: an, Earlier: earlier}
	if earlier != nil {
		ea := analyse(earlier, an.Timeline.Bin, delta)
		p.EarlyAn = &ea
		p.Compare = compareRows(r, an, earlier, ea)
	}
	for _, c := range classes {
		if n := an.Totals[c]; n > 0 {
			p.Classes = append(p.Classes, classCount{c, n})
		}
	}
	for _, m := range r.Machines {
		p.Generate.CPU += m.CPU
		p.Generate.Wall = max(p.Generate.Wall, m.Wall)
		p.Generate.Cores += m.Cores
	}
	if p.Generate.Wall > 0 && p.Generate.Cores > 0 {
		p.Generate.Share = p.Generate.CPU.Seconds() / p.Generate.Wall.Seconds() / float64(p.Generate.Cores)
	}
	p.Generate.Late = an.Late.P99 > lateLimit
	for _, c := range charts(r, an, p.EarlyAn) {
		p.Charts = append(p.Charts, template.HTML(c.SVG()))
	}
	p.Fair = template.HTML(fairnessChart(r, an, p.EarlyAn).SVG())
	if an.Room != nil {
		for _, c := range roomCharts(an.Room) {
			p.RoomSVG = append(p.RoomSVG, template.HTML(c.SVG()))
		}
	}
	return reportTmpl.Execute(w, p)
}

// Colours of the answers, the same on every chart: green is a sale, grey
// the refusals a sale is made of, amber the limits, red what went wrong.
var classColour = map[string]string{
	"200": "#59a14f", "409 not_started": "#bab0ac", "409 not_admitted": "#d4a6c8", "409 sold_out": "#79706e",
	"409 already_ordered": "#9c755f", "429 busy": "#f28e2b", "5xx": "#e15759", "no answer": "#b6002f", "other": "#b07aa1",
	"join: in line": "#76b7b2", "join: refused (409)": "#4e79a7", "join: 429, 5xx or no answer": "#ff9da7", "join: other": "#edc948",
}

// charts draws the run's timeline: answers, latency of successes and of
// refusals, arrivals, requests in flight, the generator's lateness. An
// earlier run, if given, is drawn dashed on the line charts and as a
// chart of its own beside the answers.
func charts(r *Run, an Analysis, earlier *Analysis) []chart.Chart {
	t := an.Timeline
	perSec := 1 / t.Bin.Seconds()
	// Every time chart spans the whole run, so that they line up.
	x := chart.Axis{Label: fmt.Sprintf("time since the sale opened (s); bins of %s", t.Bin)}
	if n := len(t.Bins); n > 0 {
		x.Min, x.Max = t.Bins[0].At.Seconds(), (t.Bins[n-1].At + t.Bin).Seconds()
	}
	marks := saleMarks(an)
	xs := func(b Bin) float64 { return b.At.Seconds() }
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

	answers := func(id, title string, tl Timeline, m []chart.Mark) chart.Chart {
		c := chart.Chart{ID: id, Title: title, Kind: chart.Bars, BarWidth: tl.Bin.Seconds(), X: x, Y: chart.Axis{Label: "answers/s"}, Marks: m}
		for _, cl := range classes {
			s := chart.Series{Name: cl, Colour: classColour[cl]}
			for _, b := range tl.Bins {
				if n := b.Answers[cl]; n > 0 {
					s.Points = append(s.Points, chart.Point{X: xs(b), Y: float64(n) / tl.Bin.Seconds()})
				}
			}
			if len(s.Points) > 0 {
				c.Series = append(c.Series, s)
			}
		}
		return c
	}
	out := []chart.Chart{answers("answers", "Answers by code, per second", t, marks)}
	if earlier != nil {
		c := answers("answers-earlier", "Answers by code, per second: the earlier run", earlier.Timeline, saleMarks(*earlier))
		c.X.Min, c.X.Max = 0, 0 // its own span
		out = append(out, c)
	}

	latency := func(id, title string, pick func(Bin) Percentiles) chart.Chart {
		c := chart.Chart{ID: id, Title: title, X: x, Y: chart.Axis{Label: "latency from the intended send (ms)"}, Marks: marks,
			Note: "each request counted in the bin it was due in; bins without such requests are left out"}
		for _, q := range []struct {
			name   string
			colour string
			get    func(Percentiles) time.Duration
		}{
			{"p50", "#4e79a7", func(p Percentiles) time.Duration { return p.P50 }},
			{"p90", "#76b7b2", func(p Percentiles) time.Duration { return p.P90 }},
			{"p99", "#f28e2b", func(p Percentiles) time.Duration { return p.P99 }},
			{"max", "#e15759", func(p Percentiles) time.Duration { return p.Max }},
		} {
			s := chart.Series{Name: q.name, Colour: q.colour}
			for _, b := range t.Bins {
				if p := pick(b); p.N > 0 {
					s.Points = append(s.Points, chart.Point{X: xs(b), Y: msOf(q.get(p))})
				}
			}
			c.Series = append(c.Series, s)
			if earlier != nil && (q.name == "p50" || q.name == "p99") {
				e := chart.Series{Name: q.name + " earlier", Colour: q.colour, Dashed: true}
				for _, b := range earlier.Timeline.Bins {
					if p := pick(b); p.N > 0 {
						e.Points = append(e.Points, chart.Point{X: xs(b), Y: msOf(q.get(p))})
					}
				}
				c.Series = append(c.Series, e)
			}
		}
		return c
	}
	out = append(out,
		latency("latency-ok", "Latency of the presses answered 200", func(b Bin) Percentiles { return b.OK }),
		latency("latency-refused", "Latency of the refused presses (every answer but 200, and no answer)", func(b Bin) Percentiles { return b.Refused }))
	if an.Joins.N > 0 {
		out = append(out, latency("latency-joins", "Latency of the waiting room's joins", func(b Bin) Percentiles { return b.Joins }))
	}

	line := func(name, colour string, tl Timeline, get func(Bin) float64, dashed bool) chart.Series {
		s := chart.Series{Name: name, Colour: colour, Dashed: dashed}
		for _, b := range tl.Bins {
			s.Points = append(s.Points, chart.Point{X: xs(b), Y: get(b)})
		}
		return s
	}
	arrivals := chart.Chart{ID: "arrivals", Title: "Arrivals and requests sent", X: x, Y: chart.Axis{Label: "per second"}, Marks: marks,
		Series: []chart.Series{
			line("users arriving", "#4e79a7", t, func(b Bin) float64 { return float64(b.Arrivals) * perSec }, false),
			line("requests sent", "#f28e2b", t, func(b Bin) float64 { return float64(b.Sent) * perSec }, false),
		}}
	inFlight := chart.Chart{ID: "in-flight", Title: "Requests in flight", X: x, Y: chart.Axis{Label: "requests (the bin's peak)"}, Marks: marks,
		Series: []chart.Series{line("in flight", "#b07aa1", t, func(b Bin) float64 { return float64(b.InFlight) }, false)}}
	late := chart.Chart{ID: "lateness", Title: "The generator's lateness: how late requests left", X: x, Y: chart.Axis{Label: "sent − due (ms)"}, Marks: marks,
		Note: fmt.Sprintf("past %s at p99 the crowd left late: the server saw a gentler sale than the one planned", lateLimit)}
	for _, q := range []struct {
		name, colour string
		get          func(Percentiles) time.Duration
	}{{"p50", "#4e79a7", func(p Percentiles) time.Duration { return p.P50 }}, {"p99", "#f28e2b", func(p Percentiles) time.Duration { return p.P99 }}, {"max", "#e15759", func(p Percentiles) time.Duration { return p.Max }}} {
		s := chart.Series{Name: q.name, Colour: q.colour}
		for _, b := range t.Bins {
			if b.Late.N > 0 {
				s.Points = append(s.Points, chart.Point{X: xs(b), Y: msOf(q.get(b.Late))})
			}
		}
		late.Series = append(late.Series, s)
	}
	if earlier != nil {
		arrivals.Series = append(arrivals.Series, line("requests sent, earlier", "#f28e2b", earlier.Timeline, func(b Bin) float64 { return float64(b.Sent) / earlier.Timeline.Bin.Seconds() }, true))
		inFlight.Series = append(inFlight.Series, line("in flight, earlier", "#b07aa1", earlier.Timeline, func(b Bin) float64 { return float64(b.InFlight) }, true))
	}
	return append(out, arrivals, inFlight, late)
}

// saleMarks are the moments drawn across the time charts.
func saleMarks(an Analysis) []chart.Mark {
	m := []chart.Mark{{X: 0, Label: "sale opens", Colour: "#333"}}
	if an.SoldOut != nil {
		m = append(m, chart.Mark{X: an.SoldOut.Seconds(), Label: "first sold_out", Colour: "#e15759"})
	}
	if an.LastWin != nil {
		m = append(m, chart.Mark{X: an.LastWin.Seconds(), Label: "last 200", Colour: "#59a14f"})
	}
	return m
}

// fairnessChart is the fairness curve: the win rate of each tenth of the
// clickers, earliest first. First come, first served is a cliff (the
// first tenths win, the rest lose); a lottery is flat at the dashed line.
func fairnessChart(r *Run, an Analysis, earlier *Analysis) chart.Chart {
	f := an.Fairness
	c := chart.Chart{ID: "fairness", Title: "Win rate by tenth of the clickers, earliest first",
		X: chart.Axis{Label: "tenth of the clickers, by click time (1: the earliest)", Min: 1, Max: 10},
		Y: chart.Axis{Label: "win rate (%)", Min: 0, Max: 100}, Height: 240}
	curve := func(name, colour string, ds []Group, dashed bool) chart.Series {
		s := chart.Series{Name: name, Colour: colour, Dashed: dashed}
		for i, d := range ds {
			s.Points = append(s.Points, chart.Point{X: float64(i + 1), Y: 100 * d.Rate})
		}
		return s
	}
	c.Series = append(c.Series, curve("this run", "#4e79a7", f.Deciles, false))
	if f.Clickers > 0 {
		rate := 100 * float64(f.Winners) / float64(f.Clickers)
		c.Series = append(c.Series, chart.Series{Name: "a lottery", Colour: "#999", Dashed: true, Points: []chart.Point{{X: 1, Y: rate}, {X: 10, Y: rate}}})
	}
	if earlier != nil {
		c.Series = append(c.Series, curve("the earlier run", "#f28e2b", earlier.Fairness.Deciles, true))
	}
	return c
}

// compareRows puts the headline figures of two runs side by side.
func compareRows(r *Run, an Analysis, e *Run, ea Analysis) []compareRow {
	verdicts := func(a Analysis) string {
		n := 0
		for _, c := range a.Checks {
			if c.Verdict == pass {
				n++
			}
		}
		return fmt.Sprintf("%d of %d pass", n, len(a.Checks))
	}
	opt := func(d *time.Duration) string {
		if d == nil {
			return "never"
		}
		return secs(*d)
	}
	return []compareRow{
		{"run", r.Label, e.Label},
		{"users, bots, stock", fmt.Sprintf("%d, %d, %d", r.Shape.Users, r.Shape.Bots, r.Voucher.Stock), fmt.Sprintf("%d, %d, %d", e.Shape.Users, e.Shape.Bots, e.Voucher.Stock)},
		{"invariants", verdicts(an), verdicts(ea)},
		{"requests", fmt.Sprint(an.Requests), fmt.Sprint(ea.Requests)},
		{"orders", fmt.Sprint(an.Wins), fmt.Sprint(ea.Wins)},
		{"first sold_out", opt(an.SoldOut), opt(ea.SoldOut)},
		{"latency of 200s p50 / p99", ms(an.OK.P50) + " / " + ms(an.OK.P99), ms(ea.OK.P50) + " / " + ms(ea.OK.P99)},
		{"latency of refusals p50 / p99", ms(an.Refused.P50) + " / " + ms(an.Refused.P99), ms(ea.Refused.P50) + " / " + ms(ea.Refused.P99)},
		{"peak answers/s", fmt.Sprintf("%.0f", an.PeakAnswers), fmt.Sprintf("%.0f", ea.PeakAnswers)},
		{"first come first served (precision@stock, AUC)", fmt.Sprintf("%.2f, %.2f", an.Fairness.Precision, an.Fairness.AUC), fmt.Sprintf("%.2f, %.2f", ea.Fairness.Precision, ea.Fairness.AUC)},
		{"generator lateness p99", ms(an.Late.P99), ms(ea.Late.P99)},
	}
}

// Rows lists the shape for the page, as the flags that make it.
func (s Shape) Rows() [][2]string {
	return [][2]string{
		{"-users, -bots", fmt.Sprintf("%d people, %d bots", s.Users, s.Bots)},
		{"-stock", fmt.Sprint(s.Stock)},
		{"-lead, -early", fmt.Sprintf("people turn up over the %s before the start; %.0f%% of them press on arrival", s.Lead, 100*s.Early)},
		{"-late, -tail", fmt.Sprintf("%.0f%% turn up after the start instead, %s apart on average", 100*s.Late, s.Tail)},
		{"-react", fmt.Sprintf("median reaction %s (log-normal)", s.React)},
		{"-honour", fmt.Sprintf("%.0f%% of people wait as Retry-After says", 100*s.Honour)},
		{"-again", fmt.Sprintf("%.0f%% of people press once more as soon as they are told 200", 100*s.Again)},
		{"-retries, -backoff, -backoff-max", fmt.Sprintf("%d retries, backoff from %s to %s, full jitter", s.Retries, s.Backoff, s.BackoffMax)},
		{"-bot-every, -bot-lead, -bot-conns", fmt.Sprintf("bots poll every %s from %s before the start, %d in flight each", s.BotEvery, s.BotLead, s.BotConns)},
		{"-duration, -timeout", fmt.Sprintf("nothing sent after %s; no answer after %s", s.Duration, s.Timeout)},
		{"-conns", s.Conns},
		{"-seed", fmt.Sprint(s.Seed)},
	}
}
