package main

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// getDelMutex marks its lock with a random token, and gives the lock back
// only if GET still returns that token: right, but in three round trips.
type getDelMutex struct{ rdb *redis.Client }

func newGetDelMutex(rdb *redis.Client) redisMutex { return getDelMutex{rdb} }

func (m getDelMutex) lock(ctx context.Context, key string, ttl time.Duration, _ func() bool) (unlockFunc, error) {
	token := rand.Text() // crypto/rand: nobody else can guess or repeat it
	ok, err := m.rdb.SetNX(ctx, key, token, ttl).Result()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errBusy
	}
	return func(ctx context.Context, pause func()) error {
		v, err := m.rdb.Get(ctx, key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if v != token {
			return nil // expired (GET found nothing), or somebody else's
		}

		pause() // the lab: the holder stops between "it is mine" and DEL

		return m.rdb.Del(ctx, key).Err() // it may not be ours any more
	}, nil
}
