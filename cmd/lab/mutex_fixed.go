package main

import (
	"context"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/lock"
)

// redisInstance takes experiment 3's lock per user in Redis, through a
// connection of its own: another process, the same lock.
type redisInstance struct {
	rdb   *redis.Client
	locks *lock.Redis
	db    *gorm.DB
}

func newRedisInstance(redisAddr string, db *gorm.DB) *redisInstance {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	return &redisInstance{rdb: rdb, locks: lock.NewRedis(rdb), db: db}
}

func (in *redisInstance) order(ctx context.Context, user int64, pause func()) error {
	return orderLocked(ctx, in.locks, in.db, user, pause)
}

func (in *redisInstance) close() { _ = in.rdb.Close() }
