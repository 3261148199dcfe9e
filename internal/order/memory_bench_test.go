package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"seckill/internal/testenv"
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
	cfg := DefaultConfig
	cfg.SoldOutMemo = time.Hour // every answer from memory, none from Redis
	s, vouchers := newService(b, testenv.Open(b, testenv.MySQLDSN(b)), testenv.Redis(b, 0), cfg)

	soldOut, ordered := onSale(b, vouchers, 0), onSale(b, vouchers, 10)
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
