package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lock"
)

// Experiment 12: the master fails over before the lock reached its replica.
//
// A lock in one Redis that a replica backs up looks safe: if the master
// dies, Sentinel promotes the replica and the lock is still there. But
// replication is asynchronous: the master answers A's SET before the
// replica has it. If the master dies in that gap, the promoted replica has
// no lock, and B takes it while A goes on working: two holders. The lab
// makes the gap certain: the replication link goes quiet just before A's
// write, as a slow network would make it. The fix the articles propose is
// RedLock: the lock on five independent servers, held when a majority
// granted it, so that one server losing it (a crash, a failover to a
// replica without it) leaves A with four and B with at most one.
var failover = experiment{
	name:   "failover",
	title:  "Redis master fails over before the lock reached its replica",
	counts: "overlap",
	lesson: "asynchronous replication can lose a lock; RedLock asks a majority of independent servers",
	broken: lockAcrossFailover,
	fixed:  redlockAcrossCrash,
}

const failoverKey = "lock:order:voucher:1:user:42"

// storyClock is the time axis of experiments 12 and 12b: real time, in
// which the whole story is over long before A's lock would expire.
var storyClock = fmt.Sprintf("%s; A's lock lives %v, far past this picture", realClockName, lockTTL)

// overlapOutcome reports whether B got a lock that A still held, and ends
// the story's timeline (A took the lock, a server crashed) with B's ask.
// Its clock is real time: the whole story runs in milliseconds, far
// inside A's ttl of 10 s.
func overlapOutcome(tl *timeline, bGot bool, yes, no string) outcome {
	if bGot {
		tl.take("B")
	} else {
		tl.refuse("B", "refused")
	}
	tl.end()
	n := 0
	if bGot {
		n = 1
	}
	summary := no
	if bGot {
		summary = yes
	}
	return outcome{violations: n, summary: summary, measures: map[string]int{"overlapping_holders": n}, timeline: tl}
}

// redlockAcrossCrash: A takes the lock on five independent servers. One of
// them crashes and comes back empty (what a failover to a replica that
// missed the lock looks like to the lock). B asks all five: four say A
// holds it, so B is refused.
func redlockAcrossCrash(ctx context.Context) (outcome, error) {
	nodes, closeAll, err := startRedises(ctx, 5)
	if err != nil {
		return outcome{}, err
	}
	defer closeAll()
	rl := newRedLock(nodes)
	tl := newTimeline(storyClock, since(time.Now()))
	a, err := rl.Obtain(ctx, failoverKey, lockTTL)
	if err != nil {
		return outcome{}, fmt.Errorf("client A: %w", err)
	}
	defer a.Release(context.WithoutCancel(ctx))
	tl.take("A")
	if err := nodes[0].restart(ctx); err != nil { // the crash: node 1 loses A's lock
		return outcome{}, err
	}
	tl.mark("node 1 crashes, back empty")
	bGot, err := tryB(ctx, rl)
	if err != nil {
		return outcome{}, err
	}
	return overlapOutcome(tl, bGot,
		"B got a majority while A held the lock",
		"node 1 came back without A's lock; the other four refused B"), nil
}

// tryB asks for the lock as B while A holds it, and reports whether B got
// it (the violation). B's lock, if any, is given back at once.
func tryB(ctx context.Context, rl *lock.RedLock) (bool, error) {
	b, err := rl.Obtain(ctx, failoverKey, lockTTL)
	switch {
	case err == nil:
		return true, b.Release(context.WithoutCancel(ctx))
	case errors.Is(err, lock.ErrNotAcquired):
		return false, nil
	}
	return false, fmt.Errorf("client B: %w", err)
}

// newRedLock is package lock's RedLock over the lab's servers.
func newRedLock(nodes []*redisProc) *lock.RedLock {
	var clients []redis.UniversalClient
	for _, n := range nodes {
		clients = append(clients, n.rdb)
	}
	return lock.NewRedLock(clients)
}
