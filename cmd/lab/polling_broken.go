package main

import (
	"context"
	"errors"
	"time"

	"seckill/internal/lock"
)

// obtainPolling waits for the lock the way a retry loop does: try once,
// and if the lock is taken, sleep pollEvery and try again.
//
// Each try is a command to Redis, answered "taken" for as long as the
// holder works; and a release that comes just after a try waits for the
// next one: the lock lies free meanwhile, with waiters asleep.
func obtainPolling(ctx context.Context, locks *lock.Redis, sleep func(time.Duration) error) (lock.Lock, error) {
	for {
		lk, err := locks.Obtain(ctx, pollKey, lockTTL) // tries once
		if !errors.Is(err, lock.ErrNotAcquired) {
			return lk, err
		}
		if err := sleep(pollEvery); err != nil { // time.Sleep, in a service
			return nil, err
		}
	}
}
