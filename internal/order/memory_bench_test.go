package order

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// BenchmarkSeckillFromMemory is what Service.Seckill costs a request the
// instance answers from memory, as it does the flood after a sale
// (loadtest/reject.sh's two paths): sold_out, a voucher remembered sold
// out, and already_ordered, a buyer remembered. Neither touches Redis or
// MySQL once the first answers are in.
//
//	go test -run '^$' -bench SeckillFromMemory -benchmem ./internal/order/
func BenchmarkSeckillFromMemory(b *testing.B) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rdb := testenv.Redis(b, 0)
	db := testenv.Open(b, testenv.MySQLDSN(b))
	stocks := stock.NewStore(rdb, 15*time.Second)
	q := queue.New(rdb, stocks)
	vouchers := voucher.NewService(db, stocks, nil, nil, time.Now, log)
	create := func(units int64) int64 {
		title := "memory bench"
		begin, end := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
		v, err := vouchers.Create(ctx, 0, "", voucher.CreateInput{Title: &title, Stock: &units, BeginTime: &begin, EndTime: &end})
		if err != nil {
			b.Fatal(err)
		}
		id, err := strconv.ParseInt(v.ID, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return id
	}
	cfg := DefaultConfig
	cfg.SoldOutMemo = time.Hour // every answer from memory, none from Redis
	s := NewService(db, q, vouchers, stocks, lock.NewRedis(rdb), idworker.New(rdb, time.Now, IDFloor(db, q)), time.Now, log, cfg)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.RunWriter(wctx); close(done) }()
	b.Cleanup(func() { stop(); <-done; s.Close() })

	soldOut, ordered := create(0), create(10)
	const buyer = 7
	if _, err := s.Seckill(ctx, buyer, ordered); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		voucher int64
		want    error
	}{{"sold_out", soldOut, ErrSoldOut}, {"already_ordered", ordered, ErrAlreadyOrdered}} {
		b.Run(tc.name, func(b *testing.B) {
			if _, err := s.Seckill(ctx, buyer, tc.voucher); !errors.Is(err, tc.want) { // the first from Redis
				b.Fatalf("Seckill = %v, want %v", err, tc.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Seckill(ctx, buyer, tc.voucher); err != tc.want {
					b.Fatalf("Seckill = %v, want %v", err, tc.want)
				}
			}
		})
	}
}
