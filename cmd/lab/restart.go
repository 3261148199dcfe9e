package main

import (
	"context"
	"fmt"
	"time"
)

// Experiment 12b: RedLock with a node that restarts without persistence,
// the second half of experiment 12.
//
// RedLock's safety rests on each server keeping the lock for its ttl. A
// server that crashes and restarts empty forgets it. If A held a bare
// majority (three of five: two servers were down when A asked), one of
// A's three restarting at once leaves A with two, and B finds three free
// servers: two holders. The remedy in RedLock's own description is a
// delayed restart: a crashed server stays out for at least the longest
// ttl, so that every lock it granted has expired before it votes again.
// Both variants run the same crash at the same moment; only the restart
// differs.
var redlockRestart = experiment{
	name:   "redlock-restart",
	title:  "RedLock node restarted without persistence",
	counts: "overlap",
	lesson: "a RedLock server that lost its memory must stay out for a ttl before it votes again",
	sequel: true, // 12b: experiment 12's cure, put to its own test
	broken: func(ctx context.Context) (outcome, error) { return bareMajority(ctx, true) },
	fixed:  func(ctx context.Context) (outcome, error) { return bareMajority(ctx, false) },
}

// bareMajority gives A the lock on servers 1 to 3 of 5 (4 and 5 are down
// when A asks, then come back), crashes server 3, and lets B ask. With
// restartNow, server 3 is back at once, empty; otherwise it sits out its
// ttl, and B asks meanwhile.
func bareMajority(ctx context.Context, restartNow bool) (outcome, error) {
	nodes, closeAll, err := startRedises(ctx, 5)
	if err != nil {
		return outcome{}, err
	}
	defer closeAll()
	rl := newRedLock(nodes)
	tl := newTimeline(storyClock, since(time.Now()))
	nodes[3].kill()
	nodes[4].kill()
	tl.mark("servers 4 and 5 down")
	a, err := rl.Obtain(ctx, failoverKey, lockTTL)
	if err != nil {
		return outcome{}, fmt.Errorf("client A, with 3 of 5 servers up: %w", err)
	}
	defer a.Release(context.WithoutCancel(ctx))
	tl.take("A")
	for _, n := range nodes[3:] {
		if err := n.start(ctx); err != nil {
			return outcome{}, err
		}
	}
	tl.mark("4 and 5 back, without A's lock")

	nodes[2].kill() // the crash: one of A's three
	if restartNow {
		if err := nodes[2].start(ctx); err != nil { // back at once, empty
			return outcome{}, err
		}
		tl.mark("server 3 crashes, back at once, empty")
	} else {
		tl.mark("server 3 crashes, stays out a ttl") // B asks before it is back
	}

	bGot, err := tryB(ctx, rl)
	if err != nil {
		return outcome{}, err
	}
	if restartNow {
		return overlapOutcome(tl, bGot,
			"server 3 came back empty; B got 3 of 5 while A held the lock",
			"B refused"), nil
	}
	return overlapOutcome(tl, bGot,
		"B got a majority while A held the lock",
		"server 3 sat out its ttl; servers 1 and 2 refused B, no majority"), nil
}
