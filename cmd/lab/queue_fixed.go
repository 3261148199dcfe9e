package main

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// streamQueue is a Redis Stream read by a consumer group. An entry a
// consumer has read stays pending, in Redis, until the consumer
// acknowledges it after the write; a consumer that comes back (or any
// other) claims what a dead one left pending.
type streamQueue struct {
	rdb      *redis.Client
	consumer string
}

const (
	ordersStream = "lab:orders"
	ordersGroup  = "writers"
)

func newStreamQueue() (orderQueue, func(), error) {
	_, rdb, closeRedis, err := openRedis()
	if err != nil {
		return nil, nil, err
	}
	if err := rdb.XGroupCreateMkStream(context.Background(), ordersStream, ordersGroup, "0").Err(); err != nil {
		closeRedis()
		return nil, nil, err
	}
	return streamQueue{rdb: rdb, consumer: "worker-1"}, closeRedis, nil
}

// accept answers once Redis holds the order (XADD): the promise now lives
// outside the process.
func (q streamQueue) accept(ctx context.Context, user int64) error {
	return q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: ordersStream, Values: map[string]any{"user": user}}).Err()
}

// work first takes over what a dead consumer left pending (XAUTOCLAIM),
// then reads new entries; it acknowledges each entry after its row is
// written, so a kill between the two leaves the entry pending, never lost.
func (q streamQueue) work(ctx context.Context, db *gorm.DB, limit int) error {
	claimed, _, err := q.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: ordersStream, Group: ordersGroup, Consumer: q.consumer, MinIdle: 0, Start: "0", Count: int64(limit),
	}).Result()
	if err != nil {
		return err
	}
	batch := claimed
	if len(batch) < limit {
		streams, err := q.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: ordersGroup, Consumer: q.consumer, Streams: []string{ordersStream, ">"}, Count: int64(acceptedOrders), Block: -1,
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for _, s := range streams {
			batch = append(batch, s.Messages...)
		}
	}
	// The kill comes after limit writes: what was read past them stays
	// pending, with this consumer, in Redis.
	for i, m := range batch {
		if i == limit {
			break
		}
		user, err := strconv.ParseInt(m.Values["user"].(string), 10, 64)
		if err != nil {
			return err
		}
		if err := writeOrder(ctx, db, user); err != nil {
			return err
		}
		if err := q.rdb.XAck(ctx, ordersStream, ordersGroup, m.ID).Err(); err != nil {
			return err
		}
	}
	return nil
}

// restart is another consumer of the same group: the stream, and what the
// dead one left pending in it, are still in Redis.
func (q streamQueue) restart() orderQueue {
	return streamQueue{rdb: q.rdb, consumer: "worker-2"}
}
