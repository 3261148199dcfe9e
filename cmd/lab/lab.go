package main

import (
	"context"
	"encoding/json"
	"fmt"
)

// An experiment is one classic mistake of a seckill backend and its fix.
// Both variants run the same load on a fresh stack, and each reports what
// it broke. The broken variant must show damage on every run, so the lab
// forces the race it depends on (see race and the clock in stack.go)
// rather than hoping the scheduler produces it.
type experiment struct {
	name   string // what `go run ./cmd/lab NAME` takes
	title  string // the mistake, in a few words
	counts string // what a violation is, singular: "oversold unit"
	lesson string // one line: what the fix teaches
	// sequel marks the second half of the experiment before it: the same
	// question asked of another setup. It shares that one's number, with
	// a letter ("12b"), so that the numbers of the rest stay put.
	sequel bool
	broken func(ctx context.Context) (outcome, error)
	fixed  func(ctx context.Context) (outcome, error)
}

// experiments lists the experiments in the order a developer usually
// meets their mistakes: first the database, then the lock. 17 to 19 (the
// course's Lua, wait-and-retry and MultiLock) came later, and come last,
// so that the numbers of the others stay put.
var experiments = []experiment{
	oversell,
	optimistic,
	queryInsert,
	localMutex,
	setnxNoExpiry,
	setnxExpire,
	delAfterExpiry,
	getCompareDel,
	nonReentrant,
	noWatchdog,
	pauseFencing,
	failover,
	redlockRestart,
	inProcessQueue,
	orderIDs,
	payDeadline,
	roomTwoSteps,
	checkDecr,
	lockWaitPolling,
	multilockNodes,
}

// numbers gives each experiment its number, by name, from its place in
// experiments: the one numbering that -list, the report, the SVG
// captions and docs/lab.md use (a test reads docs/lab.md to keep it so).
// A sequel takes the number of the experiment before it and a letter.
func numbers() map[string]string {
	out := make(map[string]string, len(experiments))
	n, letter := 0, 'a'
	for _, e := range experiments {
		if e.sequel && n > 0 {
			letter++
			out[e.name] = fmt.Sprintf("%d%c", n, letter)
			continue
		}
		n, letter = n+1, 'a'
		out[e.name] = fmt.Sprint(n)
	}
	return out
}

// An outcome is what one variant did under the experiment's load.
type outcome struct {
	// violations counts the breaks of the experiment's invariant that the
	// lab observed: units oversold, duplicate orders, overlapping lock
	// holders, and so on. A fixed variant must show 0.
	violations int
	// summary says in a few words what happened, for the report.
	summary string
	// measures holds the numbers behind the summary, such as orders
	// written or buyers refused.
	measures map[string]int
	// timeline, for the lock experiments, is who held the lock when
	// (-svg draws it); nil for the others.
	timeline *timeline
}

// MarshalJSON flattens the measures next to violations and summary, so
// that a script reads "broken.violations" and "broken.orders" alike.
func (o outcome) MarshalJSON() ([]byte, error) {
	m := map[string]any{"violations": o.violations, "summary": o.summary}
	for k, v := range o.measures {
		m[k] = v
	}
	return json.Marshal(m)
}

// A report is one experiment's run, as printed by -json.
type report struct {
	Number string  `json:"number"` // "12b": see numbers
	Name   string  `json:"name"`
	Title  string  `json:"title"`
	Counts string  `json:"counts"`
	Lesson string  `json:"lesson"`
	Broken outcome `json:"broken"`
	Fixed  outcome `json:"fixed"`
}

// runExperiment runs both variants of e, the broken one first.
func runExperiment(ctx context.Context, e experiment) (report, error) {
	r := report{Number: numbers()[e.name], Name: e.name, Title: e.title, Counts: e.counts, Lesson: e.lesson}
	var err error
	if r.Broken, err = e.broken(ctx); err != nil {
		return r, fmt.Errorf("broken variant: %w", err)
	}
	if r.Fixed, err = e.fixed(ctx); err != nil {
		return r, fmt.Errorf("fixed variant: %w", err)
	}
	return r, nil
}

// plural writes n and word, with an s unless n is 1: "1 order", "5 orders".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
