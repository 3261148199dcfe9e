package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Experiment 7: release with a plain DEL after the lock expired.
//
// With an expiry, a lock can run out under a holder whose work overran it.
// Holder A's key expires; B takes the lock, as it should; A finishes and
// deletes the key with DEL, which is B's lock now. C finds the lock free
// and takes it while B is still working: two holders at once, neither of
// them slow. The fix marks the lock with a random token known only to its
// holder, and deletes the key only if it still holds that token.
var delAfterExpiry = experiment{
	name:   "del-after-expiry",
	title:  "plain DEL after the lock expired",
	counts: "overlap",
	lesson: "delete only your own lock: a random token, compared and deleted in one script",
	broken: func(ctx context.Context) (outcome, error) { return overrun(ctx, newPXDelMutex) },
	fixed:  func(ctx context.Context) (outcome, error) { return overrun(ctx, newPackageLock) },
}

// overrun lets holder A take the lock, and pauses A right before the
// command that deletes its key. Meanwhile A's lock expires and B takes
// it. Then A goes on releasing, and C tries the lock while B still holds
// it. C getting it is the violation: two holders, B and C, at once.
func overrun(ctx context.Context, newMutex func(*redis.Client) redisMutex) (outcome, error) {
	srv, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	clk := newHandClock(srv)
	m := newMutex(rdb)

	const key = "order:voucher:1:user:42"
	tl := newTimeline(handClockName, clk.now)
	unlockA, err := m.lock(ctx, key, lockTTL, never)
	if err != nil {
		return outcome{}, err
	}
	tl.take("A")
	var errB error
	err = unlockA(ctx, func() { // the lab: A is held up, just before its delete
		clk.forward(lockTTL) // ... past its ttl: the key expires
		tl.expire("A", "A's key expires (A paused)")
		if _, errB = m.lock(ctx, key, lockTTL, never); errB == nil {
			tl.take("B")
		}
	})
	tl.mark("A's release")
	if err := errors.Join(err, errB); err != nil {
		return outcome{}, fmt.Errorf("release by A, or B taking the lock: %w", err)
	}

	// B holds the lock and works; its ttl is far from over.
	overlaps := 0
	switch _, err := m.lock(ctx, key, lockTTL, never); {
	case err == nil:
		overlaps++ // C got in: A's delete removed B's lock
		tl.take("C")
	case !errors.Is(err, errBusy):
		return outcome{}, err
	default:
		tl.refuse("C", "refused")
	}
	summary := "A's release left B's lock alone; C refused"
	if overlaps > 0 {
		summary = "A deleted B's lock; C got it while B held it"
	}
	tl.end()
	return outcome{
		violations: overlaps,
		summary:    summary,
		measures:   map[string]int{"overlapping_holders": overlaps},
		timeline:   tl,
	}, nil
}
