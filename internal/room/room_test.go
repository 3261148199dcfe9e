package room_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/room"
	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// The draw's order is frozen by vectors computed apart from this code
// (Python's hmac and hashlib), so that the verifier and the room cannot
// agree on a mistake.
func TestDrawVectors(t *testing.T) {
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = byte(i)
	}
	if got, want := room.Commitment(seed), "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"; got != want {
		t.Errorf("commitment %s, want %s", got, want)
	}
	if got, want := room.Key(seed, 7), "43c875c1027e0bb60b3c5e055d7245befa0322f45d7a0f86cfb578e79a5ce269"; got != want {
		t.Errorf("key of user 7 %s, want %s", got, want)
	}
	users := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 271846193284534273}
	want := []int64{8, 3, 11, 4, 7, 10, 9, 1, 2, 271846193284534273, 6, 12, 5}
	if got := room.Draw(seed, users); !slices.Equal(got, want) {
		t.Errorf("draw %v, want %v", got, want)
	}
}

// rig is a voucher's room on the real Redis: its stock keys and a sale
// that begins after begin.
type rig struct {
	rdb   *redis.Client
	store *room.Store
	sale  room.Sale
}

func newRig(t testing.TB, units int64, rate int, begin time.Duration, hold time.Duration) *rig {
	t.Helper()
	return newRigOn(t, testenv.Redis(t, 0), units, rate, begin, hold)
}

// newRigOn is newRig on the Redis rdb.
func newRigOn(t testing.TB, rdb *redis.Client, units int64, rate int, begin time.Duration, hold time.Duration) *rig {
	t.Helper()
	id := testenv.ID()
	stocks := stock.NewStore(rdb, 15*time.Second)
	if err := stocks.Init(context.Background(), id, units, 1); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	seed := []byte(testenv.Name("seed-0123456789abcdef0123456789"))[:32]
	r := &rig{rdb: rdb, store: room.NewStore(rdb), sale: room.Sale{
		VoucherID: id, Begin: now.Add(begin), End: now.Add(time.Hour), Stock: units, Seed: seed,
		Config: room.Config{OpensAt: now.Add(-time.Minute), AdmitPerSecond: rate, HoldFor: hold},
	}}
	t.Cleanup(func() {
		keys, _ := rdb.Keys(context.Background(), stock.KeyOf(id, "*")).Result()
		if len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	})
	return r
}

func (r *rig) place(t *testing.T, user int64) room.Place {
	t.Helper()
	p, err := r.store.Place(context.Background(), r.sale, user)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// untilBegin sleeps until the sale's begin_time.
func (r *rig) untilBegin() { time.Sleep(time.Until(r.sale.Begin) + 5*time.Millisecond) }

// Everyone who joins before begin_time is numbered at begin_time in the
// draw's order, which the verifier recomputes; who joins after is numbered
// after them in the order of joining. Joining again keeps the place.
func TestDrawNumbersTheLine(t *testing.T) {
	r := newRig(t, 5, 1, 700*time.Millisecond, time.Minute)
	ctx := context.Background()
	var early []int64
	var wg sync.WaitGroup
	for u := int64(1); u <= 60; u++ {
		early = append(early, u)
		wg.Go(func() {
			if joined, err := r.store.Join(ctx, r.sale, u); err != nil || !joined {
				t.Errorf("user %d joins: %t %v", u, joined, err)
			}
		})
	}
	wg.Wait()
	// A join answers the joiner's place from the same script: the place a
	// read gives after it (here before the draw; after it, below).
	early = append(early, 61)
	if joined, got, err := r.store.JoinPlace(ctx, r.sale, 61); err != nil || !joined || !reflect.DeepEqual(got, r.place(t, 61)) {
		t.Errorf("user 61 joins before the draw: %t %v, answered %s, a read %s", joined, err, show(got), show(r.place(t, 61)))
	}
	if p := r.place(t, 1); p.State != room.StateWaiting || p.Number != nil || p.Ahead != nil {
		t.Errorf("before the draw: %+v, want waiting without a number", p)
	}
	if joined, err := r.store.Join(ctx, r.sale, 1); err != nil || joined {
		t.Errorf("joining again: %t %v, want the same place", joined, err)
	}
	r.untilBegin()
	for _, u := range []int64{101, 102, 103} {
		if joined, err := r.store.Join(ctx, r.sale, u); err != nil || !joined {
			t.Fatalf("late user %d joins: %t %v", u, joined, err)
		}
	}
	want := append(room.Draw(r.sale.Seed, early), 101, 102, 103)
	for i, u := range want {
		p := r.place(t, u)
		if p.Number == nil || *p.Number != strconv.Itoa(i+1) {
			t.Errorf("user %d: number %v, want %d", u, p.Number, i+1)
		}
	}
	// After the draw: a new joiner, the same joining again, and one of
	// the drawn joining again.
	for _, u := range []int64{104, 104, early[7]} {
		joined, got, err := r.store.JoinPlace(ctx, r.sale, u)
		if err != nil {
			t.Fatalf("user %d joins: %v", u, err)
		}
		if p := r.place(t, u); !reflect.DeepEqual(got, p) || got.Number == nil {
			t.Errorf("user %d (joined now: %t): the join answered %s, a read %s", u, joined, show(got), show(p))
		}
	}
}

func show(p room.Place) string { b, _ := json.Marshal(p); return string(b) }

// admitted reads the users the room admitted, by number.
func (r *rig) admitted(t *testing.T, users []int64) map[int64]int64 {
	t.Helper()
	out := map[int64]int64{}
	for _, u := range users {
		p := r.place(t, u)
		if p.State == room.StateAdmitted || p.State == room.StateExpired || p.State == room.StateOrdered {
			n, _ := strconv.ParseInt(*p.Number, 10, 64)
			out[n] = u
		}
	}
	return out
}

// Several admitters at once, called far more often than needed, admit at
// the room's rate, in number order, and never more than the units.
func TestAdmissionRateOrderAndStock(t *testing.T) {
	const units, rate = 30, 8
	r := newRig(t, units, rate, 300*time.Millisecond, time.Minute)
	ctx := context.Background()
	var users []int64
	for u := int64(1); u <= 100; u++ {
		users = append(users, u)
		if _, err := r.store.Join(ctx, r.sale, u); err != nil {
			t.Fatal(err)
		}
	}
	r.untilBegin()
	start := time.Now()
	var mu sync.Mutex
	var calls []room.Admission
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				a, err := r.store.Admit(ctx, r.sale)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				calls = append(calls, a)
				mu.Unlock()
			}
		})
	}
	// Sample the count admitted: at every moment within rate*(t+1).
	for time.Since(start) < 2500*time.Millisecond {
		time.Sleep(100 * time.Millisecond)
		elapsed := time.Since(start).Seconds()
		mu.Lock()
		var n int64
		for _, c := range calls {
			n += c.Admitted
		}
		mu.Unlock()
		if bound := int64(float64(rate) * (elapsed + 1)); n > bound {
			t.Fatalf("%d admitted %.2f s after the start, over the bound %d", n, elapsed, bound)
		}
	}
	close(stop)
	wg.Wait()
	got := r.admitted(t, users)
	// 2.5 s at 8 a second, with a first second's burst: 8 * 3.5 = 28 at
	// most, and at least the rate's worth a second since the start.
	if len(got) < rate*2 || len(got) > units {
		t.Fatalf("%d admitted after 2.5 s at %d a second, %d units", len(got), rate, units)
	}
	for n := int64(1); n <= int64(len(got)); n++ {
		if _, ok := got[n]; !ok {
			t.Fatalf("admitted %v: number %d skipped", got, n)
		}
	}
}

// The room never holds more units than there are: with 3 units and a high
// rate, 3 are admitted and the rest are told sold_out; when a hold ends
// without an order, its unit goes to the next number; a buyer whose hold
// ended may join again, at the back.
func TestHoldsNeverExceedStock(t *testing.T) {
	r := newRig(t, 3, 1000, 100*time.Millisecond, room.MinHoldFor)
	ctx := context.Background()
	for u := int64(1); u <= 6; u++ {
		if _, err := r.store.Join(ctx, r.sale, u); err != nil {
			t.Fatal(err)
		}
	}
	r.untilBegin()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := r.store.Admit(ctx, r.sale); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	order := room.Draw(r.sale.Seed, []int64{1, 2, 3, 4, 5, 6})
	for i, u := range order {
		p := r.place(t, u)
		want := room.StateAdmitted
		if i >= 3 {
			want = room.StateSoldOut
		}
		if p.State != want {
			t.Errorf("number %d (user %d): %s, want %s", i+1, u, p.State, want)
		}
	}
	if _, err := r.store.Join(ctx, r.sale, 99); err != room.ErrSoldOut {
		t.Errorf("a new join while every unit is held: %v, want sold out", err)
	}
	// The holds end: the next three are admitted, and the first three may
	// join again, at the back.
	time.Sleep(room.MinHoldFor + 100*time.Millisecond)
	a, err := r.store.Admit(ctx, r.sale)
	if err != nil {
		t.Fatal(err)
	}
	// Counted once, whichever instance's call saw them end; and the
	// drawn buyers waited from begin_time.
	if a.Ended != 3 || len(a.Waits) != 3 || a.Waits[0] < room.MinHoldFor {
		t.Errorf("the second round: %d holds ended, waits %v; want 3 ended and 3 waits past the first holds", a.Ended, a.Waits)
	}
	if again, _ := r.store.Admit(ctx, r.sale); again.Ended != 0 {
		t.Errorf("the same ended holds counted again: %d", again.Ended)
	}
	for i, u := range order {
		p := r.place(t, u)
		want := room.StateExpired
		if i >= 3 {
			want = room.StateAdmitted
		}
		if p.State != want {
			t.Errorf("after the holds ended, number %d (user %d): %s, want %s", i+1, u, p.State, want)
		}
	}
	if _, err := r.store.Join(ctx, r.sale, order[0]); err != room.ErrSoldOut {
		t.Errorf("an expired buyer joins while every unit is held: %v, want sold out", err)
	}
	// A unit comes back (an order cancelled): the expired buyer joins
	// again, at the back, and the join answers the place a read gives.
	if err := r.rdb.Incr(ctx, stock.KeysOf(r.sale.VoucherID).Stock).Err(); err != nil {
		t.Fatal(err)
	}
	joined, got, err := r.store.JoinPlace(ctx, r.sale, order[0])
	if p := r.place(t, order[0]); err != nil || !joined || got.State != room.StateWaiting || !reflect.DeepEqual(got, p) {
		t.Errorf("an expired buyer joins again: %t %v, answered %s, a read %s; want the same waiting place", joined, err, show(got), show(p))
	}
}

// The buy button of a room's voucher (stock.TakeAdmitted, sync mode's
// take) sells to admitted buyers only, in the script that takes the unit:
// a buyer pressing many times at once takes one unit; a request that
// fails leaves its buyer admitted; the written order ends the hold.
func TestTakeOnlyAdmitted(t *testing.T) {
	r := newRig(t, 2, 1000, 100*time.Millisecond, time.Minute)
	ctx := context.Background()
	stocks := stock.NewStore(r.rdb, 15*time.Second)
	for _, u := range []int64{1, 2} {
		if _, err := r.store.Join(ctx, r.sale, u); err != nil {
			t.Fatal(err)
		}
	}
	if _, res, err := stocks.TakeAdmitted(ctx, r.sale.VoucherID, 1); err != nil || res != stock.NotAdmitted {
		t.Fatalf("before admission: %v %v, want not admitted", res, err)
	}
	r.untilBegin()
	if _, err := r.store.Admit(ctx, r.sale); err != nil {
		t.Fatal(err)
	}
	if _, res, _ := stocks.TakeAdmitted(ctx, r.sale.VoucherID, 3); res != stock.NotAdmitted {
		t.Errorf("a user never in line: %v, want not admitted", res)
	}
	// User 1 presses ten times at once: one unit.
	var wg sync.WaitGroup
	var mu sync.Mutex
	results := map[stock.Result]int{}
	var hold stock.Hold
	for range 10 {
		wg.Go(func() {
			h, res, err := stocks.TakeAdmitted(ctx, r.sale.VoucherID, 1)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			results[res]++
			if res == stock.Taken {
				hold = h
			}
		})
	}
	wg.Wait()
	if results[stock.Taken] != 1 || results[stock.AlreadyBuying] != 9 {
		t.Fatalf("ten presses at once: %v, want one taken and nine already buying", results)
	}
	// Its write failed: the unit goes back, and the buyer is still
	// admitted, to try again.
	if _, err := stocks.GiveBack(ctx, hold, true); err != nil {
		t.Fatal(err)
	}
	if p := r.place(t, 1); p.State != room.StateAdmitted {
		t.Fatalf("after a failed write: %s, want still admitted", p.State)
	}
	h, res, err := stocks.TakeAdmitted(ctx, r.sale.VoucherID, 1)
	if err != nil || res != stock.Taken {
		t.Fatalf("again: %v %v", res, err)
	}
	if _, err := stocks.Confirm(ctx, h); err != nil {
		t.Fatal(err)
	}
	if p := r.place(t, 1); p.State != room.StateOrdered || p.AdmittedUntil != nil {
		t.Errorf("after the order: %+v, want ordered, the hold ended", p)
	}
	if _, err := r.store.Join(ctx, r.sale, 1); err != room.ErrAlreadyOrdered {
		t.Errorf("a buyer with an order joins: %v, want already ordered", err)
	}
	// User 2 holds the other unit: never told sold out.
	if _, res, _ := stocks.TakeAdmitted(ctx, r.sale.VoucherID, 2); res != stock.Taken {
		t.Errorf("the second admitted buyer: %v, want taken", res)
	}
}

// A room whose stock key Redis lost (restarted empty, a failover that
// dropped recent writes) answers no figures rather than a stock of 0: read
// as 0, every waiter would have been told sold out until a reload.
func TestPlaceWithTheStockLost(t *testing.T) {
	r := newRig(t, 5, 1, -time.Second, time.Minute)
	ctx := context.Background()
	if _, err := r.store.Join(ctx, r.sale, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.rdb.Del(ctx, stock.KeysOf(r.sale.VoucherID).Stock).Err(); err != nil {
		t.Fatal(err)
	}
	if p, err := r.store.Place(ctx, r.sale, 1); !errors.Is(err, room.ErrStockMissing) {
		t.Errorf("a waiter's place with the stock key gone: %+v, %v; want ErrStockMissing", p, err)
	}
	if v, err := r.store.View(ctx, r.sale); !errors.Is(err, room.ErrStockMissing) {
		t.Errorf("the room's figures with the stock key gone: %+v, %v; want ErrStockMissing", v, err)
	}
}

// A Redis that is full refuses writes, and a script's first write with
// them; one already in line who joins again is still answered their place
// (joining again is safe), while a new joiner is refused (503), not given
// a place half written. On a private redis-server: a maxmemory of 1 byte
// would refuse every other test's writes on the shared one.
func TestJoinAgainWhenRedisIsFull(t *testing.T) {
	rdb := testenv.StartRedis(t).Client(t)
	ctx := context.Background()
	for _, begin := range []time.Duration{time.Hour, -time.Second} {
		r := newRigOn(t, rdb, 10, 1, begin, time.Minute)
		if _, err := r.store.Join(ctx, r.sale, 1); err != nil {
			t.Fatal(err)
		}
		before := r.place(t, 1)
		if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		joined, got, err := r.store.JoinPlace(ctx, r.sale, 1)
		_, _, errNew := r.store.JoinPlace(ctx, r.sale, 2)
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
		if err != nil || joined || !reflect.DeepEqual(got, before) {
			t.Errorf("begin in %v, Redis full: joining again answered %t %v %s, want the place held, %s", begin, joined, err, show(got), show(before))
		}
		if errNew == nil {
			t.Errorf("begin in %v, Redis full: a new joiner was given a place", begin)
		}
		if p := r.place(t, 2); p.State != room.StateNone {
			t.Errorf("begin in %v: the refused joiner holds %s", begin, show(p))
		}
	}

	// The same in one call with new joiners: a call out (held by the hook)
	// while user 1 and ten new joiners queue, who then go together.
	r := newRigOn(t, rdb, 10, 1, -time.Second, time.Minute)
	if _, err := r.store.Join(ctx, r.sale, 1); err != nil {
		t.Fatal(err)
	}
	before := r.place(t, 1)
	hook := &scriptHook{}
	rdb.AddHook(hook)
	gate := make(chan struct{})
	hook.gate.Store(&gate)
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { r.store.JoinPlace(ctx, r.sale, 100) }) // the call out
	time.Sleep(200 * time.Millisecond)
	var got room.Place
	var err error
	errs := make([]error, 10)
	wg.Go(func() { _, got, err = r.store.JoinPlace(ctx, r.sale, 1) })
	for i := range errs {
		wg.Go(func() { _, _, errs[i] = r.store.JoinPlace(ctx, r.sale, int64(200+i)) })
	}
	time.Sleep(500 * time.Millisecond) // all queued behind the call out
	hook.gate.Store(nil)
	close(gate)
	wg.Wait()
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if calls := hook.calls.Load(); calls != 2 {
		t.Fatalf("%d script calls, want 2: the call out, then the eleven together", calls)
	}
	if err != nil || !reflect.DeepEqual(got, before) {
		t.Errorf("Redis full, with new joiners in the call: joining again answered %v %s, want %s", err, show(got), show(before))
	}
	for i, err := range errs {
		if err == nil {
			t.Errorf("Redis full: new joiner %d was given a place", 200+i)
		}
		if p := r.place(t, int64(200+i)); p.State != room.StateNone {
			t.Errorf("the refused joiner %d holds %s", 200+i, show(p))
		}
	}
}
