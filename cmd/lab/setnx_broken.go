package main

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// setnxMutex is the first Redis lock of the articles: SETNX to take it,
// DEL to give it back.
type setnxMutex struct{ rdb *redis.Client }

func newSETNXMutex(rdb *redis.Client) redisMutex { return setnxMutex{rdb} }

func (m setnxMutex) lock(ctx context.Context, key string, _ time.Duration, crash func() bool) (unlockFunc, error) {
	ok, err := m.rdb.SetNX(ctx, key, "locked", 0).Result() // 0: the key never expires
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errBusy
	}
	if crash() { // the lab kills the holder while it holds the lock
		return nil, errCrashed
	}
	return func(ctx context.Context, pause func()) error {
		pause()
		return m.rdb.Del(ctx, key).Err() // the only way the key ever goes
	}, nil
}
