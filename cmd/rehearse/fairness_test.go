package main

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// line makes a run from a pattern of winners (W) and losers (L) in the
// order they clicked, 100 ms apart: "WWLL" is a perfect line of two
// units. Every user presses once; the stock is the number of winners.
func line(pattern string) *Run {
	r := &Run{}
	for i, c := range pattern {
		r.Users = append(r.Users, User{ID: fmt.Sprint(i + 1), Kind: person, Honours: true})
		a := Attempt{User: i, Due: time.Duration(i) * 100 * time.Millisecond, Status: 409, Code: "sold_out"}
		a.Sent, a.Done = a.Due, a.Due+5*time.Millisecond
		if c == 'W' {
			a.Status, a.Code, a.Order = 200, codeOK, fmt.Sprint(1000+i)
			r.Voucher.Stock++
		}
		r.Attempts = append(r.Attempts, a)
	}
	return r
}

func TestFairnessKnownAnswers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pattern   string
		precision float64
		auc       float64
		overtakes int
		deciles   []float64 // win rate of each tenth
	}{
		{"a perfect line", "WWLLLLLLLL", 1, 1, 0, []float64{1, 1, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"a reversed line", "LLLLLLLLWW", 0, 0, 2, []float64{0, 0, 0, 0, 0, 0, 0, 0, 1, 1}},
		// W L L W: the first winner is ahead of both losers, the second
		// behind both: 2 pairs of 4 in order, as a fair coin would have it.
		{"a lottery", "WLLW", 0.5, 0.5, 1, []float64{1, 0, 0, 1}},
		{"one out of turn", "WLWLLLLLLL", 0.5, 15.0 / 16, 1, []float64{1, 0, 1, 0, 0, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fairness(line(tc.pattern), time.Millisecond)
			if f.Precision != tc.precision {
				t.Errorf("precision@stock %g, want %g", f.Precision, tc.precision)
			}
			if math.Abs(f.AUC-tc.auc) > 1e-9 {
				t.Errorf("AUC %g, want %g", f.AUC, tc.auc)
			}
			if len(f.Overtakes) != tc.overtakes {
				t.Errorf("%d overtakes, want %d: %+v", len(f.Overtakes), tc.overtakes, f.Overtakes)
			}
			if len(f.Deciles) != len(tc.deciles) {
				t.Fatalf("%d deciles, want %d", len(f.Deciles), len(tc.deciles))
			}
			for i, d := range f.Deciles {
				if d.Rate != tc.deciles[i] {
					t.Errorf("decile %d: win rate %g, want %g", i+1, d.Rate, tc.deciles[i])
				}
			}
		})
	}
}

// TestFairnessOfALargeLottery: 200 winners drawn at random among 2,000
// clickers. AUC is near 0.5, precision near 200/2000, every decile near
// a tenth.
func TestFairnessOfALargeLottery(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pattern := []byte{}
	for range 2000 {
		pattern = append(pattern, 'L')
	}
	for _, i := range rng.Perm(2000)[:200] {
		pattern[i] = 'W'
	}
	f := fairness(line(string(pattern)), time.Millisecond)
	if math.Abs(f.AUC-0.5) > 0.05 {
		t.Errorf("AUC %g, want about 0.5", f.AUC)
	}
	if math.Abs(f.Precision-0.1) > 0.05 {
		t.Errorf("precision@stock %g, want about 0.1", f.Precision)
	}
	for _, d := range f.Deciles {
		if math.Abs(d.Rate-0.1) > 0.06 {
			t.Errorf("%s: win rate %g, want about 0.1", d.Name, d.Rate)
		}
	}
}

// TestFairnessTies: clicks within delta of each other are ties, worth a
// half: a winner 50 ms after a loser is no overtake at a delta of 100 ms.
func TestFairnessTies(t *testing.T) {
	r := line("LW")
	r.Attempts[1].Due, r.Attempts[1].Sent = 50*time.Millisecond, 50*time.Millisecond
	if f := fairness(r, 100*time.Millisecond); f.AUC != 0.5 || len(f.Overtakes) != 0 {
		t.Errorf("delta 100ms: AUC %g, %d overtakes; want 0.5, 0", f.AUC, len(f.Overtakes))
	}
	if f := fairness(r, time.Millisecond); f.AUC != 0 || len(f.Overtakes) != 1 {
		t.Errorf("delta 1ms: AUC %g, %d overtakes; want 0, 1", f.AUC, len(f.Overtakes))
	}
}

// TestFairnessGroups: bots and people, honourers and not, each with its
// own win rate; a press before the start is not a click.
func TestFairnessGroups(t *testing.T) {
	r := line("WWLL")
	r.Users[0].Kind, r.Users[1].Honours = bot, false
	r.Attempts = append(r.Attempts, Attempt{User: 3, Due: -time.Second, Sent: -time.Second, Done: -time.Second + 1, Status: 409, Code: "not_started"})
	f := fairness(r, time.Millisecond)
	want := map[string][2]int{"people": {3, 1}, "bots": {1, 1}, "people who honour Retry-After": {2, 0}, "people who ignore Retry-After": {1, 1}}
	for _, g := range f.Groups {
		if w := want[g.Name]; g.Users != w[0] || g.Won != w[1] {
			t.Errorf("%s: %d clicked, %d won; want %d, %d", g.Name, g.Users, g.Won, w[0], w[1])
		}
		delete(want, g.Name)
	}
	if len(want) > 0 {
		t.Errorf("groups missing: %v", want)
	}
	if f.Clickers != 4 {
		t.Errorf("%d clickers, want 4 (the press before the start is not a click)", f.Clickers)
	}
}

// TestFairnessDefaultTiesNotTheServersSpeed: a reversed line on a slow
// server (every answer a second after its click, the clicks 100 ms
// apart) is a reversed line at the default -delta: the tie window is not
// the server's latency, which would call it a lottery.
func TestFairnessDefaultTiesNotTheServersSpeed(t *testing.T) {
	r := line("LLLLLLLLWW")
	for i := range r.Attempts {
		r.Attempts[i].Done = r.Attempts[i].Due + time.Second
	}
	f := fairness(r, 0)
	if f.AUC != 0 || f.Delta != 0 || len(f.Overtakes) != 2 {
		t.Errorf("default delta: AUC %g, delta %s, %d overtakes; want 0, 0, 2", f.AUC, f.Delta, len(f.Overtakes))
	}
	c, err := parse([]string{"-admin-token", "x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.delta != 0 {
		t.Errorf("-delta defaults to %s, want 0", c.delta)
	}
}

// TestFairnessCountsWinnersDueBeforeTheStart: a bot's poll due 5 ms
// before the start reaches the server after it and wins; another, due
// before the start, is told sold_out. Both clicked, at their due time:
// neither is dropped from the figures.
func TestFairnessCountsWinnersDueBeforeTheStart(t *testing.T) {
	r := line("WLL")
	r.Users[0].Kind, r.Users[1].Kind = bot, bot
	for u, due := range []time.Duration{-5 * time.Millisecond, -2 * time.Millisecond} {
		a := &r.Attempts[u]
		a.Due, a.Sent, a.Done = due, due, due+20*time.Millisecond
	}
	f := fairness(r, 0)
	if f.Clickers != 3 || f.Winners != 1 {
		t.Fatalf("%d clickers, %d winners; want 3, 1", f.Clickers, f.Winners)
	}
	if f.Precision != 1 || f.AUC != 1 {
		t.Errorf("precision %g, AUC %g; want 1, 1 (the winner clicked first)", f.Precision, f.AUC)
	}
	if g := f.Groups[1]; g.Name != "bots" || g.Users != 2 || g.Won != 1 {
		t.Errorf("bots: %+v, want 2 clicked, 1 won", g)
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i)*time.Millisecond)
	}
	p := percentiles(ds)
	if p.N != 100 || p.P50 != 50*time.Millisecond || p.P90 != 90*time.Millisecond || p.P99 != 99*time.Millisecond || p.Max != 100*time.Millisecond {
		t.Errorf("percentiles of 1..100 ms: %+v", p)
	}
}

// TestTimelineInFlight: two requests overlapping for 100 ms and a third
// alone; the peak per bin follows.
func TestTimelineInFlight(t *testing.T) {
	r := &Run{Users: []User{{}, {}}, Attempts: []Attempt{
		{User: 0, Due: 0, Sent: 0, Done: 250 * time.Millisecond, Status: 200},
		{User: 1, Due: 150 * time.Millisecond, Sent: 150 * time.Millisecond, Done: 350 * time.Millisecond, Status: 409, Code: "sold_out"},
		{User: 1, Due: 550 * time.Millisecond, Sent: 550 * time.Millisecond, Done: 560 * time.Millisecond, Status: 409, Code: "sold_out"},
	}}
	tl := timeline(r, 100*time.Millisecond)
	want := []int{1, 2, 2, 1, 0, 1}
	for i, w := range want {
		if got := tl.Bins[i].InFlight; got != w {
			t.Errorf("bin %d: %d in flight, want %d", i, got, w)
		}
	}
}
