package main

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Fairness asks whether the people who pressed first won. Each user's
// click is the intended send time of their first press at or after the
// sale opened (or of an earlier one the server sold on: see click): the
// moment they meant to buy, on the generator's one
// clock, untouched by how long the server took to hear them. A sale that
// is first come, first served gives the stock to the first clickers; a
// lottery gives it to anyone. The figures below say which this sale was,
// and who got ahead when it was not.
//
// With a waiting room a user presses when the room admits them, so the
// press says nothing of when they came: their click is when they joined
// the line. The room draws lots among those who joined before the start
// (docs/api.md, "The draw") and serves the rest in order: the figures of
// such a sale should look like a lottery for the early and a line after.
type Fairness struct {
	Clickers int           `json:"clickers"` // users who pressed in the sale (see click)
	Winners  int           `json:"winners"`
	Delta    time.Duration `json:"delta"` // clicks closer than this are ties (-delta; 0: only equal clicks)
	// Precision is, of the first FirstS clickers (FirstS = the stock, or
	// fewer where fewer clicked), the share who won: 1 first come first
	// served, about stock/clickers a lottery.
	FirstS    int     `json:"first_s"`
	Precision float64 `json:"precision_at_stock"`
	// AUC is the chance that a winner, drawn at random, clicked before a
	// loser drawn at random (ties count a half): 1 first come first
	// served, 0.5 a lottery, 0 last come first served.
	AUC       float64    `json:"auc"`
	Deciles   []Group    `json:"deciles"` // win rate by tenth of the clickers, earliest first
	Groups    []Group    `json:"groups"`  // people and bots; among people, who honoured Retry-After and who did not
	Overtakes []Overtake `json:"overtakes"`
}

// A Group is some of the clickers and how they fared.
type Group struct {
	Name  string        `json:"name"`
	From  time.Duration `json:"from,omitempty"` // for a decile: its first click
	To    time.Duration `json:"to,omitempty"`   // and its last
	Users int           `json:"users"`
	Won   int           `json:"won"`
	Rate  float64       `json:"win_rate"`
}

// An Overtake is a winner who clicked more than Delta after some loser:
// the worst of them are listed with both users' attempts.
type Overtake struct {
	Winner        string        `json:"winner"`
	WinnerKind    string        `json:"winner_kind"`
	Click         time.Duration `json:"click"`
	EarlierLosers int           `json:"earlier_losers"` // losers who clicked more than Delta before
	Loser         string        `json:"first_loser"`    // the earliest of them
	LoserClick    time.Duration `json:"first_loser_click"`
	WinnerTries   string        `json:"winner_tries"`
	LoserTries    string        `json:"loser_tries"`
}

// maxOvertakes is how many overtakes the report lists.
const maxOvertakes = 10

// A clicker is one user who pressed after the start.
type clicker struct {
	user  int
	click time.Duration
	won   bool
}

// fairness computes the figures over r, clicks closer than delta
// counting as ties. delta is the reader's choice (-delta), 0 by default:
// a click is a time the generator planned on its one clock, with no
// measurement in it, so two clicks are in the order they were planned.
// It is not taken from the server's latency: a tie window as wide as the
// round trip would make a slow server look like a lottery and a fast one
// like a line, whatever it did.
func fairness(r *Run, delta time.Duration) Fairness {
	delta = max(delta, 0)
	wins := winsByUser(r)
	var cs []clicker
	for u := range r.Users {
		if at, ok := click(r, u); ok {
			cs = append(cs, clicker{u, at, len(wins[u]) > 0})
		}
	}
	// Order by click, then by user: equal clicks stay in a fixed order,
	// so that the same log gives the same figures.
	slices.SortFunc(cs, func(a, b clicker) int {
		return cmp.Or(cmp.Compare(a.click, b.click), cmp.Compare(a.user, b.user))
	})
	f := Fairness{Clickers: len(cs), Delta: delta}
	var winners, losers []time.Duration
	for _, c := range cs {
		if c.won {
			winners = append(winners, c.click)
		} else {
			losers = append(losers, c.click)
		}
	}
	f.Winners = len(winners)

	f.FirstS = min(int(r.Voucher.Stock), len(cs))
	if f.FirstS > 0 {
		won := 0
		for _, c := range cs[:f.FirstS] {
			if c.won {
				won++
			}
		}
		f.Precision = float64(won) / float64(f.FirstS)
	}

	// Mann–Whitney's U over W·L, with ties within delta: for each winner,
	// the losers who clicked more than delta later count 1, those within
	// delta a half. losers is sorted, so each winner costs two searches.
	if len(winners) > 0 && len(losers) > 0 {
		var u float64
		for _, w := range winners {
			lo := sort.Search(len(losers), func(i int) bool { return losers[i] >= w-delta })
			hi := sort.Search(len(losers), func(i int) bool { return losers[i] > w+delta })
			u += float64(len(losers)-hi) + float64(hi-lo)/2
		}
		f.AUC = u / float64(len(winners)*len(losers))
	}

	for d := range min(10, len(cs)) {
		part := cs[d*len(cs)/min(10, len(cs)) : (d+1)*len(cs)/min(10, len(cs))]
		g := group(fmt.Sprintf("decile %d", d+1), part)
		g.From, g.To = part[0].click, part[len(part)-1].click
		f.Deciles = append(f.Deciles, g)
	}

	pick := func(name string, keep func(User) bool) {
		var part []clicker
		for _, c := range cs {
			if keep(r.Users[c.user]) {
				part = append(part, c)
			}
		}
		if len(part) > 0 {
			f.Groups = append(f.Groups, group(name, part))
		}
	}
	pick("people", func(u User) bool { return u.Kind == person })
	pick("bots", func(u User) bool { return u.Kind == bot })
	pick("people who honour Retry-After", func(u User) bool { return u.Kind == person && u.Honours })
	pick("people who ignore Retry-After", func(u User) bool { return u.Kind == person && !u.Honours })

	// The overtakes: each winner against the losers who clicked more than
	// delta before them, worst (longest overtaken wait) first.
	if first := slices.IndexFunc(cs, func(c clicker) bool { return !c.won }); first >= 0 {
		loser := cs[first]
		for _, c := range cs {
			// The losers who clicked more than delta before c.
			n := sort.Search(len(losers), func(i int) bool { return losers[i] >= c.click-delta })
			if !c.won || n == 0 {
				continue
			}
			f.Overtakes = append(f.Overtakes, Overtake{
				Winner: r.Users[c.user].ID, WinnerKind: r.Users[c.user].Kind, Click: c.click,
				EarlierLosers: n, Loser: r.Users[loser.user].ID, LoserClick: loser.click,
				WinnerTries: tries(r, c.user), LoserTries: tries(r, loser.user),
			})
		}
	}
	slices.SortStableFunc(f.Overtakes, func(a, b Overtake) int {
		return cmp.Or(cmp.Compare(b.Click-b.LoserClick, a.Click-a.LoserClick), cmp.Compare(b.EarlierLosers, a.EarlierLosers))
	})
	if len(f.Overtakes) > maxOvertakes {
		f.Overtakes = f.Overtakes[:maxOvertakes]
	}
	return f
}

func group(name string, cs []clicker) Group {
	g := Group{Name: name, Users: len(cs)}
	for _, c := range cs {
		if c.won {
			g.Won++
		}
	}
	if g.Users > 0 {
		g.Rate = float64(g.Won) / float64(g.Users)
	}
	return g
}

// tries writes a user's attempts short: "not_started@-1.20s busy@0.05s(RA 1s) ok@1.10s".
func tries(r *Run, u int) string {
	var parts []string
	for _, a := range attemptsOf(r, u) {
		p := a.Code + "@" + secs(a.Due)
		if a.RetryAfter > 0 {
			p += "(Retry-After " + a.RetryAfter.String() + ")"
		}
		parts = append(parts, p)
	}
	if len(parts) > 12 {
		parts = append(parts[:5], fmt.Sprintf("... %d more ...", len(parts)-10), strings.Join(parts[len(parts)-5:], " "))
	}
	return strings.Join(parts, " ")
}

// click is when user u clicked, and false if they never did. With a
// waiting room it is their first join. Without one it is the due time of
// their first press that counted in the sale: the first due at or after
// the start, or an earlier one that the server took into the sale all the
// same (answered 200, sold_out or already_ordered: it reached the server
// after begin_time, a bot's poll due a few milliseconds before it, say).
// A winner always clicked: their 200 counts, whenever it was due.
func click(r *Run, u int) (time.Duration, bool) {
	for _, a := range attemptsOf(r, u) {
		switch {
		case r.Voucher.Room:
			if a.Kind == "join" {
				return a.Due, true
			}
		case a.Kind != "":
		case a.Due >= 0 || inSale(a.Code):
			return a.Due, true
		}
	}
	return 0, false
}

// inSale reports whether an answer of the buy button says the sale was
// open when the press reached the server.
func inSale(code string) bool {
	return code == codeOK || code == "sold_out" || code == "already_ordered"
}

// secs writes a time of the run as seconds from the start: "-1.20s".
func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// ms writes a duration in milliseconds: "12.3 ms".
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
