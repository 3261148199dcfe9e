package queue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// The queue's side of a voucher split into buckets (package stock,
// buckets.go): where an order whose unit comes from another bucket than
// its buyer's home is queued, what Lost, the dead letters, Replay, Queued
// and Quiet do with it. Every test runs on this package's database 15,
// flushed (emptyQueue), with a voucher of three buckets whose stock is set
// bucket by bucket, so that which bucket a unit must come from is known.

const (
	splitVoucher = 7 // any ID: the database is flushed
	splitParts   = 3
)

// splitStock gives splitVoucher's buckets the units given, one figure per
// bucket, as stock.Init would with its own split.
func splitStock(t *testing.T, q *Queue, rdb *redis.Client, units ...int64) {
	t.Helper()
	ctx := context.Background()
	if err := q.stocks.Init(ctx, splitVoucher, 0, splitParts); err != nil {
		t.Fatal(err)
	}
	for b, n := range units {
		if err := rdb.Set(ctx, stock.BucketKeys(splitVoucher, splitParts, b).Stock, n, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// homedAt returns count user IDs, from 1000 up, whose home bucket of
// splitVoucher is home.
func homedAt(home, count int) []int64 {
	var users []int64
	for u := int64(1000); len(users) < count; u++ {
		if stock.Home(u, splitParts) == home {
			users = append(users, u)
		}
	}
	return users
}

// mustClaim claims user at home for a unit of another bucket of
// splitVoucher, as Accept does once home is empty.
func mustClaim(t *testing.T, q *Queue, user int64) stock.Claimed {
	t.Helper()
	c, res, err := q.stocks.Claim(context.Background(), splitVoucher, splitParts, user)
	if err != nil || res != stock.Taken {
		t.Fatalf("claim: %d, %v", res, err)
	}
	return c
}

// order is a new order of user for splitVoucher, under id.
func order(id, user int64) Entry {
	return Entry{OrderID: id, UserID: user, VoucherID: splitVoucher, At: time.UnixMilli(time.Now().UnixMilli()).UTC(), Buckets: splitParts}
}

// split reads what the tests look at in splitVoucher's buckets.
type split struct {
	t   *testing.T
	rdb *redis.Client
}

func (s split) keys(b int) stock.Keys { return stock.BucketKeys(splitVoucher, splitParts, b) }

func (s split) stock(b int) int64 {
	s.t.Helper()
	n, err := s.rdb.Get(context.Background(), s.keys(b).Stock).Int64()
	if err != nil {
		s.t.Fatalf("stock of bucket %d: %v", b, err)
	}
	return n
}

func (s split) stocks() []int64 {
	s.t.Helper()
	out := make([]int64, splitParts)
	for b := range out {
		out[b] = s.stock(b)
	}
	return out
}

func (s split) buyer(b int, user int64) bool {
	s.t.Helper()
	in, err := s.rdb.SIsMember(context.Background(), s.keys(b).Buyers, user).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return in
}

// claims counts the open claims of every bucket.
func (s split) claims() int64 {
	s.t.Helper()
	var n int64
	for b := range splitParts {
		c, err := s.rdb.ZCard(context.Background(), s.keys(b).Claims).Result()
		if err != nil {
			s.t.Fatal(err)
		}
		n += c
	}
	return n
}

// queued is bucket b's count of orders queued and not yet written.
func (s split) queued(b int) int64 {
	s.t.Helper()
	n, err := s.rdb.Get(context.Background(), Entry{VoucherID: splitVoucher, Buckets: splitParts, Bucket: b}.queuedKey()).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		s.t.Fatal(err)
	}
	return n
}

// stream reads the stream of bucket b's shard.
func (s split) stream(b int) []redis.XMessage {
	s.t.Helper()
	msgs, err := s.rdb.XRange(context.Background(), StreamKey(stock.BucketShard(splitVoucher, splitParts, b)), "-", "+").Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return msgs
}

// dump is every key of the database and its serialized value: two dumps
// are equal only if nothing changed in between.
func dump(t *testing.T, rdb *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		v, err := rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("dump %s: %v", k, err)
		}
		out[k] = v
	}
	return out
}

// A buyer whose home bucket is empty gets a unit of another bucket: the
// order is queued in the stream of that bucket's shard, naming the bucket,
// while the buyer is remembered at home only and the claim that guarded
// the step is closed. The queue can then tell the sweeper that the user
// holds an order (AcceptedOf), and a second request of the user is told
// "already bought" although home is still empty. When every bucket is
// empty the answer is sold out, and nothing is left behind: no buyer and
// no claim that would lock the user out.
//
// It fails if the unit is taken at home or in the wrong bucket, if the
// entry lands in another shard's stream or lacks its bucket, if the buyer
// is remembered in the away bucket (where a second request would never
// look), if the claim stays open, or if a second order gets through.
func TestAcceptTakesAUnitOfAnotherBucketWhenHomeIsEmpty(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	// Home (0) and the next bucket (1) empty: the unit must come from 2.
	splitStock(t, q, rdb, 0, 0, 2)
	u := homedAt(0, 1)[0]

	e := order(101, u)
	res, err := q.Accept(ctx, &e)
	if err != nil || res != Queued {
		t.Fatalf("Accept = %d, %v; want queued", res, err)
	}
	if e.Bucket != 2 {
		t.Errorf("Accept left e.Bucket = %d, want 2 (the bucket that had units)", e.Bucket)
	}
	if got := s.stocks(); !slices.Equal(got, []int64{0, 0, 1}) {
		t.Errorf("stocks %v, want [0 0 1]", got)
	}
	if n := len(s.stream(0)) + len(s.stream(1)); n != 0 {
		t.Errorf("%d entries in the streams of buckets 0 and 1, want none", n)
	}
	msgs := s.stream(2)
	if len(msgs) != 1 {
		t.Fatalf("%d entries in bucket 2's stream, want 1", len(msgs))
	}
	want := map[string]string{"id": "101", "user": strconv.FormatInt(u, 10), "voucher": strconv.Itoa(splitVoucher), "buckets": "3", "bucket": "2"}
	for f, v := range want {
		if got := field(msgs[0], f); got != v {
			t.Errorf("entry field %s = %q, want %q (entry %v)", f, got, v, msgs[0].Values)
		}
	}
	if !s.buyer(0, u) || s.buyer(2, u) {
		t.Errorf("buyer at home %v, in bucket 2 %v; want at home only", s.buyer(0, u), s.buyer(2, u))
	}
	if n := s.claims(); n != 0 {
		t.Errorf("%d claims open after the order was queued, want 0", n)
	}
	if n := s.queued(2); n != 1 {
		t.Errorf("bucket 2 counts %d queued orders, want 1", n)
	}
	found, err := q.AcceptedOf(ctx, splitVoucher, splitParts, []int64{u})
	if err != nil || found[u] != 101 {
		t.Errorf("AcceptedOf = %v, %v; want order 101 of user %d", found, err, u)
	}

	again := order(102, u)
	if res, err := q.Accept(ctx, &again); err != nil || res != AlreadyBought {
		t.Errorf("a second Accept of the buyer = %d, %v; want already bought", res, err)
	}
	if got := s.stocks(); !slices.Equal(got, []int64{0, 0, 1}) {
		t.Errorf("stocks %v after the second Accept, want [0 0 1]", got)
	}
	if n := len(s.stream(2)); n != 1 {
		t.Errorf("%d entries in bucket 2's stream after the second Accept, want 1", n)
	}
	if n := s.claims(); n != 0 {
		t.Errorf("%d claims open after the second Accept, want 0", n)
	}

	// The last unit goes to another user; then everything is empty.
	other, late := homedAt(0, 3)[1], homedAt(0, 3)[2]
	e = order(103, other)
	if res, err := q.Accept(ctx, &e); err != nil || res != Queued || e.Bucket != 2 {
		t.Fatalf("Accept of the last unit = %d, %v, bucket %d; want queued in 2", res, err, e.Bucket)
	}
	e = order(104, late)
	if res, err := q.Accept(ctx, &e); err != nil || res != SoldOut {
		t.Fatalf("Accept with every bucket empty = %d, %v; want sold out", res, err)
	}
	for b := range splitParts {
		if s.buyer(b, late) {
			t.Errorf("the buyer told sold out is remembered in bucket %d", b)
		}
	}
	if n := s.claims(); n != 0 {
		t.Errorf("%d claims open after sold out, want 0", n)
	}
	if found, err := q.AcceptedOf(ctx, splitVoucher, splitParts, []int64{late}); err != nil || found[late] != 0 {
		t.Errorf("AcceptedOf the buyer told sold out = %v, %v; want none", found, err)
	}
}

// A claim that was made but whose unit could not be queued (here: the
// request was declared lost in the away bucket before its script ran, so
// the script answers voided) is dropped, and the buyer forgotten at home:
// the user is not locked out by an order that does not exist.
//
// It fails if Accept leaves the claim open or the buyer remembered after a
// refusal in the away bucket.
func TestAcceptDropsTheClaimWhenTheAwayBucketRefuses(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 1, 0)
	u := homedAt(0, 1)[0]
	e := order(201, u)
	e.Bucket = 1
	if err := rdb.Set(ctx, e.voidKey(), "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	e.Bucket = 0
	if res, err := q.Accept(ctx, &e); err != nil || res != Voided {
		t.Fatalf("Accept = %d, %v; want voided (the mark was set in bucket 1)", res, err)
	}
	if s.buyer(0, u) || s.claims() != 0 || s.stock(1) != 1 {
		t.Errorf("after the refusal: buyer %v, claims %d, bucket 1's stock %d; want no buyer, no claim, 1 unit",
			s.buyer(0, u), s.claims(), s.stock(1))
	}
}

// accept.lua run in an away bucket for a claim whose `until` has passed
// (the request stalled for half a hold after claiming, and the sweeper
// may have forgotten the buyer already) answers Lapsed and changes
// nothing at all: no unit, no entry, no counter, no marker. The same call
// with the claim's own `until` queues the order, so the test sees a
// change when there is one.
//
// It fails if the script ignores ARGV[8], or checks it after it has taken
// the unit or written anything.
func TestAcceptInAnAwayBucketPastTheClaimLapses(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	splitStock(t, q, rdb, 0, 1, 0)
	u := homedAt(0, 1)[0]
	until := mustClaim(t, q, u)
	e := order(301, u)
	e.Bucket = 1

	before := dump(t, rdb)
	res, err := q.run(ctx, e, e.voidKey(), "", time.Now().Add(-time.Second).UnixMilli())
	if err != nil || res != Lapsed {
		t.Fatalf("run past the claim = %d, %v; want lapsed (%d)", res, err, Lapsed)
	}
	if after := dump(t, rdb); !maps.Equal(before, after) {
		t.Errorf("a lapsed run changed Redis:\nbefore %v\nafter  %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}

	if res, err := q.run(ctx, e, e.voidKey(), "", until.Until); err != nil || res != Queued {
		t.Fatalf("run within the claim = %d, %v; want queued", res, err)
	}
	if after := dump(t, rdb); maps.Equal(before, after) {
		t.Error("a queued run changed nothing: the comparison above proves nothing")
	}
}

// Lost after a claim in the home bucket and an away bucket asked:
//   - the script never ran: Lost answers "not accepted", sets the void mark
//     there (the script, arriving late, then answers voided and takes
//     nothing), drops the claim and forgets the buyer;
//   - the script ran, its answer lost: Lost answers the order's ID,
//     closes the claim and keeps the buyer, so that a second request is
//     told "already bought".
//
// It fails if Lost looks in the home bucket instead of the one asked, or
// settles the claim the wrong way round (a buyer kept without an order,
// or forgotten with one).
func TestLostSettlesTheClaimOfAnAwayBucket(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 1, 1)
	users := homedAt(0, 2)

	t.Run("not accepted", func(t *testing.T) {
		s := split{t, rdb}
		u := users[0]
		until, claim, err := q.stocks.Claim(ctx, splitVoucher, splitParts, u)
		if err != nil || claim != stock.Taken || !s.buyer(0, u) || s.claims() != 1 {
			t.Fatalf("claim: %d, %v; buyer %v, claims %d", claim, err, s.buyer(0, u), s.claims())
		}
		e := order(401, u)
		e.Bucket, e.claim = 1, until // as Accept leaves it when the away script's answer is lost
		id, accepted, err := q.Lost(ctx, e)
		if err != nil || accepted || id != 0 {
			t.Fatalf("Lost = %d, %v, %v; want not accepted", id, accepted, err)
		}
		if s.claims() != 0 || s.buyer(0, u) {
			t.Errorf("after Lost: %d claims, buyer %v; want no claim and the buyer forgotten", s.claims(), s.buyer(0, u))
		}
		if res, err := q.run(ctx, e, e.voidKey(), "", until.Until); err != nil || res != Voided {
			t.Errorf("the lost script arriving late = %d, %v; want voided", res, err)
		}
		if n := s.stock(1); n != 1 {
			t.Errorf("bucket 1 has %d units after the voided run, want 1", n)
		}
	})

	t.Run("accepted", func(t *testing.T) {
		s := split{t, rdb}
		u := users[1]
		until := mustClaim(t, q, u)
		e := order(402, u)
		e.Bucket, e.claim = 1, until
		if res, err := q.run(ctx, e, e.voidKey(), "", until.Until); err != nil || res != Queued {
			t.Fatalf("the script (whose answer is lost) = %d, %v; want queued", res, err)
		}
		id, accepted, err := q.Lost(ctx, e)
		if err != nil || !accepted || id != 402 {
			t.Fatalf("Lost = %d, %v, %v; want order 402", id, accepted, err)
		}
		if s.claims() != 0 || !s.buyer(0, u) {
			t.Errorf("after Lost: %d claims, buyer %v; want no claim and the buyer kept", s.claims(), s.buyer(0, u))
		}
		again := order(403, u)
		if res, err := q.Accept(ctx, &again); err != nil || res != AlreadyBought {
			t.Errorf("the buyer again = %d, %v; want already bought (bucket 2 still has a unit)", res, err)
		}
	})
	if got := s.stocks(); !slices.Equal(got, []int64{0, 0, 1}) {
		t.Errorf("stocks %v, want [0 0 1]", got)
	}
}

// verdictWriter is a Writer that answers every write with one verdict,
// and records what it was given.
type verdictWriter struct {
	verdict Verdict
	mu      sync.Mutex
	got     []Entry
}

func (w *verdictWriter) Write(_ context.Context, entries []Entry) (Verdict, error) {
	w.mu.Lock()
	w.got = append(w.got, entries...)
	w.mu.Unlock()
	if w.verdict == Written {
		return Written, nil
	}
	return w.verdict, errors.New("refused by the test's writer")
}

func (w *verdictWriter) Probe(context.Context) error { return nil }

func (w *verdictWriter) entries() []Entry {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.got)
}

// consumerOf is a Consumer of the stream of splitVoucher's bucket b,
// writing through w, with its group created. The tests drive it by hand
// (readNew), one batch at a time.
func consumerOf(t *testing.T, rdb *redis.Client, b int, w Writer) *Consumer {
	t.Helper()
	cfg := Config{Consumer: "bucket-test", Shard: stock.BucketShard(splitVoucher, splitParts, b), Batch: 10, ClaimIdle: 5 * time.Second, MaxDeliveries: 5}
	p := NewConsumer(rdb, w, time.Now, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := p.ensureGroup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// An order whose unit came from an away bucket and that MySQL refuses for
// good is settled where each part of it lives: the unit in the entry's
// bucket (back, or dropped when MySQL had none), the buyer in their home
// bucket (forgotten, or kept when they hold another order), the bucket's
// counters of accepted and queued orders cleared. Replayed, it goes back
// into the same bucket, taking a unit there again, with the buyer claimed
// at home first and the claim closed once queued; a buyer who holds
// another order is told so, and the dead letter stays.
//
// It fails if the unit goes back to the buyer's home, if the buyer stays
// remembered at home (locked out by an order that does not exist) or is
// forgotten while holding another order, if a counter is left at one, or
// if Replay takes its unit elsewhere or leaves a claim open.
func TestDeadLetterOfAnAwayOrderAndItsReplay(t *testing.T) {
	for _, tc := range []struct {
		name       string
		verdict    Verdict
		back, keep bool   // the unit given back; the buyer kept
		replay     string // what Replay says
	}{
		{"refused: unit back, buyer forgotten", IDTaken, true, false, "requeued"},
		{"no stock in MySQL: unit dropped, buyer forgotten", NoStock, false, false, "requeued"},
		{"buyer holds another order: unit back, buyer kept", HasOrder, true, true, "already_ordered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, q := emptyQueue(t)
			ctx := context.Background()
			s := split{t, rdb}
			splitStock(t, q, rdb, 0, 2, 0)
			u := homedAt(0, 1)[0]
			e := order(501, u)
			if res, err := q.Accept(ctx, &e); err != nil || res != Queued || e.Bucket != 1 {
				t.Fatalf("Accept = %d, %v, bucket %d; want queued in bucket 1", res, err, e.Bucket)
			}
			shard := stock.BucketShard(splitVoucher, splitParts, 1)

			w := &verdictWriter{verdict: tc.verdict}
			p := consumerOf(t, rdb, 1, w)
			if n, err := p.readNew(ctx, 0); err != nil || n != 1 {
				t.Fatalf("readNew = %d, %v; want the one entry", n, err)
			}
			wantStock := int64(1)
			if tc.back {
				wantStock = 2
			}
			if got := s.stocks(); !slices.Equal(got, []int64{0, wantStock, 0}) {
				t.Errorf("stocks %v after the dead letter, want [0 %d 0]", got, wantStock)
			}
			if s.buyer(0, u) != tc.keep || s.buyer(1, u) {
				t.Errorf("buyer at home %v (want %v), in bucket 1 %v (want false)", s.buyer(0, u), tc.keep, s.buyer(1, u))
			}
			if n := s.queued(1); n != 0 {
				t.Errorf("bucket 1 counts %d queued orders, want 0", n)
			}
			if found, err := q.AcceptedOf(ctx, splitVoucher, splitParts, []int64{u}); err != nil || found[u] != 0 {
				t.Errorf("AcceptedOf = %v, %v; want no accepted order left", found, err)
			}
			if n := rdb.XLen(ctx, deadKey(shard)).Val(); n != 1 {
				t.Fatalf("%d dead letters in bucket 1's shard, want 1", n)
			}
			if p, err := rdb.XPending(ctx, StreamKey(shard), GroupName).Result(); err != nil || p.Count != 0 {
				t.Errorf("pending entries %+v, %v; want the entry acknowledged", p, err)
			}
			if m := rdb.HGet(ctx, pendingKey(shard), "501").Val(); !strings.HasSuffix(m, ":failed") {
				t.Errorf("pending marker %q, want it marked failed", m)
			}

			restock := func(context.Context, int64) error {
				t.Error("Replay restocked: no key is missing")
				return nil
			}
			out, err := q.Replay(ctx, ReplayInput{All: true}, restock)
			if err != nil || len(out) != 1 || out[0].Result != tc.replay {
				t.Fatalf("Replay = %+v, %v; want one %s", out, err, tc.replay)
			}
			if n := s.claims(); n != 0 {
				t.Errorf("%d claims open after Replay, want 0", n)
			}
			if tc.replay != "requeued" {
				if got := s.stocks(); !slices.Equal(got, []int64{0, wantStock, 0}) {
					t.Errorf("stocks %v after a refused replay, want [0 %d 0]", got, wantStock)
				}
				if n := rdb.XLen(ctx, deadKey(shard)).Val(); n != 1 {
					t.Errorf("%d dead letters after a refused replay, want it kept", n)
				}
				return
			}
			if got := s.stocks(); !slices.Equal(got, []int64{0, wantStock - 1, 0}) {
				t.Errorf("stocks %v after Replay, want [0 %d 0]: its unit taken in bucket 1 again", got, wantStock-1)
			}
			if !s.buyer(0, u) || s.buyer(1, u) {
				t.Errorf("after Replay: buyer at home %v, in bucket 1 %v; want at home only", s.buyer(0, u), s.buyer(1, u))
			}
			if n := rdb.XLen(ctx, deadKey(shard)).Val(); n != 0 {
				t.Errorf("%d dead letters after Replay, want none", n)
			}
			if n := s.queued(1); n != 1 {
				t.Errorf("bucket 1 counts %d queued orders after Replay, want 1", n)
			}
			queued, err := q.Queued(ctx, splitVoucher, splitParts)
			if err != nil || len(queued) != 1 || queued[0].OrderID != 501 || queued[0].Bucket != 1 {
				t.Errorf("Queued after Replay = %+v, %v; want order 501 in bucket 1", queued, err)
			}
			// The consumer now writes it.
			w.mu.Lock()
			w.verdict = Written
			w.mu.Unlock()
			if n, err := p.readNew(ctx, 0); err != nil || n != 1 {
				t.Fatalf("readNew after Replay = %d, %v; want the replayed entry", n, err)
			}
			got := w.entries()
			if last := got[len(got)-1]; last.OrderID != 501 || last.Bucket != 1 || last.Buckets != splitParts {
				t.Errorf("the writer got %+v, want order 501 of bucket 1 of 3", last)
			}
			if n := s.queued(1); n != 0 {
				t.Errorf("bucket 1 counts %d queued orders once written, want 0", n)
			}
		})
	}
}

// Orders of one voucher queued in two buckets (one at the buyer's home,
// one away) wait in two shards' streams: Queued finds both (a reload that
// missed one would sell its unit again), and Quiet says no until the
// queued count of every bucket is back to zero (reconciliation that ran
// early would put the units of orders on their way back on sale). The
// consumers hand each entry to the writer with its bucket, which becomes
// the order row's bucket column.
//
// It fails if Queued or Quiet look at one stream only, or if an entry
// reaches the writer without its bucket.
func TestQueuedAndQuietSeeEveryBucket(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	splitStock(t, q, rdb, 1, 1, 0)
	users := homedAt(0, 2)
	wantBucket := map[int64]int{601: 0, 602: 1}
	for i, u := range users {
		e := order(int64(601+i), u)
		if res, err := q.Accept(ctx, &e); err != nil || res != Queued || e.Bucket != wantBucket[e.OrderID] {
			t.Fatalf("Accept of order %d = %d, %v in bucket %d; want queued in %d", e.OrderID, res, err, e.Bucket, wantBucket[e.OrderID])
		}
	}
	queued, err := q.Queued(ctx, splitVoucher, splitParts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]int{}
	for _, e := range queued {
		got[e.OrderID] = e.Bucket
	}
	if !maps.Equal(got, wantBucket) {
		t.Errorf("Queued = %v (order -> bucket), want %v", got, wantBucket)
	}

	quiet := func(want bool, when string) {
		t.Helper()
		if got, err := q.Quiet(ctx, splitVoucher, splitParts); err != nil || got != want {
			t.Errorf("%s: Quiet = %v, %v; want %v", when, got, err, want)
		}
	}
	// Every bucket's stream has its group: only the counts can say no.
	ws := make([]*verdictWriter, splitParts)
	ps := make([]*Consumer, splitParts)
	for b := range splitParts {
		ws[b] = &verdictWriter{verdict: Written}
		ps[b] = consumerOf(t, rdb, b, ws[b])
	}
	quiet(false, "two orders queued")
	for _, b := range []int{0, 1} {
		if n, err := ps[b].readNew(ctx, 0); err != nil || n != 1 {
			t.Fatalf("bucket %d's consumer read %d, %v; want its one entry", b, n, err)
		}
		w := ws[b].entries()
		if len(w) != 1 || w[0].Bucket != b || w[0].Buckets != splitParts || wantBucket[w[0].OrderID] != b {
			t.Errorf("bucket %d's writer got %+v, want its order with bucket %d of %d", b, w, b, splitParts)
		}
		if b == 0 {
			quiet(false, "bucket 0's order written, bucket 1's still queued")
		}
	}
	quiet(true, "both written")
	if queued, err := q.Queued(ctx, splitVoucher, splitParts); err != nil || len(queued) != 0 {
		t.Errorf("Queued once written = %+v, %v; want none", queued, err)
	}
}

// A race between a request and a consumer. Accept queues an order with a
// unit of an away bucket (accept.lua), then closes the buyer's claim at
// home (KeepClaim), in two round trips. In between, a consumer may read
// the entry, have MySQL refuse it for good, and dead-letter it: the unit
// goes back and the buyer is forgotten at home. KeepClaim, arriving
// after, must not remember them again: they hold no order, and would be
// told "already bought" for good (no claim is left for the sweeper to
// find), and the dead letter could never be replayed. The steps are run
// here one by one, in that order, as Accept and the consumer would.
//
// It fails if KeepClaim adds the buyer back (confirm.lua with remember
// '1') whatever became of the order, or if the dead letter leaves the
// claim open.
func TestDeadLetterBeforeKeepClaimLeavesNoBuyer(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 2, 0)
	u := homedAt(0, 1)[0]

	// Accept, step one: claim at home, queue in bucket 1.
	until := mustClaim(t, q, u)
	e := order(801, u)
	e.Bucket = 1
	if res, err := q.run(ctx, e, e.voidKey(), "", until.Until); err != nil || res != Queued {
		t.Fatalf("accept.lua = %d, %v; want queued", res, err)
	}
	// The consumer, faster: MySQL refuses the order for good.
	p := consumerOf(t, rdb, 1, &verdictWriter{verdict: IDTaken})
	if n, err := p.readNew(ctx, 0); err != nil || n != 1 {
		t.Fatalf("readNew = %d, %v", n, err)
	}
	// Accept, step two.
	if err := q.stocks.KeepClaim(ctx, splitVoucher, splitParts, u, until, e.OrderID); err != nil {
		t.Fatal(err)
	}

	if s.claims() != 0 {
		t.Errorf("%d claims open", s.claims())
	}
	if s.buyer(0, u) {
		t.Error("the buyer is remembered at home, with their only order dead-lettered")
	}
	again := order(802, u)
	if res, err := q.Accept(ctx, &again); err != nil || res != Queued {
		t.Errorf("the buyer tries again: %d, %v; want queued (bucket 1 has units)", res, err)
	}
}

// A claim is named by its deadline. A request that stalled past its claim
// (the sweeper forgot its buyer meanwhile) must not, when it finally
// gives up, drop a newer request's claim of the same user: that request
// would then queue its order with nobody remembered at home, and a third
// request of the user could queue a second order.
//
// It fails if Unclaim (giveback.lua) or KeepClaim (keepclaim.lua) acts on
// whichever claim the user has.
func TestStaleRequestLeavesANewerClaimAlone(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 2, 0)
	u := homedAt(0, 1)[0]
	old := mustClaim(t, q, u)
	// The sweeper forgot the first (expired, no order); a second request
	// claims anew, with a later deadline.
	rdb.ZRem(ctx, s.keys(0).Claims, u)
	rdb.SRem(ctx, s.keys(0).Buyers, u)
	time.Sleep(2 * time.Millisecond)
	newer, claim, err := q.stocks.Claim(ctx, splitVoucher, splitParts, u)
	if err != nil || claim != stock.Taken || newer.Deadline == old.Deadline {
		t.Fatalf("second claim: %+v %d, %v", newer, claim, err)
	}
	// The first request gives up, and would close its claim as kept too.
	if err := q.stocks.Unclaim(ctx, splitVoucher, splitParts, u, old); err != nil {
		t.Fatal(err)
	}
	if err := q.stocks.KeepClaim(ctx, splitVoucher, splitParts, u, old, 900); err != nil {
		t.Fatal(err)
	}
	if s.claims() != 1 || !s.buyer(0, u) {
		t.Fatalf("the stale request touched the newer claim: %d claims, buyer %v", s.claims(), s.buyer(0, u))
	}
	// The newer request queues its order and keeps its claim: a third
	// request of the user is told it bought.
	e := order(901, u)
	e.Bucket, e.claim = 1, newer
	if res, err := q.run(ctx, e, e.voidKey(), "", newer.Until); err != nil || res != Queued {
		t.Fatalf("accept = %d, %v", res, err)
	}
	q.keepClaim(ctx, e)
	third := order(902, u)
	if res, err := q.Accept(ctx, &third); err != nil || res != AlreadyBought {
		t.Errorf("a third request = %d, %v; want already bought", res, err)
	}
}

// The sweeper reads the queue, finds a claimed buyer's order accepted,
// and closes the expired claim keeping the buyer; a consumer may
// dead-letter that order between the two. Forgetting the buyer at home
// (DropBuyer) then finds the claim open and leaves a mark, and the
// sweeper's close must honour it. And DropBuyer made twice for one entry
// (a retry after its answer was lost) forgets once.
//
// It fails if Settle remembers a claimed buyer whatever the mark says, or
// if a second DropBuyer forgets a buyer who bought again since.
func TestSweeperAfterADeadLetterForgetsTheBuyer(t *testing.T) {
	rdb, q := emptyQueue(t)
	ctx := context.Background()
	s := split{t, rdb}
	splitStock(t, q, rdb, 0, 2, 0)
	u := homedAt(0, 1)[0]
	if _, claim, err := q.stocks.Claim(ctx, splitVoucher, splitParts, u); err != nil || claim != stock.Taken {
		t.Fatalf("claim: %d, %v", claim, err)
	}
	rdb.ZAdd(ctx, s.keys(0).Claims, redis.Z{Score: 1, Member: u}) // expired
	// The dead letter of order 950, while the claim is still open.
	if err := stock.DropBuyer(ctx, rdb, splitVoucher, splitParts, u, 950, "1700000000000-0", "back refused"); err != nil {
		t.Fatal(err)
	}
	if !s.buyer(0, u) {
		t.Fatal("DropBuyer forgot the buyer while their request's claim was open")
	}
	// The sweeper, which had found order 950 accepted.
	if _, err := q.stocks.Settle(ctx, splitVoucher, splitParts, stock.Lapse{User: u, Bucket: 0, Claim: true}, 950); err != nil {
		t.Fatal(err)
	}
	if s.claims() != 0 || s.buyer(0, u) {
		t.Fatalf("after the sweep: %d claims, buyer %v; want none, forgotten", s.claims(), s.buyer(0, u))
	}
	// The user buys again (at home: bucket 0 gets a unit back), and the
	// dead letter's step, retried, must not forget them.
	rdb.Set(ctx, s.keys(0).Stock, 1, 0)
	again := order(951, u)
	if res, err := q.Accept(ctx, &again); err != nil || res != Queued {
		t.Fatalf("buy again = %d, %v", res, err)
	}
	if err := stock.DropBuyer(ctx, rdb, splitVoucher, splitParts, u, 950, "1700000000000-0", "back refused"); err != nil {
		t.Fatal(err)
	}
	if !s.buyer(0, u) {
		t.Error("a retried DropBuyer of the old order forgot the buyer of the new one")
	}
}
