package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestMain fails the package if an experiment leaves a goroutine behind
// (a lock's watchdog, a waiter's subscription, a clock).
func TestMain(m *testing.M) { testenv.Main(m) }

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
				if errors.Is(err, errNoRedisServer) && os.Getenv("SECKILL_REQUIRE_INTEGRATION") != "1" {
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
			}
		})
	}
}

func TestRunList(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-list"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != len(experiments) {
		t.Fatalf("-list printed %d lines for %d experiments:\n%s", len(lines), len(experiments), stdout.String())
	}
	for i, e := range experiments {
		if f := strings.Fields(lines[i]); len(f) < 2 || f[1] != e.name {
			t.Errorf("line %d = %q, want experiment %s", i+1, lines[i], e.name)
		}
	}
}

// TestRunJSON runs two experiments by name, given out of order, and reads
// the JSON a script would read.
func TestRunJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-json", "del-after-expiry", "oversell"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Name, Lesson  string
		Broken, Fixed map[string]any
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in:\n%s", err, stdout.String())
	}
	if len(got) != 2 || got[0].Name != "oversell" || got[1].Name != "del-after-expiry" {
		t.Fatalf("got %+v, want oversell then del-after-expiry, in the lab's order", got)
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

// -svg writes, for each lock experiment with a timeline, one well-formed
// SVG whose red overlap marks are the broken variant's and only those: the
// fixed variant's timeline has no two holders at once.
func TestSVGTimelines(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	names := []string{"del-after-expiry", "get-compare-del", "failover", "redlock-restart"}
	if err := run(t.Context(), append([]string{"-svg", dir}, names...), &stdout, &stderr); err != nil {
		if strings.Contains(stderr.String(), errNoRedisServer.Error()) && os.Getenv("SECKILL_REQUIRE_INTEGRATION") != "1" {
			t.Skip(stderr.String())
		}
		t.Fatal(err)
	}
	for _, name := range names {
		raw, err := os.ReadFile(filepath.Join(dir, name+".svg"))
		if err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(bytes.NewReader(raw))
		overlaps, holds := 0, 0
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s.svg is not well-formed XML: %v", name, err)
			}
			if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "rect" {
				for _, a := range el.Attr {
					switch {
					case a.Name.Local == "class" && a.Value == "overlap":
						overlaps++
					case a.Name.Local == "class" && a.Value == "hold":
						holds++
					}
				}
			}
		}
		if overlaps == 0 || holds < 3 {
			t.Errorf("%s.svg: %d overlap marks and %d holds; want the broken variant's overlap drawn", name, overlaps, holds)
		}
	}
	for _, e := range experiments {
		for _, name := range names {
			if e.name != name {
				continue
			}
			r, err := runExperiment(t.Context(), e)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Broken.timeline.overlaps()) == 0 || len(r.Fixed.timeline.overlaps()) != 0 {
				t.Errorf("%s: overlaps broken %v, fixed %v; want some, then none", name, r.Broken.timeline.overlaps(), r.Fixed.timeline.overlaps())
			}
		}
	}
}
