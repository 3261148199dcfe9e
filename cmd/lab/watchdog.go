package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"seckill/internal/lock"
)

// Experiment 10: work that outlasts the ttl, without a watchdog.
//
// Every instance of the service runs the same reconciliation job on a
// timer, under a lock so that one runs at a time. The ttl is an estimate
// of how long the job takes. One day the job is slower than the estimate
// (a big sale, a slow database); its lock expires in the middle, and the
// next instance's timer starts a second run beside it. A longer ttl only
// moves the day, and makes a crashed holder block everyone for longer.
// The fix is Redisson's watchdog: while the holder lives, a goroutine
// renews the lock every ttl/3; a holder that dies stops renewing.
var noWatchdog = experiment{
	name:   "no-watchdog",
	title:  "work longer than the ttl, no watchdog",
	counts: "overlap",
	lesson: "a ttl is a guess: renew the lock while the work runs (WithWatchdog), and run the work under its Context",
	broken: func(ctx context.Context) (outcome, error) { return slowJob(ctx, reconcileFixedTTL) },
	fixed:  func(ctx context.Context) (outcome, error) { return slowJob(ctx, reconcileWatched) },
}

// jobTTL is the reconciliation's estimated run time, with margin.
const jobTTL = 200 * time.Millisecond

// jobKey names the reconciliation job's lock.
const jobKey = "job:reconcile:voucher:1"

// jobFunc runs work under the job's lock, or returns lock.ErrNotAcquired
// if another run holds it.
type jobFunc func(ctx context.Context, locks *lock.Redis, work func(ctx context.Context) error) error

// slowJob runs the job on instance A, whose work takes one and a half
// ttls of Redis' time, and then starts the job on instance B while A's
// work is still running. B getting the lock is the violation.
func slowJob(ctx context.Context, job jobFunc) (outcome, error) {
	srv, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	clk := startClock(srv)
	defer clk.close()
	locks := lock.NewRedis(rdb)

	overlaps := 0
	tl := newTimeline("Redis' clock, following the real one", clk.now)
	var errB error
	errA := job(ctx, locks, func(workCtx context.Context) error {
		tl.take("A")
		defer tl.drop("A")
		// The lab: A's work runs past its ttl, by half of it.
		if err := clk.sleep(workCtx, jobTTL); err != nil {
			return err
		}
		tl.mark(fmt.Sprintf("A's first %v are up", jobTTL))
		ttlUp := tl.step()
		if err := clk.sleep(workCtx, jobTTL/2); err != nil {
			return err
		}
		tl.mark("A still works; B's timer fires")
		// B's timer fires on the other instance while A is still at work.
		errB = job(ctx, locks, func(context.Context) error {
			tl.take("B")
			// B has the lock, so A's key expired; nothing renewed it
			// after its first ttl, and A works on without it.
			tl.lapsedSince("A", ttlUp)
			tl.drop("B")
			overlaps++
			return nil
		})
		if errB != nil {
			tl.refuse("B", "refused")
		}
		return nil
	})
	tl.end()
	if errors.Is(errB, lock.ErrNotAcquired) {
		errB = nil
	}
	if err := errors.Join(errA, errB); err != nil {
		return outcome{}, err
	}

	summary := fmt.Sprintf("A's %v lock renewed through %v of work; B refused", jobTTL, jobTTL*3/2)
	if overlaps > 0 {
		summary = fmt.Sprintf("A's %v lock expired mid-work; B ran beside A", jobTTL)
	}
	return outcome{
		violations: overlaps,
		summary:    summary,
		measures:   map[string]int{"overlapping_holders": overlaps},
		timeline:   tl,
	}, nil
}
