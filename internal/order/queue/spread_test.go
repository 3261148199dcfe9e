package queue_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// Async mode's half of stock's TestBucketsSpreadOverMasters: on a cluster
// of three masters, a voucher of three buckets queues each order in the
// stream of its bucket's shard, on that bucket's master, so a crowd of
// distinct users spreads the accept scripts evenly: each master runs a
// third of them, within 5% of a third. With one bucket (or if accept.lua
// queued every order in the voucher's own shard), one master would run
// them all.
func TestBucketsSpreadOverMasters(t *testing.T) {
	c := testenv.StartCluster(t)
	rdb := c.Client(t)
	s := stock.NewStore(rdb, time.Minute)
	q := queue.New(rdb, s)
	ctx := context.Background()
	const n = 3
	id := testenv.ID()
	if err := s.Init(ctx, id, 1_000_000, n); err != nil {
		t.Fatal(err)
	}
	streams := map[string]bool{}
	for b := range n {
		streams[c.MasterOf(t, queue.StreamKey(stock.BucketShard(id, n, b))).Addr()] = true
	}
	if len(streams) != 3 {
		t.Fatalf("the buckets' streams are on %d masters, want 3", len(streams))
	}
	c.ResetStats(t)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for u := next.Add(1); u <= 12_000; u = next.Add(1) {
				e := queue.Entry{OrderID: u, UserID: u, VoucherID: id, At: time.Now(), Buckets: n}
				if res, err := q.Accept(ctx, &e); err != nil || res != queue.Queued {
					t.Errorf("accept: %v %v", res, err)
					return
				}
			}
		})
	}
	wg.Wait()
	testenv.EvenShares(t, c.ScriptCalls(t))
}

// BenchmarkBucketedAccept queues orders of a hot voucher of one and of
// three buckets on a three-master cluster, every order a new user's, and
// reports the busiest master's share of the script calls: async mode's
// counterpart of stock's BenchmarkBucketedTake.
//
//	SECKILL_TEST_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench BenchmarkBucketedAccept ./internal/order/queue/
func BenchmarkBucketedAccept(b *testing.B) {
	c := testenv.StartCluster(b)
	rdb := c.Client(b)
	s := stock.NewStore(rdb, time.Minute)
	q := queue.New(rdb, s)
	ctx := context.Background()
	var ids atomic.Int64
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			id := testenv.ID()
			if err := s.Init(ctx, id, math.MaxInt32, n); err != nil {
				b.Fatal(err)
			}
			c.ResetStats(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					u := ids.Add(1)
					e := queue.Entry{OrderID: u, UserID: u, VoucherID: id, At: time.Now(), Buckets: n}
					if res, err := q.Accept(ctx, &e); err != nil || res != queue.Queued {
						b.Errorf("accept: %v %v", res, err)
						return
					}
				}
			})
			b.StopTimer()
			var total, most int64
			for _, v := range c.ScriptCalls(b) {
				total += v
				most = max(most, v)
			}
			b.ReportMetric(float64(most)/float64(max(total, 1)), "busiest-master-share")
		})
	}
}
