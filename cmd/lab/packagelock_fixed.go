package main

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lock"
)

// packageLock is package lock behind the lab's redisMutex: the fixed
// variant of experiments 5 to 8.
//
// Obtain takes the lock in one command (SET key token NX PX ttl, in
// obtain.lua), so there is no moment at which the key exists without its
// expiry: a holder that dies anywhere leaves a lock that expires. The
// token is random and Release deletes the key only if it still holds that
// token, in one script (release.lua): a holder can only ever delete its
// own lock.
type packageLock struct{ locks *lock.Redis }

func newPackageLock(rdb *redis.Client) redisMutex { return packageLock{lock.NewRedis(rdb)} }

func (p packageLock) lock(ctx context.Context, key string, ttl time.Duration, crash func() bool) (unlockFunc, error) {
	lk, err := p.locks.Obtain(ctx, key, ttl)
	if errors.Is(err, lock.ErrNotAcquired) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	if crash() { // no moment between taking and expiry: the lock is already bound to expire
		return nil, errCrashed
	}
	return func(ctx context.Context, pause func()) error {
		pause()
		err := lk.Release(ctx)
		if errors.Is(err, lock.ErrNotHeld) {
			return nil // the lock had expired: nothing of ours to delete
		}
		return err
	}, nil
}
