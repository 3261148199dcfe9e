package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Experiment 5: SETNX with no expiry, and a holder that dies.
//
// The first Redis lock in the articles is SETNX key value: it sets the key
// only if it is absent, so one client wins. The winner deletes the key when
// done. A winner that crashes first, or is killed during a deploy, deletes
// nothing: the key stays forever and no one ever takes that lock again.
// The fix gives the lock an expiry when it is taken.
var setnxNoExpiry = experiment{
	name:   "setnx-no-expiry",
	title:  "SETNX with no expiry, holder dies",
	counts: "refused newcomer",
	lesson: "a lock must expire by itself: a dead holder never deletes it",
	broken: func(ctx context.Context) (outcome, error) { return deadHolder(ctx, newSETNXMutex) },
	fixed:  func(ctx context.Context) (outcome, error) { return deadHolder(ctx, newPackageLock) },
}

// After the holder dies, newcomers arrive one ttl apart.
const newcomers = 10

// deadHolder lets a holder take the lock and die, at the mutex's crash
// point or just after taking it, then moves Redis' clock on by a ttl
// before each newcomer tries the lock. A newcomer that gets it gives it
// back. Every newcomer refused after the dead holder's ttl has run out is
// a violation: the lock is held by nobody, for good.
func deadHolder(ctx context.Context, newMutex func(*redis.Client) redisMutex) (outcome, error) {
	srv, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	clk := newHandClock(srv)
	m := newMutex(rdb)

	const key = "order:voucher:1:user:42"
	// The lab kills the holder at the variant's crash point. Whatever it
	// held, it never unlocks.
	if _, err := m.lock(ctx, key, lockTTL, func() bool { return true }); !errors.Is(err, errCrashed) {
		return outcome{}, fmt.Errorf("the holder should have been killed, got %v", err)
	}
	tl := newTimeline(handClockName, clk.now)
	tl.take("dead holder's key")
	tl.mark("its holder dies")
	keyGone := false

	refused := 0
	for range newcomers {
		clk.forward(lockTTL)
		unlock, err := m.lock(ctx, key, lockTTL, never)
		switch {
		case errors.Is(err, errBusy):
			refused++
			label := ""
			if refused == 1 {
				label = "refused, and each ttl after"
			}
			tl.refuse("newcomers", label)
			continue
		case err != nil:
			return outcome{}, err
		}
		if !keyGone {
			tl.drop("dead holder's key")
			keyGone = true
		}
		tl.take("newcomers")
		if err := unlock(ctx, nothing); err != nil {
			return outcome{}, err
		}
		tl.drop("newcomers")
	}
	tl.end()
	summary := "the dead holder's lock expired"
	if refused == newcomers {
		summary = fmt.Sprintf("still held %d ttls after its holder died", newcomers)
	}
	return outcome{
		violations: refused,
		summary:    summary,
		measures:   map[string]int{"newcomers": newcomers, "refused": refused},
		timeline:   tl,
	}, nil
}
