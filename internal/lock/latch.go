package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Latch is a countdown latch: it is set to a count, callers count it down,
// and whoever waits on it goes on when the count reaches zero. Use it to
// wait, across instances, until n pieces of work are done: say, until
// every instance has loaded a sale's stock before the sale opens.
//
// A latch nobody has set, or that has been counted down to zero, is open,
// as in Redisson: Wait returns at once. The latch lives for the ttl given
// to Set and then opens by itself, so that a latch whose counters died
// does not stay in Redis, nor keep its waiters, forever: make the ttl
// longer than the work takes.
//
// A latch has no owner: anybody may count it down, and a CountDown retried
// after a lost reply may count twice.
type Latch struct {
	r    *Redis
	name string
	keys latchKeys
}

type latchKeys struct {
	count  string // the count; absent when open
	opened string // pub/sub channel announcing that it opened
}

func latchKeysFor(name string) latchKeys {
	base := "{latch:" + name + "}"
	return latchKeys{count: base, opened: base + ":opened"}
}

// Latch returns the countdown latch called name.
func (r *Redis) Latch(name string) *Latch {
	return &Latch{r: r, name: name, keys: latchKeysFor(name)}
}

// Set closes the latch with count, for at most ttl, if it is open. It
// reports whether it did: false means the latch was already set, and its
// count is left alone.
func (l *Latch) Set(ctx context.Context, count int64, ttl time.Duration) (bool, error) {
	if err := checkTTL(ttl); err != nil {
		return false, err
	}
	if count < 1 {
		return false, fmt.Errorf("lock: set latch %q to %d: count must be positive", l.name, count)
	}
	ok, err := l.r.rdb.SetNX(ctx, l.keys.count, count, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("lock: set latch %q: %w", l.name, err)
	}
	return ok, nil
}

// CountDown counts the latch down by one and returns the count left. The
// call that brings it to zero opens it and wakes every waiter. Counting
// down an open latch does nothing.
func (l *Latch) CountDown(ctx context.Context) (int64, error) {
	left, err := latchCountDownScript.Run(ctx, l.r.rdb, []string{l.keys.count}, l.keys.opened).Int64()
	if err != nil {
		return 0, fmt.Errorf("lock: count down latch %q: %w", l.name, err)
	}
	return left, nil
}

// Count returns the count left, 0 if the latch is open.
func (l *Latch) Count(ctx context.Context) (int64, error) {
	n, err := l.r.rdb.Get(ctx, l.keys.count).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("lock: count of latch %q: %w", l.name, err)
	}
	return n, nil
}

// Wait returns when the latch is open, or ctx.Err() itself when ctx ends
// first. The waiter sleeps until the latch opens, and looks again by
// itself when the latch's ttl runs out.
func (l *Latch) Wait(ctx context.Context) error {
	return l.r.retry(ctx, "wait for latch", l.name, l.keys.opened, true,
		func(ctx context.Context) (bool, time.Duration, error) {
			ttl, err := l.r.rdb.PTTL(ctx, l.keys.count).Result()
			switch {
			case err != nil:
				return false, 0, err
			case ttl == -2: // no such key: open
				return true, 0, nil
			}
			return false, ttl, nil
		})
}
