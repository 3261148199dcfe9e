package queue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// The dead letter of an order whose unit came from an away bucket is two
// scripts in two slots: DropBuyer forgets the buyer at home, then dead.lua
// settles the unit and acknowledges the entry in the bucket's shard. This
// file is what happens when the second one never runs.

// tableWriter is a Writer that keeps what MySQL's part of the story needs:
// the voucher's stock, and one order per user (the unique (user_id,
// voucher_id) index). A batch is one transaction: all written, or none
// and the verdict of the first entry refused.
type tableWriter struct {
	mu      sync.Mutex
	stock   int
	byUser  map[int64]int64 // user -> their order
	written []int64         // order IDs, in the order written
}

func (w *tableWriter) Write(_ context.Context, entries []Entry) (Verdict, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	stock, mine := w.stock, map[int64]int64{}
	for _, e := range entries {
		switch id, ok := w.byUser[e.UserID]; {
		case ok && id == e.OrderID:
			continue // written before: a redelivery
		case ok || mine[e.UserID] != 0:
			return HasOrder, errDuplicate
		case stock == 0:
			return NoStock, errNoStock
		}
		stock--
		mine[e.UserID] = e.OrderID
	}
	w.stock = stock
	for _, e := range entries {
		if mine[e.UserID] == e.OrderID {
			w.byUser[e.UserID] = e.OrderID
			w.written = append(w.written, e.OrderID)
		}
	}
	return Written, nil
}

var (
	errDuplicate = errors.New("duplicate entry for key 'uniq_user_voucher' (MySQL's 1062)")
	errNoStock   = errors.New("no stock left in MySQL for the order")
)

func (w *tableWriter) Probe(context.Context) error { return nil }

func (w *tableWriter) setStock(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stock = n
}

func (w *tableWriter) orders() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.written)
}

// The story, with the network cut at the worst moment. An away buyer's
// order 1001 (home bucket 0, unit of bucket 1) reaches MySQL, which has no
// unit left: it is to be dead-lettered, its unit dropped and its buyer
// forgotten. DropBuyer forgets the buyer at home; then the connection to
// Redis breaks as dead.lua is sent (a proxy resets it: the script never
// runs), and the entry stays pending. The buyer, free at home, buys again:
// order 1002, the last unit of bucket 1. A cancel gives MySQL a unit
// back. The consumer comes back to its pending entry, then reads the new
// one.
//
// The forgetting was the point of no return: once the buyer was told, in
// effect, that order 1001 is gone, it must not be written. Written after
// all, it took MySQL's unit and the buyer's one row, and order 1002, which
// Redis had rightly accepted, was dead-lettered as HasOrder. What must
// hold instead: 1001 is dead-lettered as first decided (its unit dropped),
// 1002 is written, the buyer is remembered at home for it, and nothing is
// left pending or counted queued.
func TestAwayDeadLetterCutBeforeItsScriptStaysDead(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 2, 0)
	u := homedAt(0, 1)[0]
	first := order(1001, u)
	if res, err := q.Accept(ctx, &first); err != nil || res != Queued || first.Bucket != 1 {
		t.Fatalf("Accept = %d, %v, bucket %d; want queued in bucket 1", res, err, first.Bucket)
	}

	// The consumer talks to Redis through a proxy. The first dead.lua it
	// sends cuts every connection before the request is forwarded: the
	// script does not run, and the retries that follow are reset too
	// until Heal.
	proxy := faultproxy.Start(t, testenv.RedisAddr(t))
	through := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: 15})
	t.Cleanup(func() { through.Close() })
	isDead := faultproxy.RedisScript(deadSrc)
	var cut atomic.Bool
	proxy.DropReplyAfter(func(chunk []byte) bool {
		if isDead(chunk) && cut.CompareAndSwap(false, true) {
			proxy.Cut()
		}
		return false // never forwarded as a drop: Cut has reset the connection
	})
	mysql := &tableWriter{stock: 0, byUser: map[int64]int64{}}
	cfg := Config{Consumer: "away-test", Shard: stock.BucketShard(splitVoucher, splitParts, 1), Batch: 10, ClaimIdle: 5 * time.Second, MaxDeliveries: 5}
	p := NewConsumer(through, mysql, time.Now, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := p.ensureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := p.readNew(ctx, 0); err != nil || n != 1 {
		t.Fatalf("readNew = %d, %v; want the one entry", n, err)
	}
	if !cut.Load() {
		t.Fatal("dead.lua was never sent: the entry was not dead-lettered")
	}
	proxy.Heal()
	shard := stock.BucketShard(splitVoucher, splitParts, 1)
	if pend, err := rdb.XPending(ctx, StreamKey(shard), GroupName).Result(); err != nil || pend.Count != 1 {
		t.Fatalf("pending %+v, %v; want the entry still pending (dead.lua never ran)", pend, err)
	}
	if s.buyer(0, u) {
		t.Fatal("the buyer is still remembered at home: DropBuyer did not run before dead.lua")
	}

	// The buyer buys again, and MySQL gets a unit back.
	second := order(1002, u)
	if res, err := q.Accept(ctx, &second); err != nil || res != Queued || second.Bucket != 1 {
		t.Fatalf("buying again = %d, %v, bucket %d; want queued in bucket 1", res, err, second.Bucket)
	}
	mysql.setStock(1)

	// The consumer's next round: its own pending entry first, then the new.
	p.catchUp(ctx)
	if _, err := p.readNew(ctx, 0); err != nil {
		t.Fatal(err)
	}

	awayAtRest(t, rdb, q, s, mysql, shard, u, func(reason string) bool { return strings.Contains(reason, errNoStock.Error()) },
		"the dead letter of 1001 was begun (its buyer forgotten), so 1001 is never written, and 1002 is")
}

// dropBuyerLevel7 is stock.DropBuyer's script as 94b3afe (level 7, the
// oldest version a rolling upgrade starts from) runs it: it forgets the
// buyer and leaves only the mark user -> order ID in the home bucket's
// dropped hash, no note of the entry.
const dropBuyerLevel7 = `
if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 2
end
redis.call('SREM', KEYS[2], ARGV[1])
return 1`

// The same story in the middle of a rolling upgrade from level 7. A
// level-7 consumer reads order 1001 (an away buyer's: home bucket 0, unit
// of bucket 1), finds MySQL without a unit, and begins its dead letter:
// its DropBuyer forgets the buyer at home and leaves its mark alone; then
// its dead.lua fails (the instance is stopped, say), and the entry stays
// pending in that consumer's name. The buyer buys again (order 1002, the
// last unit of bucket 1), a cancel gives MySQL a unit back, and a level-8
// consumer claims the idle entry, then reads the new one.
//
// Finding no note of the entry, the level-8 consumer wrote 1001 (MySQL's
// unit, the buyer's one row) and dead-lettered 1002 as HasOrder: the bug
// of issue 34, through the upgrade. The old mark says as much as the
// note that the buyer was forgotten for 1001, only not why: 1001 must be
// dead-lettered, its unit dropped (the choice that cannot sell a unit
// MySQL lacks), and 1002 written.
func TestAwayDeadLetterBegunByLevel7StaysDead(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 2, 0)
	u := homedAt(0, 1)[0]
	first := order(1001, u)
	if res, err := q.Accept(ctx, &first); err != nil || res != Queued || first.Bucket != 1 {
		t.Fatalf("Accept = %d, %v, bucket %d; want queued in bucket 1", res, err, first.Bucket)
	}
	mysql := &tableWriter{stock: 0, byUser: map[int64]int64{}}
	shard := stock.BucketShard(splitVoucher, splitParts, 1)
	cfg := Config{Consumer: "level-8", Shard: shard, Batch: 10, ClaimIdle: 5 * time.Second, MaxDeliveries: 5}
	p := NewConsumer(rdb, mysql, time.Now, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := p.ensureGroup(ctx); err != nil {
		t.Fatal(err)
	}

	// The level-7 consumer: it reads the entry, and its dead letter stops
	// after DropBuyer. Its entry then lies idle past ClaimIdle (XCLAIM's
	// IDLE sets the time since its last delivery).
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: GroupName, Consumer: "level-7", Streams: []string{StreamKey(shard), ">"}, Count: 1, Block: -1}).Result()
	if err != nil || len(read) != 1 || len(read[0].Messages) != 1 {
		t.Fatalf("the level-7 consumer's read = %v, %v; want order 1001's entry", read, err)
	}
	id := read[0].Messages[0].ID
	home := s.keys(0)
	if n, err := redis.NewScript(dropBuyerLevel7).Run(ctx, rdb, []string{home.Claims, home.Buyers, home.Dropped}, u, 1001).Int(); err != nil || n != 1 {
		t.Fatalf("level 7's DropBuyer = %d, %v; want the buyer forgotten", n, err)
	}
	if err := rdb.Do(ctx, "XCLAIM", StreamKey(shard), GroupName, "level-7", 0, id, "IDLE", 2*cfg.ClaimIdle.Milliseconds()).Err(); err != nil {
		t.Fatal(err)
	}

	second := order(1002, u)
	if res, err := q.Accept(ctx, &second); err != nil || res != Queued || second.Bucket != 1 {
		t.Fatalf("buying again = %d, %v, bucket %d; want queued in bucket 1", res, err, second.Bucket)
	}
	mysql.setStock(1)

	// The level-8 consumer's round: the idle entry claimed, then the new.
	p.claim(ctx)
	if _, err := p.readNew(ctx, 0); err != nil {
		t.Fatal(err)
	}

	awayAtRest(t, rdb, q, s, mysql, shard, u, func(reason string) bool { return reason == errBegunBefore.Error() },
		"level 7 began the dead letter of 1001 (its buyer forgotten), so 1001 is never written, and 1002 is")
}

// awayAtRest checks what both away dead letters leave: MySQL holds order
// 1002 alone, 1001 is the one dead letter (with a reason reason accepts),
// its unit dropped (MySQL had none for it, or its reason is unknown) and
// 1002's taken, the buyer remembered at home, nothing pending or queued,
// and a third purchase refused as already bought. why says why 1001 must
// not be written.
func awayAtRest(t *testing.T, rdb *redis.Client, q *Queue, s split, mysql *tableWriter, shard int, u int64, reason func(string) bool, why string) {
	t.Helper()
	ctx := context.Background()
	if got := mysql.orders(); !slices.Equal(got, []int64{1002}) {
		t.Errorf("MySQL holds orders %v, want [1002]: %s", got, why)
	}
	dead, err := rdb.XRange(ctx, deadKey(shard), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var deadOrders []string
	for _, m := range dead {
		deadOrders = append(deadOrders, field(m, fieldOrder)+" ("+field(m, fieldError)+")")
	}
	if len(dead) != 1 || field(dead[0], fieldOrder) != "1001" || !reason(field(dead[0], fieldError)) {
		t.Errorf("dead letters %q, want order 1001's alone, with its reason", deadOrders)
	}
	if !s.buyer(0, u) {
		t.Error("the buyer of order 1002 is not remembered at home")
	}
	if got := s.stocks(); !slices.Equal(got, []int64{0, 0, 0}) {
		t.Errorf("stocks %v, want [0 0 0]: 1001's unit dropped, 1002's taken", got)
	}
	if pend, err := rdb.XPending(ctx, StreamKey(shard), GroupName).Result(); err != nil || pend.Count != 0 {
		t.Errorf("pending %+v, %v; want none", pend, err)
	}
	if n := s.queued(1); n != 0 {
		t.Errorf("bucket 1 counts %d queued orders, want 0", n)
	}
	if m := rdb.HGet(ctx, pendingKey(shard), "1001").Val(); !strings.HasSuffix(m, ":failed") {
		t.Errorf("order 1001's pending marker %q, want it marked failed", m)
	}
	rdb.Set(ctx, s.keys(0).Stock, 1, 0) // a unit at home, where the buyer is asked first
	third := order(1003, u)
	if res, err := q.Accept(ctx, &third); err != nil || res != AlreadyBought {
		t.Errorf("a third purchase = %d, %v; want already bought (1002 is theirs)", res, err)
	}
}
