package main

import (
	"context"
	"time"

	"seckill/internal/lock"
)

// jobMaxHold caps the watchdog: a job stuck for this long loses the lock,
// so that a hung holder does not keep it forever.
const jobMaxHold = time.Minute

// reconcileWatched runs work under a lock that a watchdog renews every
// jobTTL/3 while the work runs. The work runs under the lock's Context:
// if a renewal finds the lock gone, the work is cancelled instead of
// going on unprotected.
func reconcileWatched(ctx context.Context, locks *lock.Redis, work func(ctx context.Context) error) error {
	lk, err := locks.Obtain(ctx, jobKey, jobTTL, lock.WithWatchdog(jobMaxHold))
	if err != nil {
		return err
	}
	defer lk.Release(ctx)
	return work(lk.Context())
}
