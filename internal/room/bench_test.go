package room_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/stock"
)

// The cost of a join against the cost of the cheapest answer the buy
// button gives, a sold-out one (take.lua finding no unit), each one script
// call on one Redis, from many goroutines at once: a join should cost no
// more (BENCHMARKS.md, "The waiting room"):
//
//	go test -run '^$' -bench 'Join|SoldOut' -benchtime 3s ./internal/room/
func BenchmarkJoin(b *testing.B) { benchJoins(b, time.Hour) } // before begin_time: drawn joins

// parallel is the goroutines per core each benchmark keeps asking at
// once: enough to keep Redis busy, so that what is measured is the
// script's cost on the server, not one round trip after another.
const parallel = 32

// BenchmarkJoinAfterBegin is BenchmarkJoin for the joins after the draw,
// numbered in the order they come.
func BenchmarkJoinAfterBegin(b *testing.B) { benchJoins(b, -time.Second) }

// benchJoins joins new users to a room whose sale begins in begin.
func benchJoins(b *testing.B, begin time.Duration) {
	r := newRig(b, 1_000_000, 1000, begin, time.Minute)
	var user atomic.Int64
	b.SetParallelism(parallel)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.store.Join(context.Background(), r.sale, user.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkSoldOut is the yardstick: the stock script answering sold out.
func BenchmarkSoldOut(b *testing.B) {
	r := newRig(b, 0, 1000, -time.Second, time.Minute)
	stocks := stock.NewStore(r.rdb, 15*time.Second)
	var user atomic.Int64
	b.SetParallelism(parallel)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, res, err := stocks.Take(context.Background(), r.sale.VoucherID, 1, user.Add(1)); err != nil || res != stock.SoldOut {
				b.Errorf("%v %v", res, err)
				return
			}
		}
	})
}

// BenchmarkPlace is a waiter's read of their place, as GET .../room and
// a stream's heartbeat make it.
func BenchmarkPlace(b *testing.B) {
	r := newRig(b, 100, 1000, -time.Second, time.Minute)
	for u := int64(1); u <= 1000; u++ {
		if _, err := r.store.Join(context.Background(), r.sale, u); err != nil {
			b.Fatal(err)
		}
	}
	var user atomic.Int64
	b.SetParallelism(parallel)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.store.Place(context.Background(), r.sale, user.Add(1)%1000+1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
