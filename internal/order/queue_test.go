package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// Two orders with one ID in one batch (Redis lost the day's sequence and
// gave an ID out twice) are a collision, as they would be one INSERT at a
// time: not one row and two answers of 200. The same order twice (an entry
// delivered twice) is one row.
func TestWriteBatchTellsCollisionFromRedelivery(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	ctx := context.Background()
	vid := testenv.ID() % 1_000_000_000
	if err := db.Exec("INSERT INTO vouchers (id, title, stock, initial_stock, begin_time, end_time, created_at) VALUES (?, 't', 10, 10, NOW(), NOW() + INTERVAL 1 HOUR, NOW())", vid).Error; err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	a := Order{ID: 1001, UserID: 1, VoucherID: vid, Status: StatusCreated, CreatedAt: at}
	b := Order{ID: 1001, UserID: 2, VoucherID: vid, Status: StatusCreated, CreatedAt: at}

	outcome, err := Transact(ctx, db, func(tx *gorm.DB) error { return WriteBatch(tx, []Order{a, b}) })
	if outcome != NotWritten || !errors.Is(err, ErrIDCollision) {
		t.Fatalf("one ID for two orders: %v, %v; want not written, an ID collision", outcome, err)
	}
	outcome, err = Transact(ctx, db, func(tx *gorm.DB) error { return WriteBatch(tx, []Order{a, a}) })
	if outcome != Written || err != nil {
		t.Fatalf("one order twice: %v, %v; want written", outcome, err)
	}
	var rows, stock int64
	db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&rows)
	db.Raw("SELECT stock FROM vouchers WHERE id = ?", vid).Scan(&stock)
	if rows != 1 || stock != 9 {
		t.Fatalf("%d rows, stock %d; want 1 and 9", rows, stock)
	}
}

// Reconciliation (Redis' stock set to MySQL's) may run in async mode only
// when the stream holds no unwritten order of the voucher. Its count of
// queued orders says so; and after Redis restarted empty, accept.lua
// recreates the stream before any consumer recreates its group, so a
// stream without the group is never quiet.
func TestQueueQuietOnlyWhenTheVouchersOrdersAreWritten(t *testing.T) {
	rdb := testenv.Redis(t, 15)
	ctx := context.Background()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	m := asyncMode{&Service{rdb: rdb}}
	// Two vouchers of one shard: their orders share a stream.
	const v, other = 7, 7 + stock.Shards
	quiet := func(want bool, when string) {
		t.Helper()
		got, err := m.quiet(ctx, v)
		if err != nil || got != want {
			t.Fatalf("%s: quiet = %v (%v), want %v", when, got, err, want)
		}
	}
	quiet(true, "nothing ever queued")
	rdb.Incr(ctx, QueuedKey(v))
	quiet(false, "one order of the voucher queued")
	rdb.Decr(ctx, QueuedKey(v))
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: StreamKey(stock.ShardOf(v)), Values: map[string]any{"id": "1", "voucher": other}})
	rdb.Incr(ctx, QueuedKey(other))
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
	rdb := testenv.Redis(t, 15)
	ctx := context.Background()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	m := asyncMode{&Service{rdb: rdb}}
	const v = 7
	rdb.Set(ctx, StreamKey(stock.ShardOf(v)), "not a stream", 0)
	if q, err := m.quiet(ctx, v); err == nil {
		t.Fatalf("quiet = %v with its stream unreadable; want an error", q)
	}
	rdb.Set(ctx, PendingKey(stock.Shards-1), "not a hash", 0)
	if o, err := m.accepted(ctx, 42); err == nil {
		t.Fatalf("accepted = %v with a shard unreadable; want an error", o)
	}
}
