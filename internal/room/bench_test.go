package room_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// The cost of a join against the cost of the cheapest answer the buy
// button gives, a sold-out one (take.lua finding no unit), each one script
// call on one Redis, from many goroutines at once: a join should cost no
// more (BENCHMARKS.md, "The waiting room"):
//
//	go test -run '^$' -bench 'Join|SoldOut' -benchtime 3s ./internal/room/
//
// Each reports redis-µs/op, the Redis server's CPU (user and system, its
// main thread: INFO cpu) per operation, which counts what a call costs
// beyond running its commands (reading it off the socket, writing the
// reply). Point SECKILL_TEST_REDIS_ADDR at a Redis no one else uses for
// it to mean anything.
func BenchmarkJoin(b *testing.B) { benchJoins(b, time.Hour) } // before begin_time: drawn joins

// parallel is the goroutines per core each benchmark keeps asking at
// once: enough to keep Redis busy, so that what is measured is the
// script's cost on the server, not one round trip after another.
const parallel = 32

// BenchmarkJoinAfterBegin is BenchmarkJoin for the joins after the draw,
// numbered in the order they come, once the sale has sold (a join then
// looks its user up among the buyers).
func BenchmarkJoinAfterBegin(b *testing.B) { benchJoins(b, -time.Second) }

// benchJoins joins new users to a room whose sale begins in begin.
func benchJoins(b *testing.B, begin time.Duration) {
	r := newRig(b, 1_000_000, 1000, begin, time.Minute)
	if begin < 0 {
		if err := r.rdb.SAdd(context.Background(), stock.KeysOf(r.sale.VoucherID).Buyers, "-1").Err(); err != nil {
			b.Fatal(err)
		}
	}
	var user atomic.Int64
	b.SetParallelism(parallel)
	defer redisCPU(b, r.rdb)()
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
	defer redisCPU(b, r.rdb)()
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
	defer redisCPU(b, r.rdb)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.store.Place(context.Background(), r.sale, user.Add(1)%1000+1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// redisCPU starts counting the Redis server's CPU; the function it returns
// reports it per operation.
func redisCPU(b *testing.B, rdb *redis.Client) func() {
	b.Helper()
	read := func() float64 {
		info, err := rdb.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var sum float64
		for _, line := range strings.Split(info, "\r\n") {
			name, v, _ := strings.Cut(line, ":")
			if name == "used_cpu_user_main_thread" || name == "used_cpu_sys_main_thread" {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("%s: %v", line, err)
				}
				sum += f
			}
		}
		return sum
	}
	before := read()
	b.ResetTimer()
	return func() {
		b.StopTimer()
		b.ReportMetric((read()-before)*1e6/float64(b.N), "redis-µs/op")
	}
}
