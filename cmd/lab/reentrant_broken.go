package main

import (
	"context"

	"seckill/internal/lock"
)

// placeOrderPlain locks the user's account and awards the order's points
// under that lock.
func placeOrderPlain(ctx context.Context, locks *lock.Redis, user int64) error {
	lk, err := locks.Obtain(ctx, accountKey(user), lockTTL, lock.Wait())
	if err != nil {
		return err
	}
	defer lk.Release(ctx)
	// ... the order is written here ...
	return addPointsPlain(ctx, locks, user)
}

// addPointsPlain locks the account as well, since the daily bonus calls
// it without holding the lock. Called from placeOrderPlain, it waits for
// a lock its own caller holds, and so does its caller, for it.
func addPointsPlain(ctx context.Context, locks *lock.Redis, user int64) error {
	lk, err := locks.Obtain(ctx, accountKey(user), lockTTL, lock.Wait())
	if err != nil {
		return err
	}
	defer lk.Release(ctx)
	// ... the points are written here ...
	return nil
}
