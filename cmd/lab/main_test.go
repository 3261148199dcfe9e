package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"seckill/internal/testenv"
)

// TestMain fails the package if an experiment leaves a goroutine behind
// (a lock's watchdog, a waiter's subscription, a clock). Unless
// integration tests are on, the experiments that start redis-server
// (failover, redlock-restart) find none, and are skipped as where it is
// not installed: the rest need no server.
func TestMain(m *testing.M) {
	if !testenv.Enabled() {
		lookPath = func(string) (string, error) { return "", errNoRedisServer }
	}
	testenv.Main(m)
}

// runs says how many times each experiment runs in a row. The races are
// forced, so one run should do; ten prove that nothing depends on luck.
const runs = 10

// TestExperiments asserts for each experiment that the broken variant
// shows damage and the fixed one none, runs times in a row.
func TestExperiments(t *testing.T) {
	for _, e := range experiments {
		t.Run(e.name, func(t *testing.T) {
			for i := range runs {
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				r, err := runExperiment(ctx, e)
				cancel()
				if errors.Is(err, errNoRedisServer) && !testenv.Required() {
					testenv.Integration(t, "redis-server") // says which variable runs it
					t.Skip(err)
				}
				if err != nil {
					t.Fatalf("run %d: %v", i+1, err)
				}
				if r.Broken.violations == 0 {
					t.Errorf("run %d: broken variant showed no damage: %s", i+1, r.Broken.summary)
				}
				if r.Fixed.violations != 0 {
					t.Errorf("run %d: fixed variant showed %d violations: %s", i+1, r.Fixed.violations, r.Fixed.summary)
				}
				if i == 0 {
					checkReportWidth(t, r)
				}
			}
		})
	}
}

// checkReportWidth prints r as the default run does and fails on a line
// wider than an 80-column terminal: the real summaries and lessons, not
// made-up ones, are what must fit.
func checkReportWidth(t *testing.T, r report) {
	t.Helper()
	var b bytes.Buffer
	if err := printReport(&b, []report{r}); err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(b.String()) {
		line = strings.TrimSuffix(line, "\n")
		if n := utf8.RuneCountInString(line); n > reportWidth {
			t.Errorf("a line of %d characters, over %d:\n%s", n, reportWidth, line)
		}
	}
}

func TestWriteWrapped(t *testing.T) {
	long := strings.Repeat("x", reportWidth+5)
	tests := []struct {
		name, text, want string
	}{
		{"fits", "a b c", "  lesson  a b c\n"},
		{"breaks at a space", strings.Repeat("word ", 20),
			"  lesson  word word word word word word word word word word word word word word\n" +
				"          word word word word word word\n"},
		{"a word longer than a line stays whole", "a " + long + " b",
			"  lesson  a\n          " + long + "\n          b\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writeWrapped(&b, "  lesson  ", "          ", tt.text)
			if b.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", b.String(), tt.want)
			}
		})
	}
}

// TestNumbering keeps one numbering of the experiments everywhere a reader
// meets it: -list, the doc comment that opens each experiment's file
// ("// Experiment 12b: ..."), and docs/lab.md's table and headings. The
// numbers come from the order of experiments (see numbers); when one is
// added, moved or split, this test names every place still to change.
func TestNumbering(t *testing.T) {
	num := numbers()
	var want []string // "12b redlock-restart", in the lab's order
	for _, e := range experiments {
		want = append(want, num[e.name]+" "+e.name)
	}

	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-list"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for line := range strings.Lines(stdout.String()) {
		if f := strings.Fields(line); len(f) >= 2 {
			listed = append(listed, f[0]+" "+f[1])
		}
	}
	sameList(t, "-list", listed, want)

	doc, err := os.ReadFile("../../docs/lab.md")
	if err != nil {
		t.Fatal(err)
	}
	var headings, rows []string
	for _, m := range regexp.MustCompile("(?m)^### ([0-9]+[a-z]?)\\. `([a-z-]+)`").FindAllStringSubmatch(string(doc), -1) {
		headings = append(headings, m[1]+" "+m[2])
	}
	for _, m := range regexp.MustCompile("(?m)^\\| ([0-9]+[a-z]?) \\| `([a-z-]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		rows = append(rows, m[1]+" "+m[2])
	}
	sameList(t, "docs/lab.md's headings", headings, want)
	sameList(t, "docs/lab.md's table", rows, want)

	// The doc comment of each experiment's variable opens with its number.
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	commented := map[string]string{} // name -> "12b"
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR || len(g.Specs) != 1 {
				continue
			}
			name, ok := experimentName(g.Specs[0])
			if !ok {
				continue
			}
			m := regexp.MustCompile(`^Experiment ([0-9]+[a-z]?):`).FindStringSubmatch(g.Doc.Text())
			if m == nil {
				t.Errorf("%s: the doc comment of experiment %s does not open with \"Experiment N:\"", fset.Position(g.Pos()), name)
				continue
			}
			commented[name] = m[1]
		}
	}
	for _, e := range experiments {
		if got := commented[e.name]; got != num[e.name] {
			t.Errorf("experiment %s: its doc comment says %q, the lab numbers it %s", e.name, got, num[e.name])
		}
	}
}

// experimentName returns the name field of `var x = experiment{name: ...}`.
func experimentName(spec ast.Spec) (string, bool) {
	v, ok := spec.(*ast.ValueSpec)
	if !ok || len(v.Values) != 1 {
		return "", false
	}
	lit, ok := v.Values[0].(*ast.CompositeLit)
	if !ok {
		return "", false
	}
	if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "experiment" {
		return "", false
	}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "name" {
			if s, ok := kv.Value.(*ast.BasicLit); ok {
				name, err := strconv.Unquote(s.Value)
				return name, err == nil
			}
		}
	}
	return "", false
}

// sameList fails unless got and want hold the same items in one order.
func sameList(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s numbers the experiments\n  %s\nthe lab numbers them\n  %s",
			what, strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

func TestNumbers(t *testing.T) {
	num := numbers()
	for name, want := range map[string]string{
		"oversell": "1", "failover": "12", "redlock-restart": "12b", "in-process-queue": "13",
		// Others refer to these three by number (issue 32's course map).
		"redis-check-decr": "17", "lock-wait-polling": "18", "multilock-nodes": "19",
	} {
		if num[name] != want {
			t.Errorf("numbers()[%q] = %q, want %q", name, num[name], want)
		}
	}
}

// TestRunList runs -list with two names: the numbers printed are the
// lab's, not their places in the shorter list.
func TestRunList(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-list", "failover", "oversell"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var got []string
	for line := range strings.Lines(stdout.String()) {
		got = append(got, strings.Join(strings.Fields(line)[:2], " "))
	}
	sameList(t, "-list failover oversell", got, []string{"1 oversell", "12 failover"})
}

// TestRunJSON runs two experiments by name, given out of order, and reads
// the JSON a script would read.
func TestRunJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-json", "del-after-expiry", "oversell"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Number, Name, Lesson string
		Broken, Fixed        map[string]any
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in:\n%s", err, stdout.String())
	}
	if len(got) != 2 || got[0].Name != "oversell" || got[1].Name != "del-after-expiry" {
		t.Fatalf("got %+v, want oversell then del-after-expiry, in the lab's order", got)
	}
	if got[0].Number != "1" || got[1].Number != "7" {
		t.Errorf("numbers %q and %q, want the lab's: 1 and 7", got[0].Number, got[1].Number)
	}
	for _, r := range got {
		if r.Lesson == "" {
			t.Errorf("%s: no lesson", r.Name)
		}
		if v, ok := r.Broken["violations"].(float64); !ok || v <= 0 {
			t.Errorf("%s: broken.violations = %v, want > 0", r.Name, r.Broken["violations"])
		}
		if v, ok := r.Fixed["violations"].(float64); !ok || v != 0 {
			t.Errorf("%s: fixed.violations = %v, want 0", r.Name, r.Fixed["violations"])
		}
	}
	if got[0].Broken["orders"] != float64(30) {
		t.Errorf("oversell: broken.orders = %v, want 30 (every buyer)", got[0].Broken["orders"])
	}
}

func TestRunUnknownName(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"oversel"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "oversel") || !strings.Contains(err.Error(), "oversell") {
		t.Fatalf("err = %v, want one naming the unknown experiment and the known ones", err)
	}
}

// TestCheck makes sure the lab fails when an experiment does not show
// what it exists to show.
func TestCheck(t *testing.T) {
	tests := []struct {
		name          string
		broken, fixed int
		wantErr       bool
	}{
		{"as designed", 3, 0, false},
		{"broken shows nothing", 0, 0, true},
		{"fixed shows damage", 3, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := check([]report{{Name: "x", Broken: outcome{violations: tt.broken}, Fixed: outcome{violations: tt.fixed}}})
			if (err != nil) != tt.wantErr {
				t.Errorf("check() = %v, want error: %v", err, tt.wantErr)
			}
		})
	}
}

// TestRace checks the lab's hook: nobody passes pause before every other
// goroutine has paused or returned, and one that returns without pausing
// does not hold the others up.
func TestRace(t *testing.T) {
	const n = 8
	var mu sync.Mutex
	paused, early := 0, 0
	race(n, func(i int, pause func()) {
		if i == 0 {
			return // turned away before the pause point
		}
		mu.Lock()
		paused++
		mu.Unlock()
		pause()
		mu.Lock()
		if paused < n-1 {
			early++
		}
		mu.Unlock()
	})
	if paused != n-1 || early != 0 {
		t.Errorf("paused = %d, passed early = %d; want %d and 0", paused, early, n-1)
	}
}

// TestStepClock checks experiment 18's clock: time moves only when
// nobody is at work, straight to the earliest wake-up, and sleepers due
// at one instant wake one at a time, in the order they went to sleep.
func TestStepClock(t *testing.T) {
	clk := newStepClock()
	clk.enter(0) // holds the clock while the others go to sleep
	var mu sync.Mutex
	var woke []string
	var wg sync.WaitGroup
	for id, d := range map[int]time.Duration{1: 30 * time.Millisecond, 2: 10 * time.Millisecond, 3: 10 * time.Millisecond} {
		wg.Go(func() {
			if err := clk.sleep(t.Context(), id, d); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			woke = append(woke, fmt.Sprintf("%d@%v", id, clk.now()))
			mu.Unlock()
			clk.exit(id)
		})
	}
	for !clk.asleep(1) || !clk.asleep(2) || !clk.asleep(3) {
		time.Sleep(time.Millisecond)
	}
	if clk.now() != 0 {
		t.Fatalf("the clock moved to %v while a participant was at work", clk.now())
	}
	clk.exit(0)
	wg.Wait()
	// 2 and 3 are due at once; which went to sleep first is up to the
	// scheduler, so only the instants and the last one are pinned.
	if len(woke) != 3 || !strings.HasSuffix(woke[0], "@10ms") || !strings.HasSuffix(woke[1], "@10ms") || woke[2] != "1@30ms" {
		t.Errorf("woke %v; want 2 and 3 at 10ms, then 1 at 30ms", woke)
	}
}

// lockExperiments are the experiments with a timeline, which -svg draws.
var lockExperiments = []string{
	"setnx-no-expiry", "setnx-expire", "del-after-expiry", "get-compare-del",
	"no-watchdog", "pause-fencing", "failover", "redlock-restart",
}

// TestSVGTimelines runs -svg on every lock experiment and reads each
// picture as a reader would: a time axis with its unit under every
// timeline, a legend for everything drawn, and a fixed variant that looks
// different from the broken one without reading the captions.
func TestSVGTimelines(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), append([]string{"-svg", dir}, lockExperiments...), &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	skipped := stderr.String() // failover and redlock-restart, without redis-server
	if skipped != "" && testenv.Required() {
		t.Fatalf("experiments skipped: %s", skipped)
	}
	// Drawn: what a panel must show, and must not, beyond the checks below.
	want := map[string]struct{ broken, fixed, notFixed []string }{
		"setnx-no-expiry":  {broken: []string{"refused"}},
		"setnx-expire":     {broken: []string{"refused"}},
		"del-after-expiry": {broken: []string{"overlap"}, fixed: []string{"refused"}, notFixed: []string{"overlap"}},
		"get-compare-del":  {broken: []string{"overlap"}, fixed: []string{"refused"}, notFixed: []string{"overlap"}},
		"no-watchdog":      {broken: []string{"overlap", "lapsed"}, fixed: []string{"refused"}, notFixed: []string{"overlap", "lapsed"}},
		// Both variants overlap (a frozen holder cannot know); the
		// storage's answer to A's write is what tells them apart.
		"pause-fencing":   {broken: []string{"overlap", "lapsed", "stale-write"}, fixed: []string{"fenced-off"}, notFixed: []string{"stale-write"}},
		"failover":        {broken: []string{"overlap"}, fixed: []string{"refused"}, notFixed: []string{"overlap"}},
		"redlock-restart": {broken: []string{"overlap"}, fixed: []string{"refused"}, notFixed: []string{"overlap"}},
	}
	for _, name := range lockExperiments {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(dir, name+".svg"))
			if errors.Is(err, os.ErrNotExist) && strings.Contains(skipped, name) {
				testenv.Integration(t, "redis-server") // says which variable draws it
				t.Skip(skipped)
			}
			if err != nil {
				t.Fatal(err)
			}
			pic := readSVG(t, raw)
			for _, panel := range []string{"broken", "fixed"} {
				drawn := pic.drawn[panel]
				if drawn["hold"] == 0 {
					t.Errorf("%s: no hold drawn", panel)
				}
				ticks := pic.text[panel]["tick"]
				if len(ticks) < 2 || !hasUnit(ticks) {
					t.Errorf("%s: time axis ticks %q; want two or more, with a unit (s or ms)", panel, ticks)
				}
				if c := strings.Join(pic.text[panel]["caption"], ""); !strings.HasPrefix(c, "time in s:") && !strings.HasPrefix(c, "time in ms:") {
					t.Errorf("%s: time axis caption %q; want it to say which clock, in which unit", panel, c)
				}
				// Whatever is drawn is explained, and a hold and an overlap
				// always are (no red in a fixed panel is the point).
				for class := range drawn {
					if pic.drawn["legend"]["legend-"+class] == 0 && markClasses[class] {
						t.Errorf("%s: draws %s, which the legend does not explain", panel, class)
					}
				}
			}
			for _, class := range []string{"hold", "overlap"} {
				if pic.drawn["legend"]["legend-"+class] == 0 {
					t.Errorf("the legend does not explain %s", class)
				}
			}
			w := want[name]
			for _, class := range w.broken {
				if pic.drawn["broken"][class] == 0 {
					t.Errorf("broken: no %s drawn", class)
				}
			}
			for _, class := range w.fixed {
				if pic.drawn["fixed"][class] == 0 {
					t.Errorf("fixed: no %s drawn", class)
				}
			}
			for _, class := range w.notFixed {
				if pic.drawn["fixed"][class] != 0 {
					t.Errorf("fixed: %s drawn", class)
				}
			}
			if kinds(pic.drawn["broken"]) == kinds(pic.drawn["fixed"]) {
				t.Errorf("the variants draw the same kinds of things (%s): only the captions tell them apart", kinds(pic.drawn["broken"]))
			}
		})
	}
}

// markClasses are the classes of what a timeline draws, each of which the
// legend must explain.
var markClasses = map[string]bool{
	"hold": true, "lapsed": true, "overlap": true, "note": true,
	"refused": true, "wrote": true, "stale-write": true, "fenced-off": true,
}

// kinds lists the kinds of things drawn, for comparing two panels.
func kinds(drawn map[string]int) string {
	var out []string
	for class := range drawn {
		if markClasses[class] {
			out = append(out, class)
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func hasUnit(ticks []string) bool {
	for _, tick := range ticks {
		if !strings.HasSuffix(tick, " s") && !strings.HasSuffix(tick, " ms") {
			return false
		}
	}
	return true
}

// picture is an SVG of -svg as the test reads it, by section: "broken"
// and "fixed" (the panels), "legend", and "" for the rest.
type picture struct {
	drawn map[string]map[string]int      // section -> class -> elements
	text  map[string]map[string][]string // section -> class -> the texts of elements of that class
}

// readSVG parses raw, failing t if it is not well-formed XML.
func readSVG(t *testing.T, raw []byte) picture {
	t.Helper()
	pic := picture{drawn: map[string]map[string]int{}, text: map[string]map[string][]string{}}
	for _, s := range []string{"", "broken", "fixed", "legend"} {
		pic.drawn[s] = map[string]int{}
		pic.text[s] = map[string][]string{}
	}
	var classes []string // of the open elements, innermost last
	section := func() string {
		for _, c := range classes {
			switch c {
			case "panel broken":
				return "broken"
			case "panel fixed":
				return "fixed"
			case "legend":
				return "legend"
			}
		}
		return ""
	}
	dec := xml.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return pic
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			class := ""
			for _, a := range tok.Attr {
				if a.Name.Local == "class" {
					class = a.Value
				}
			}
			classes = append(classes, class)
			if class != "" {
				pic.drawn[section()][class]++
			}
		case xml.EndElement:
			classes = classes[:len(classes)-1]
		case xml.CharData:
			if len(classes) > 0 && classes[len(classes)-1] != "" {
				s, c := section(), classes[len(classes)-1]
				pic.text[s][c] = append(pic.text[s][c], string(tok))
			}
		}
	}
}
