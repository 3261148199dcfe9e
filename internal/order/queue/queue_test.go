package queue

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// Reconciliation (Redis' stock set to MySQL's) may run in async mode only
// when the stream holds no unwritten order of the voucher. Its count of
// queued orders says so; and after Redis restarted empty, accept.lua
// recreates the stream before any consumer recreates its group, so a
// stream without the group is never quiet.
func TestQueueQuietOnlyWhenTheVouchersOrdersAreWritten(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	// Two vouchers of one shard: their orders share a stream.
	const v, other = 7, 7 + stock.Shards
	quiet := func(want bool, when string) {
		t.Helper()
		got, err := q.Quiet(ctx, v, 1)
		if err != nil || got != want {
			t.Fatalf("%s: quiet = %v (%v), want %v", when, got, err, want)
		}
	}
	quiet(true, "nothing ever queued")
	rdb.Incr(ctx, Entry{VoucherID: v}.queuedKey())
	quiet(false, "one order of the voucher queued")
	rdb.Decr(ctx, Entry{VoucherID: v}.queuedKey())
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: StreamKey(stock.ShardOf(v)), Values: map[string]any{"id": "1", "voucher": other}})
	rdb.Incr(ctx, Entry{VoucherID: other}.queuedKey())
	quiet(false, "entries in a stream without its group")
	if err := rdb.XGroupCreate(ctx, StreamKey(stock.ShardOf(v)), GroupName, "0").Err(); err != nil {
		t.Fatal(err)
	}
	quiet(true, "only another voucher's order queued")
}

// A pipeline's Exec reports only its first error. When the first command
// answers "no such key" (redis.Nil), a failure of a later one must still
// count: quiet must not say yes because the stream could not be read, and
// a pending order must not read as absent because one shard failed. Here
// the failure is the real server's WRONGTYPE, on a stream key made a
// string.
func TestQueueReadsSeeEveryCommandsError(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	const v = 7
	rdb.Set(ctx, StreamKey(stock.ShardOf(v)), "not a stream", 0)
	if q, err := q.Quiet(ctx, v, 1); err == nil {
		t.Fatalf("quiet = %v with its stream unreadable; want an error", q)
	}
	rdb.Set(ctx, pendingKey(stock.Shards-1), "not a hash", 0)
	if o, _, _, err := q.Find(ctx, 42); err == nil {
		t.Fatalf("Find = %v with a shard unreadable; want an error", o)
	}
}

// A replayed dead letter is in the stream twice until the stream is
// trimmed (its first entry, acknowledged, and the replayed one) under one
// order ID: Queued counts it once, or a reload would take its unit from
// the stock twice.
func TestQueuedCountsAReplayedOrderOnce(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	const v = 7
	shard := stock.ShardOf(v)
	for range 2 {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: StreamKey(shard), Values: map[string]any{"id": "42", "user": "5", "voucher": v, "at": "1700000000000"}})
	}
	rdb.HSet(ctx, pendingKey(shard), "42", "5:7:1700000000000:pending")
	got, err := q.Queued(ctx, v, 1)
	if err != nil || len(got) != 1 || got[0].OrderID != 42 || got[0].UserID != 5 {
		t.Fatalf("Queued = %+v, %v; want order 42 of user 5, once", got, err)
	}
}

// emptyQueue is a Queue on Redis database 15, this package's alone,
// flushed.
func emptyQueue(t *testing.T) (*redis.Client, *Queue) {
	t.Helper()
	rdb := testenv.Redis(t, 15)
	if err := rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb, New(rdb, stock.NewStore(rdb, time.Minute))
}
