package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// A Redis that is full refuses the stock script before it writes
// anything, and the buyer is told 503 at once, in either mode. In async
// mode this is the case to get right: nothing was taken, for certain, so
// there is nothing to ask (asking, Lost's void mark refused too, would
// hold the buyer for the whole WriteTimeout). With room again, the same
// buyer buys. On a private redis-server: a maxmemory of 1 byte would
// refuse every other test's writes on the shared one.
//
// It fails if the refusal waits out WriteTimeout (a minute here), is
// answered other than 503, or takes the unit.
func TestSeckillAnswersAtOnceWhenRedisIsFull(t *testing.T) {
	rdb := testenv.StartRedis(t).Client(t)
	db := testenv.Open(t, testenv.MySQLDSN(t))
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "sync", true: "async"}[async], func(t *testing.T) {
			seckillWhenFull(t, rdb, db, async)
		})
	}
}

func seckillWhenFull(t *testing.T, rdb *redis.Client, db *gorm.DB, async bool) {
	ctx := context.Background()
	cfg := DefaultConfig
	cfg.Async = async
	cfg.WriteTimeout = time.Minute
	s, vouchers := newService(t, db, rdb, cfg)
	units := int64(5)
	voucherID := onSale(t, vouchers, units)
	// One order first, so that the ID pool and the voucher are at hand:
	// what is refused below is the order alone.
	if _, err := s.Seckill(ctx, 1, voucherID); err != nil {
		t.Fatal(err)
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Seckill(ctx, 2, voucherID)
	took := time.Since(start)
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, apperr.ErrUnavailable) || took > 10*time.Second {
		t.Fatalf("Redis full: Seckill = %v after %v; want 503 (unavailable) at once, not after WriteTimeout", err, took)
	}
	if left, err := rdb.Get(ctx, stock.KeysOf(voucherID).Stock).Int64(); err != nil || left != units-1 {
		t.Errorf("stock in Redis after the refusal = %d, %v; want %d", left, err, units-1)
	}
	if _, err := s.Seckill(ctx, 2, voucherID); err != nil {
		t.Errorf("with room again: %v", err)
	}
}
