package order

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// newService is one instance of the order service on db and rdb, wired as
// app.go wires it, with cfg; in sync mode its group-commit writer runs
// until the test ends. It returns the voucher service beside it.
func newService(tb testing.TB, db *gorm.DB, rdb *redis.Client, cfg Config) (*Service, *voucher.Service) {
	tb.Helper()
	return newServiceHolding(tb, db, rdb, cfg, 15*time.Second)
}

// newServiceHolding is newService with stock holds that last hold.
func newServiceHolding(tb testing.TB, db *gorm.DB, rdb *redis.Client, cfg Config, hold time.Duration) (*Service, *voucher.Service) {
	tb.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stocks := stock.NewStore(rdb, hold)
	q := queue.New(rdb, stocks)
	vouchers := voucher.NewService(db, stocks, nil, nil, time.Now, log)
	s := NewService(db, q, vouchers, stocks, lock.NewRedis(rdb), idworker.New(rdb, time.Now, IDFloor(db, q)), time.Now, log, cfg)
	if cfg.Async {
		tb.Cleanup(s.Close)
		return s, vouchers
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.RunWriter(ctx); close(done) }()
	tb.Cleanup(func() { stop(); <-done; s.Close() })
	return s, vouchers
}

// onSale creates a voucher of units on sale now, for an hour, and returns
// its ID.
func onSale(tb testing.TB, vouchers *voucher.Service, units int64) int64 {
	tb.Helper()
	return onSaleIn(tb, vouchers, units, 1)
}

// onSaleIn is onSale for a voucher split into buckets.
func onSaleIn(tb testing.TB, vouchers *voucher.Service, units int64, buckets int) int64 {
	tb.Helper()
	title := "on sale"
	begin, end := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	v, err := vouchers.Create(context.Background(), 0, "", voucher.CreateInput{Title: &title, Stock: &units, BeginTime: &begin, EndTime: &end, Buckets: &buckets})
	if err != nil {
		tb.Fatal(err)
	}
	id, err := strconv.ParseInt(v.ID, 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}
