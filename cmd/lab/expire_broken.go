package main

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// setnxExpireMutex takes the lock with SETNX and then gives it an expiry
// with EXPIRE: right in the common case, and forever locked when the
// process dies between the two.
type setnxExpireMutex struct{ rdb *redis.Client }

func newSETNXExpireMutex(rdb *redis.Client) redisMutex { return setnxExpireMutex{rdb} }

func (m setnxExpireMutex) lock(ctx context.Context, key string, ttl time.Duration, crash func() bool) (unlockFunc, error) {
	ok, err := m.rdb.SetNX(ctx, key, "locked", 0).Result()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errBusy
	}
	if crash() { // the lab kills the holder between SETNX and EXPIRE
		return nil, errCrashed
	}
	if err := m.rdb.Expire(ctx, key, ttl).Err(); err != nil {
		return nil, err
	}
	return func(ctx context.Context, pause func()) error {
		pause()
		return m.rdb.Del(ctx, key).Err()
	}, nil
}
