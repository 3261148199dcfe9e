package queue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/room"
	"seckill/internal/stock"
)

// A voucher of units behind a waiting room (package room) on this
// package's Redis, whose sale begins in a moment.
func roomSale(t *testing.T, units int64) (*redis.Client, *Queue, *room.Store, room.Sale) {
	t.Helper()
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	const vid = 4242
	if err := stock.NewStore(rdb, time.Minute).Init(ctx, vid, units, 1); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sale := room.Sale{VoucherID: vid, Begin: now.Add(300 * time.Millisecond), End: now.Add(time.Hour), Stock: units,
		Seed:   []byte("0123456789abcdef0123456789abcdef"),
		Config: room.Config{OpensAt: now.Add(-time.Minute), AdmitPerSecond: 100, HoldFor: time.Minute}}
	return rdb, q, room.NewStore(rdb), sale
}

// deadLetterAll makes the consumer dead-letter every entry of e's stream, as
// MySQL refusing them would.
func deadLetterAll(t *testing.T, rdb *redis.Client, e Entry) {
	t.Helper()
	ctx := context.Background()
	rdb.XGroupCreateMkStream(ctx, StreamKey(e.shard()), GroupName, "0")
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: GroupName, Consumer: "c1", Streams: []string{StreamKey(e.shard()), ">"}, Count: 10}).Result()
	if err != nil || len(res[0].Messages) == 0 {
		t.Fatalf("read the stream: %v", err)
	}
	c := NewConsumer(rdb, nil, time.Now, Config{Consumer: "c1", Shard: e.shard(), Batch: 10, MaxDeliveries: 5}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, m := range res[0].Messages {
		c.deadLetter(ctx, m, errors.New("MySQL refused the entry"), false, false)
	}
}

// A room buyer whose accepted order is dead-lettered (its unit back, the
// buyer forgotten) reads as a hold that ended, and may join again, at the
// back, and buy once admitted.
func TestRoomBuyerDeadLettered(t *testing.T) {
	rdb, q, rooms, sale := roomSale(t, 5)
	ctx := context.Background()
	if _, err := rooms.Join(ctx, sale, 42); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(sale.Begin) + 10*time.Millisecond)
	if _, err := rooms.Admit(ctx, sale); err != nil {
		t.Fatal(err)
	}
	e := Entry{OrderID: 777001, UserID: 42, VoucherID: sale.VoucherID, At: time.Now(), Buckets: 1, Room: true}
	if res, err := q.Accept(ctx, &e); err != nil || res != Queued {
		t.Fatalf("accept: %v %v", res, err)
	}
	if p, _ := rooms.Place(ctx, sale, 42); p.State != room.StateOrdered {
		t.Fatalf("accepted: %s, want ordered", p.State)
	}
	deadLetterAll(t, rdb, e)
	if p, _ := rooms.Place(ctx, sale, 42); p.State != room.StateExpired {
		t.Fatalf("dead-lettered: %s, want expired (the hold ended)", p.State)
	}
	if joined, err := rooms.Join(ctx, sale, 42); err != nil || !joined {
		t.Fatalf("join again: %v %v", joined, err)
	}
	if _, err := rooms.Admit(ctx, sale); err != nil {
		t.Fatal(err)
	}
	e2 := Entry{OrderID: 777002, UserID: 42, VoucherID: sale.VoucherID, At: time.Now(), Buckets: 1, Room: true}
	if res, err := q.Accept(ctx, &e2); err != nil || res != Queued {
		t.Errorf("buy again once admitted: %v %v", res, err)
	}
}

// A replayed dead letter of a room's voucher takes only a unit no admitted
// buyer holds: the dead letter's unit went back, and the room gave it to
// the next number, who must not be told sold out.
func TestRoomReplayLeavesHeldUnits(t *testing.T) {
	rdb, q, rooms, sale := roomSale(t, 1)
	ctx := context.Background()
	for _, u := range []int64{1, 2} {
		if _, err := rooms.Join(ctx, sale, u); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Until(sale.Begin) + 10*time.Millisecond)
	if _, err := rooms.Admit(ctx, sale); err != nil {
		t.Fatal(err)
	}
	order := room.Draw(sale.Seed, []int64{1, 2})
	e := Entry{OrderID: 888001, UserID: order[0], VoucherID: sale.VoucherID, At: time.Now(), Buckets: 1, Room: true}
	if res, err := q.Accept(ctx, &e); err != nil || res != Queued {
		t.Fatalf("accept: %v %v", res, err)
	}
	deadLetterAll(t, rdb, e)
	if _, err := rooms.Admit(ctx, sale); err != nil {
		t.Fatal(err)
	}
	if p, _ := rooms.Place(ctx, sale, order[1]); p.State != room.StateAdmitted {
		t.Fatalf("the next number: %s, want admitted", p.State)
	}
	out, err := q.Replay(ctx, ReplayInput{All: true}, func(context.Context, int64) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	e2 := Entry{OrderID: 888002, UserID: order[1], VoucherID: sale.VoucherID, At: time.Now(), Buckets: 1, Room: true}
	if res, err := q.Accept(ctx, &e2); err != nil || res != Queued {
		t.Errorf("the admitted buyer presses after the replay (%+v): %v %v, want queued", out, res, err)
	}
}
