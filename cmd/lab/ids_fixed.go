package main

import (
	"context"
	"time"

	"gorm.io/gorm"

	"seckill/internal/idworker"
)

// newSharedIDs draws every shard's order IDs from one Redis sequence, the
// service's own idworker: 31 bits of seconds since 2022, 32 bits of the
// day's INCR. The shard stores the ID it is given.
func newSharedIDs() (orderWriter, func(), error) {
	_, rdb, closeRedis, err := openRedis()
	if err != nil {
		return nil, nil, err
	}
	// No order exists yet: the day's sequence starts above nothing.
	none := func(context.Context, string, int64, int64) (int64, error) { return 0, nil }
	ids := idworker.New(rdb, time.Now, none)
	if err := ids.Seed(context.Background(), "order", time.Now()); err != nil {
		closeRedis()
		return nil, nil, err
	}
	write := func(ctx context.Context, shard *gorm.DB, user int64) (int64, error) {
		id, err := ids.Next(ctx, "order")
		if err != nil {
			return 0, err
		}
		return id, shard.WithContext(ctx).Exec(
			"INSERT INTO orders (id, user_id, voucher_id) VALUES (?, ?, ?)", id, user, voucherID,
		).Error
	}
	return write, closeRedis, nil
}
