package main

import (
	"context"

	"seckill/internal/lock"
)

// placeOrderOwned locks the user's account for owner, the request that
// runs it, and awards the order's points under that lock.
//
// Go has no thread to own a lock, so the request names itself: owner must
// be unique to it (an instance ID and a request ID), because two holders
// sharing an owner share the lock. Redis keeps a count per owner, as
// Redisson does, and frees the lock when the count drops to zero.
func placeOrderOwned(ctx context.Context, locks *lock.Redis, user int64, owner string) error {
	lk, err := locks.Obtain(ctx, accountKey(user), lockTTL, lock.Wait(), lock.WithOwner(owner))
	if err != nil {
		return err
	}
	defer lk.Release(ctx)
	// ... the order is written here ...
	return addPointsOwned(ctx, locks, user, owner)
}

// addPointsOwned locks the account for owner: called from placeOrderOwned
// it enters the lock its caller holds, called by the daily bonus it takes
// the lock afresh.
func addPointsOwned(ctx context.Context, locks *lock.Redis, user int64, owner string) error {
	lk, err := locks.Obtain(ctx, accountKey(user), lockTTL, lock.Wait(), lock.WithOwner(owner))
	if err != nil {
		return err
	}
	defer lk.Release(ctx)
	// ... the points are written here ...
	return nil
}
