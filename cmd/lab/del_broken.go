package main

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// pxDelMutex takes the lock correctly, key and expiry in one command, and
// gives it back with DEL: whoever holds the key by then loses it.
type pxDelMutex struct{ rdb *redis.Client }

func newPXDelMutex(rdb *redis.Client) redisMutex { return pxDelMutex{rdb} }

func (m pxDelMutex) lock(ctx context.Context, key string, ttl time.Duration, _ func() bool) (unlockFunc, error) {
	ok, err := m.rdb.SetNX(ctx, key, "locked", ttl).Result() // SET key locked NX PX ttl
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errBusy
	}
	return func(ctx context.Context, pause func()) error {
		pause()                          // the lab: the holder's work overruns its ttl
		return m.rdb.Del(ctx, key).Err() // deletes the key, whoever's it is now
	}, nil
}
