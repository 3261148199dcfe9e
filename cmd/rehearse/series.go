package main

import (
	"cmp"
	"slices"
	"time"
)

// Where it hurt, second by second: the run's attempts cut into bins of
// time. Answers are counted in the bin they arrived in; latency and
// lateness in the bin the request was due in, so that a stall shows where
// the requests it held were meant to go out. Percentiles are exact, from
// every attempt: a rehearsal of a million requests keeps some 100 MB.

// Timeline is the run's bins.
type Timeline struct {
	Bin  time.Duration `json:"bin"`
	Bins []Bin         `json:"bins"`
}

// A Bin is one stretch of the run, [At, At+Bin).
type Bin struct {
	At time.Duration `json:"at"`
	// Answers counts the answers that arrived in the bin, by class (see
	// class).
	Answers map[string]int `json:"answers"`
	// OK and Refused are the latencies of the presses due in the bin
	// that were answered 200, and answered anything else (no answer
	// included: it is timed until the client gave up); Joins, of the
	// waiting room's joins, whatever their answer.
	OK      Percentiles `json:"ok"`
	Refused Percentiles `json:"refused"`
	Joins   Percentiles `json:"joins"`
	// Arrivals are the users who turned up in the bin; Sent, the requests
	// that left in it.
	Arrivals int `json:"arrivals"`
	Sent     int `json:"sent"`
	// InFlight is the most requests sent and not yet answered at once.
	InFlight int `json:"in_flight"`
	// Late is how late the generator sent the requests due in the bin.
	Late Percentiles `json:"late"`
}

// Percentiles of a set of durations; N = 0: the set was empty.
type Percentiles struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50"`
	P90 time.Duration `json:"p90"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

// percentiles sorts ds and reads them off it (nearest rank).
func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(ds))+0.999999) - 1 // the nearest rank: ⌈q·n⌉
		return ds[min(max(i, 0), len(ds)-1)]
	}
	return Percentiles{N: len(ds), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: ds[len(ds)-1]}
}

// The classes of answer the charts stack, in stacking order: the buy
// button's, then the waiting room's joins, named as joins.
var classes = []string{"200", "409 not_started", "409 not_admitted", "409 sold_out", "409 already_ordered", "429 busy", "5xx", "no answer", "other",
	"join: in line", "join: refused (409)", "join: 429, 5xx or no answer", "join: other"}

// class sorts an answer into one of classes.
func class(a Attempt) string {
	switch {
	case a.Kind == "join":
		switch {
		case a.Status == 200:
			return "join: in line"
		case a.Status == 409:
			return "join: refused (409)"
		case a.unanswered() || a.Status == 429:
			return "join: 429, 5xx or no answer"
		}
		return "join: other"
	case a.Status == 200:
		return "200"
	case a.Status == 0:
		return "no answer"
	case a.Status >= 500:
		return "5xx"
	case a.Status == 429:
		return "429 busy"
	case a.Status == 409:
		for _, c := range classes {
			if c == "409 "+a.Code {
				return c
			}
		}
	}
	return "other"
}

// autoBin picks a bin width for a run that lasted span: a second, as load
// tools have it, for a long run; finer for a short one, where the start
// and the sell-out are a few hundred milliseconds apart.
func autoBin(span time.Duration) time.Duration {
	switch {
	case span >= 60*time.Second:
		return time.Second
	case span >= 20*time.Second:
		return 250 * time.Millisecond
	}
	return 100 * time.Millisecond
}

// timeline cuts r into bins of width bin (0: autoBin).
func timeline(r *Run, bin time.Duration) Timeline {
	if len(r.Attempts) == 0 {
		return Timeline{Bin: max(bin, time.Second)}
	}
	first, last := r.Attempts[0].Due, r.Attempts[0].Done
	for _, a := range r.Attempts {
		first, last = min(first, a.Due), max(last, a.Done)
	}
	for _, u := range r.Users {
		first = min(first, u.Arrive)
	}
	if bin <= 0 {
		bin = autoBin(last - first)
	}
	// Bins line up on the start: one begins at 0, whatever came before.
	start := floorTo(first, bin)
	n := int((last-start)/bin) + 1
	t := Timeline{Bin: bin, Bins: make([]Bin, n)}
	idx := func(d time.Duration) int { return min(max(int((d-start)/bin), 0), n-1) }
	ok, refused, joins, late := make([][]time.Duration, n), make([][]time.Duration, n), make([][]time.Duration, n), make([][]time.Duration, n)
	type edge struct {
		at    time.Duration
		delta int
	}
	var edges []edge
	for i := range t.Bins {
		t.Bins[i].At = start + time.Duration(i)*bin
		t.Bins[i].Answers = map[string]int{}
	}
	for _, u := range r.Users {
		t.Bins[idx(u.Arrive)].Arrivals++
	}
	for _, a := range r.Attempts {
		t.Bins[idx(a.Done)].Answers[class(a)]++
		t.Bins[idx(a.Sent)].Sent++
		d := idx(a.Due)
		switch {
		case a.Kind == "join":
			joins[d] = append(joins[d], a.latency())
		case a.sold():
			ok[d] = append(ok[d], a.latency())
		default:
			refused[d] = append(refused[d], a.latency())
		}
		late[d] = append(late[d], a.lateness())
		edges = append(edges, edge{a.Sent, +1}, edge{a.Done, -1})
	}
	for i := range t.Bins {
		t.Bins[i].OK, t.Bins[i].Refused, t.Bins[i].Joins, t.Bins[i].Late = percentiles(ok[i]), percentiles(refused[i]), percentiles(joins[i]), percentiles(late[i])
	}
	// Requests in flight: a sweep over every send (+1) and answer (−1),
	// answers first where they tie, keeping each bin's peak. A bin in
	// which nothing happened still holds what the bins before left.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	level, j := 0, 0
	for i := range t.Bins {
		end := t.Bins[i].At + bin
		peak := level
		for ; j < len(edges) && edges[j].at < end; j++ {
			level += edges[j].delta
			peak = max(peak, level)
		}
		t.Bins[i].InFlight = peak
	}
	return t
}

// floorTo rounds d down to a multiple of step (towards minus infinity).
func floorTo(d, step time.Duration) time.Duration {
	q := d / step * step
	if q > d {
		q -= step
	}
	return q
}
