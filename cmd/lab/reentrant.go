package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"seckill/internal/lock"
)

// Experiment 9: a non-reentrant lock, taken twice by nested code.
//
// Placing an order locks the user's account, and under that lock awards
// the order's points. Awarding points locks the account too, because the
// daily bonus calls it on its own. With a lock that knows only "taken" and
// "free", the nested call waits for a lock its own caller holds, and the
// caller waits for the nested call: a deadlock, until the context gives
// up. Java's ReentrantLock and Redisson count how deep their owner is in;
// Go has no thread identity, so with package lock the request names
// itself as the owner (WithOwner) and may enter again.
var nonReentrant = experiment{
	name:   "non-reentrant",
	title:  "non-reentrant lock taken twice by nested code",
	counts: "deadlock",
	lesson: "code that nests must use a reentrant lock, owned by the request (WithOwner)",
	broken: func(ctx context.Context) (outcome, error) {
		return nested(ctx, func(ctx context.Context, locks *lock.Redis) error {
			return placeOrderPlain(ctx, locks, scalper)
		})
	},
	fixed: func(ctx context.Context) (outcome, error) {
		return nested(ctx, func(ctx context.Context, locks *lock.Redis) error {
			return placeOrderOwned(ctx, locks, scalper, "instance-1/request-"+randomID())
		})
	},
}

// deadlockAfter is how long the lab lets the flow wait for its lock before
// calling it a deadlock. Nothing else holds the lock, so an uncontended
// flow takes a few milliseconds; a deadlock would wait forever.
const deadlockAfter = 250 * time.Millisecond

// accountKey names the lock on a user's account.
func accountKey(user int64) string { return fmt.Sprintf("account:user:%d", user) }

// nested runs one order flow, gives it deadlockAfter to finish, and then
// checks that the account lock is free again. Both count as deadlocks: a
// lock left behind makes the next caller wait in vain.
func nested(ctx context.Context, flow func(context.Context, *lock.Redis) error) (outcome, error) {
	_, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	locks := lock.NewRedis(rdb)

	fctx, cancel := context.WithTimeout(ctx, deadlockAfter)
	err = flow(fctx, locks)
	cancel()
	deadlocks := 0
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		deadlocks++
	case err != nil:
		return outcome{}, err
	}

	left := 0
	switch lk, err := locks.Obtain(ctx, accountKey(scalper), lockTTL); {
	case errors.Is(err, lock.ErrNotAcquired):
		left++
	case err != nil:
		return outcome{}, err
	default:
		if err := lk.Release(ctx); err != nil {
			return outcome{}, err
		}
	}

	summary := "the nested call entered again"
	if deadlocks > 0 {
		summary = fmt.Sprintf("the nested call waited for its caller (for %v)", deadlockAfter)
	}
	return outcome{
		violations: deadlocks + left,
		summary:    summary,
		measures:   map[string]int{"deadlocks": deadlocks, "locks_left": left},
	}, nil
}
