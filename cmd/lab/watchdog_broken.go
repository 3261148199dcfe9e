package main

import (
	"context"

	"seckill/internal/lock"
)

// reconcileFixedTTL runs work under a lock that lives jobTTL, however
// long the work takes.
func reconcileFixedTTL(ctx context.Context, locks *lock.Redis, work func(ctx context.Context) error) error {
	lk, err := locks.Obtain(ctx, jobKey, jobTTL)
	if err != nil {
		return err
	}
	defer lk.Release(ctx)
	return work(ctx) // nothing stops the work when the lock runs out
}
