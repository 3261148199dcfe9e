package main

import (
	"context"
	"time"

	"seckill/internal/lock"
)

// obtainWoken waits with package lock's Wait, as Redisson does: it tries,
// subscribes to the lock's channel, tries once more (a release may have
// come in between), and then sleeps until the holder's release script
// publishes, which wakes one waiter, who tries again. It needs no sleep
// of its own: it asks Redis only when something changed.
func obtainWoken(ctx context.Context, locks *lock.Redis, _ func(time.Duration) error) (lock.Lock, error) {
	return locks.Obtain(ctx, pollKey, lockTTL, lock.Wait())
}
