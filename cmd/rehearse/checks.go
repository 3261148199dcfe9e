package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The checks hold the sale to its invariants (docs/api.md, "What the
// answers promise"), each against the server's own answers rather than
// the generator's hopes: a 200 is only a sale once GET /orders/{id} shows
// the order, and the stock is what GET /vouchers/{id} and the live
// figures say is left.

// A Check is one invariant, as the verdict strip shows it.
type Check struct {
	Name    string   `json:"name"`
	Verdict string   `json:"verdict"` // pass, fail, or unknown (the server did not say)
	Figures string   `json:"figures"` // the numbers the verdict rests on
	Cases   []string `json:"cases,omitempty"`
}

// Verdicts.
const (
	pass    = "pass"
	fail    = "fail"
	unknown = "unknown"
)

// maxCases bounds the examples a failed check lists.
const maxCases = 10

func verdict(ok bool) string {
	if ok {
		return pass
	}
	return fail
}

// check runs every invariant over r.
func check(r *Run) []Check {
	wins := winsByUser(r)
	seen := map[string]OrderSeen{}
	for _, o := range r.After.Orders {
		seen[o.ID] = o
	}
	orderIDs := map[string]bool{}
	for _, a := range r.Attempts {
		if a.sold() {
			orderIDs[a.Order] = true
		}
	}

	// Users who had a request unanswered (no answer, or a 5xx) and no
	// 200: each may hold an order nobody was told of.
	unanswered := 0
	for u := range r.Users {
		if len(wins[u]) > 0 {
			continue
		}
		if slices.ContainsFunc(attemptsOf(r, u), func(a Attempt) bool { return a.Kind == "" && a.unanswered() }) {
			unanswered++
		}
	}

	// Every 200 an order: its order exists, is its buyer's and of this
	// voucher, and did not end failed (an async order MySQL refused for
	// good: its 200 promised an order that never was). An order the
	// server gave no final word on (it kept answering 429, 5xx or
	// nothing, or the order was still pending when -drain ran out) is
	// unknown, not a broken promise.
	every := Check{Name: "every 200 an order"}
	confirmed := map[string]bool{} // the orders that stand
	unsure := 0
	var doubts []string
	failed := 0
	for _, id := range slices.Sorted(maps.Keys(orderIDs)) {
		o, ok := seen[id]
		switch {
		case !ok:
			unsure++
			doubts = append(doubts, fmt.Sprintf("order %s: not looked up", id))
		case o.Status == 404:
			every.Cases = append(every.Cases, fmt.Sprintf("order %s of user %s: GET /orders answered 404, no such order", id, r.Users[o.User].ID))
		case o.Status != 200:
			unsure++
			doubts = append(doubts, fmt.Sprintf("order %s of user %s: no answer but %s after every retry", id, r.Users[o.User].ID, orderErr(o)))
		case o.Owner != r.Users[o.User].ID:
			every.Cases = append(every.Cases, fmt.Sprintf("order %s was answered to user %s but belongs to user %s", id, r.Users[o.User].ID, o.Owner))
		case o.Voucher != r.Voucher.ID:
			every.Cases = append(every.Cases, fmt.Sprintf("order %s is of voucher %s, not %s", id, o.Voucher, r.Voucher.ID))
		case o.State == "failed":
			failed++
			every.Cases = append(every.Cases, fmt.Sprintf("order %s of user %s ended failed: MySQL refused the order its 200 promised", id, r.Users[o.User].ID))
		case !finalStates[o.State]:
			unsure++
			doubts = append(doubts, fmt.Sprintf("order %s of user %s: still %s when -drain ran out", id, r.Users[o.User].ID, o.State))
		default:
			confirmed[id] = true
		}
	}
	every.Verdict = verdictOf(len(every.Cases), unsure)
	every.Figures = fmt.Sprintf("%d of %d orders answered 200 found, final and standing; %d failed; %d unknown", len(confirmed), len(orderIDs), failed, unsure)
	every.Cases = append(every.Cases, unknownCases(doubts)...)

	// One order per user: no user was given two orders, nor two users
	// one (by the server's user IDs, which merged runs share). Most users
	// stop at their first 200, so that a server without the guard would
	// rarely show it: -again of the people press once more at once, while
	// there is stock left to sell them, and each winner presses again
	// after the sale (after.go). The server must refuse every one.
	one := Check{Name: "one order per user"}
	byID := map[string][]string{}
	for u, ids := range wins {
		byID[r.Users[u].ID] = append(byID[r.Users[u].ID], ids...)
	}
	for id, orders := range byID {
		if slices.Sort(orders); len(slices.Compact(orders)) > 1 {
			one.Cases = append(one.Cases, fmt.Sprintf("user %s was given orders %s", id, strings.Join(slices.Compact(orders), ", ")))
		}
	}
	owners := map[string][]string{} // order -> users answered 200 with it
	for u, ids := range wins {
		for _, id := range ids {
			if !slices.Contains(owners[id], r.Users[u].ID) {
				owners[id] = append(owners[id], r.Users[u].ID)
			}
		}
	}
	for id, us := range owners {
		if len(us) > 1 {
			one.Cases = append(one.Cases, fmt.Sprintf("order %s was answered to users %s", id, strings.Join(us, ", ")))
		}
	}
	seconds, refusedAgain := 0, 0
	doubts = nil
	for _, p := range r.After.Probes {
		switch {
		case p.Status == 200:
			seconds++
			one.Cases = append(one.Cases, fmt.Sprintf("user %s pressed again after the sale and was given a second order, %s", r.Users[p.User].ID, p.Order))
		case p.Code == "already_ordered" || p.Code == "sold_out":
			refusedAgain++
		default:
			doubts = append(doubts, fmt.Sprintf("user %s pressed again after the sale: %s", r.Users[p.User].ID, probeAnswer(p)))
		}
	}
	one.Verdict = verdictOf(len(one.Cases), len(doubts))
	one.Figures = fmt.Sprintf("%d users won, %d orders; pressed again after the sale, %d were refused (already_ordered or sold_out), %d given a second order, %d not answered for certain",
		len(byID), len(orderIDs), refusedAgain, seconds, len(doubts))
	one.Cases = append(one.Cases, unknownCases(doubts)...)

	// The orders the crowd was told of and that stand: the 200s found,
	// and any second order a probe was given.
	told := int64(len(confirmed) + seconds)

	// No oversell: never more orders than the stock.
	over := Check{Name: "no oversell"}
	serverOrders, ok := serverOrders(r)
	over.Verdict = verdict(told <= r.Voucher.Stock && (!ok || serverOrders <= r.Voucher.Stock))
	over.Figures = fmt.Sprintf("%d orders found of a stock of %d", told, r.Voucher.Stock)
	if ok {
		over.Figures += fmt.Sprintf("; the server counts %d", serverOrders)
	}

	// Stock + orders = initial, as the server counts both: the live
	// figures read them in one statement. Without them, GET /vouchers'
	// stock says how many units went, and the orders found must account
	// for them: no fewer than the standing orders found, and no more
	// than those plus the orders the server did not settle and the users
	// whose request went unanswered (each may have bought, unseen).
	sum := Check{Name: "stock + orders = initial"}
	switch {
	case r.After.Live != nil:
		l := r.After.Live
		sum.Verdict = verdict(l.Holds && l.MySQLLeft+l.Orders == l.Initial && l.Initial == r.Voucher.Stock &&
			(r.After.StockErr != "" || r.After.Stock == l.MySQLLeft))
		sum.Figures = fmt.Sprintf("MySQL: %d left + %d orders = %d, initial %d; Redis sells %d", l.MySQLLeft, l.Orders, l.MySQLLeft+l.Orders, r.Voucher.Stock, r.After.Stock)
		if l.Queue != nil && *l.Queue > 0 {
			sum.Cases = append(sum.Cases, fmt.Sprintf("async queue not drained: %d orders not yet in MySQL", *l.Queue))
		}
	case r.After.StockErr != "":
		sum.Verdict, sum.Figures = unknown, "the voucher could not be read: "+r.After.StockErr
	case r.Shared:
		sum.Verdict, sum.Figures = unknown, "a shared voucher without live figures: merge every generator's run (-merge) to check it"
	default:
		gone := r.Voucher.Stock - r.After.Stock
		lo, hi := told, told+int64(unsure+unanswered)
		sum.Verdict = verdict(lo <= gone && gone <= hi)
		sum.Figures = fmt.Sprintf("%d of %d units gone, %d left (GET /vouchers); the orders account for %d to %d: %d found, %d not settled, %d users unanswered who may have bought (no live figures: %s)",
			gone, r.Voucher.Stock, r.After.Stock, lo, hi, told, unsure, unanswered, r.After.LiveErr)
	}

	// No 200 before begin_time: by the generator's clock (the answer came
	// before the sale opened) and by the server's (the order's created_at).
	early := Check{Name: "no 200 before begin_time"}
	n := 0
	for _, a := range r.Attempts {
		if a.sold() && a.Done < 0 {
			n++
			early.Cases = append(early.Cases, fmt.Sprintf("user %s answered 200 at %s", r.Users[a.User].ID, ms(a.Done)))
		}
	}
	for _, o := range r.After.Orders {
		if o.Status == 200 && o.Created.Before(r.Voucher.Begin) {
			n++
			early.Cases = append(early.Cases, fmt.Sprintf("order %s created at %s, before %s", o.ID, o.Created.Format("15:04:05.000"), r.Voucher.Begin.Format("15:04:05")))
		}
	}
	early.Verdict = verdict(n == 0)
	early.Figures = fmt.Sprintf("%d presses answered before the start, %d of them 200; %d orders created before it",
		countIf(r.Attempts, func(a Attempt) bool { return a.Done < 0 && a.Kind == "" }),
		countIf(r.Attempts, func(a Attempt) bool { return a.Done < 0 && a.sold() }),
		countIfOrders(r.After.Orders, func(o OrderSeen) bool { return o.Status == 200 && o.Created.Before(r.Voucher.Begin) }))

	// No order after a refusal. A user's own answers can betray one: told
	// already_ordered, with no 200 before it and nothing unanswered that
	// might have taken a unit. And the server's count can: orders it holds
	// beyond the 200s found are orders nobody was told of, which only
	// unanswered requests (timeouts, 5xx) may explain.
	refused := Check{Name: "no order after a refusal"}
	for u := range r.Users {
		if len(wins[u]) > 0 {
			continue // already_ordered after a 200 is the truth
		}
		open := false
		for _, a := range attemptsOf(r, u) {
			if a.unanswered() {
				open = true
			}
			if a.Code == "already_ordered" && !open {
				refused.Cases = append(refused.Cases, fmt.Sprintf("user %s was told already_ordered at %s, never told 200 and never left unanswered", r.Users[u].ID, ms(a.Done)))
				break
			}
		}
	}
	refused.Figures = fmt.Sprintf("%d users refused or unanswered hold no order they were not told of", len(r.Users)-len(wins))
	if ok && !r.Shared {
		extra := serverOrders - told - int64(unsure)
		refused.Figures = fmt.Sprintf("server orders %d, orders told of %d, not settled %d: %d unexplained, %d users left unanswered", serverOrders, told, unsure, max(extra, 0), unanswered)
		if extra > int64(unanswered) {
			refused.Cases = append(refused.Cases, fmt.Sprintf("the server holds %d orders that no 200 announced, and only %d users had an unanswered request", extra, unanswered))
		}
	}
	refused.Verdict = verdict(len(refused.Cases) == 0)

	checks := []Check{sum, over, one, every, early, refused}
	for i := range checks {
		if len(checks[i].Cases) > maxCases {
			more := len(checks[i].Cases) - maxCases
			checks[i].Cases = append(checks[i].Cases[:maxCases], fmt.Sprintf("... and %d more", more))
		}
	}
	return checks
}

// verdictOf is fail where a promise was broken, else unknown where the
// server left something unsaid, else pass.
func verdictOf(broken, unsaid int) string {
	switch {
	case broken > 0:
		return fail
	case unsaid > 0:
		return unknown
	}
	return pass
}

// unknownCases marks cases that are doubts, not failures.
func unknownCases(doubts []string) []string {
	out := make([]string, len(doubts))
	for i, d := range doubts {
		out[i] = "unknown: " + d
	}
	return out
}

// orderErr says what GET /orders answered when it was not the order.
func orderErr(o OrderSeen) string {
	if o.Status == 0 {
		return "no answer (" + o.Err + ")"
	}
	return fmt.Sprintf("HTTP %d %s", o.Status, o.Err)
}

// probeAnswer says what a probe was answered.
func probeAnswer(p Probe) string {
	if p.Status == 0 {
		return "no answer (" + p.Code + ")"
	}
	return fmt.Sprintf("HTTP %d %s", p.Status, p.Code)
}

// serverOrders is the server's own count of the voucher's orders: the
// live figures', else the stock that left (initial − what it still
// sells). ok is false where neither was read, or where another
// generator's buyers share the voucher.
func serverOrders(r *Run) (n int64, ok bool) {
	switch {
	case r.Shared:
		return 0, false
	case r.After.Live != nil:
		return r.After.Live.Orders, true
	case r.After.StockErr == "":
		return r.Voucher.Stock - r.After.Stock, true
	}
	return 0, false
}

// winsByUser returns each winning user's order IDs, from their 200s.
func winsByUser(r *Run) map[int][]string {
	out := map[int][]string{}
	for _, a := range r.Attempts {
		if a.sold() {
			out[a.User] = append(out[a.User], a.Order)
		}
	}
	return out
}

// attemptsOf returns user u's attempts in the order they were sent. A
// user sends one at a time (a bot with -bot-conns > 1 several), and the
// log is kept in order of answers, so this is a filter and a sort.
func attemptsOf(r *Run, u int) []Attempt {
	if r.byUser == nil {
		r.byUser = make([][]Attempt, len(r.Users))
		for _, a := range r.Attempts {
			r.byUser[a.User] = append(r.byUser[a.User], a)
		}
		for _, as := range r.byUser {
			slices.SortStableFunc(as, func(a, b Attempt) int { return cmp.Compare(a.Sent, b.Sent) })
		}
	}
	return r.byUser[u]
}

func countIf(as []Attempt, f func(Attempt) bool) int {
	n := 0
	for _, a := range as {
		if f(a) {
			n++
		}
	}
	return n
}

func countIfOrders(os []OrderSeen, f func(OrderSeen) bool) int {
	n := 0
	for _, o := range os {
		if f(o) {
			n++
		}
	}
	return n
}
