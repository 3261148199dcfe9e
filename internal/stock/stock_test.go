package stock_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// newVoucher sets up a voucher with n units on the shared test Redis,
// under an ID no other test uses, and removes its keys afterwards.
func newVoucher(t *testing.T, s *stock.Store, n int64) int64 {
	t.Helper()
	rdb := testenv.Redis(t, 0)
	id := testenv.ID()
	if err := s.Init(context.Background(), id, n, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k := stock.KeysOf(id)
		rdb.Del(context.Background(), k.Stock, k.Buyers, k.Holds, k.Claims)
		rdb.SRem(context.Background(), "seckill:vouchers", id)
	})
	return id
}

func left(t *testing.T, s *stock.Store, id int64) int64 {
	t.Helper()
	n, ok, err := s.Left(context.Background(), id, 1)
	if err != nil || !ok {
		t.Fatalf("left: %d %v %v", n, ok, err)
	}
	return n
}

// 300 users rush 50 units at once, each twice: exactly 50 are taken, each
// by a different user, and nothing is left.
func TestTakeNeverOversells(t *testing.T) {
	s := stock.NewStore(testenv.Redis(t, 0), time.Minute)
	id := newVoucher(t, s, 50)
	var taken atomic.Int64
	buyers := sync.Map{}
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for user := range int64(300) {
		wg.Go(func() {
			<-gate
			for range 2 { // each user tries twice
				_, res, err := s.Take(context.Background(), id, 1, user+1)
				if err != nil {
					t.Error(err)
					return
				}
				if res == stock.Taken {
					taken.Add(1)
					if _, dup := buyers.LoadOrStore(user, true); dup {
						t.Errorf("user %d took two units", user+1)
					}
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	if taken.Load() != 50 || left(t, s, id) != 0 {
		t.Fatalf("taken %d, left %d; want 50 and 0", taken.Load(), left(t, s, id))
	}
}

// A unit goes back exactly once, however many give it back; a confirmed
// hold gives nothing back; a second take by the same user is refused, as
// settled once confirmed and as in progress before.
func TestGiveBackExactlyOnce(t *testing.T) {
	ctx := context.Background()
	s := stock.NewStore(testenv.Redis(t, 0), time.Minute)
	id := newVoucher(t, s, 3)

	if _, res, _ := s.Take(ctx, id, 1, 1); res != stock.Taken {
		t.Fatalf("take: %v", res)
	}
	if _, res, _ := s.Take(ctx, id, 1, 1); res != stock.AlreadyBuying {
		t.Fatalf("second take while the first holds its unit: %v, want AlreadyBuying", res)
	}
	for i, want := range []bool{true, false, false} {
		back, err := s.GiveBack(ctx, stock.Hold{Voucher: id, User: 1, Buckets: 1}, true)
		if err != nil || back != want {
			t.Fatalf("give back #%d: %v %v, want %v", i+1, back, err, want)
		}
	}
	if n := left(t, s, id); n != 3 {
		t.Fatalf("left %d after giving back, want 3", n)
	}

	if _, res, _ := s.Take(ctx, id, 1, 2); res != stock.Taken {
		t.Fatalf("take: %v", res)
	}
	if open, err := s.Confirm(ctx, stock.Hold{Voucher: id, User: 2, Buckets: 1}); err != nil || !open {
		t.Fatalf("confirm: %v %v", open, err)
	}
	if back, _ := s.GiveBack(ctx, stock.Hold{Voucher: id, User: 2, Buckets: 1}, true); back {
		t.Fatal("a confirmed hold gave its unit back")
	}
	if _, res, _ := s.Take(ctx, id, 1, 2); res != stock.AlreadyBought {
		t.Fatalf("take after confirm: %v, want AlreadyBought", res)
	}
	if n := left(t, s, id); n != 2 {
		t.Fatalf("left %d, want 2", n)
	}
}

// Settle returns a unit only once its hold has expired, by the Redis
// server's clock, and only once.
func TestSettleOnlyExpired(t *testing.T) {
	ctx := context.Background()
	// Long enough for the checks before the deadline on a loaded machine.
	const hold = time.Second
	s := stock.NewStore(testenv.Redis(t, 0), hold)
	id := newVoucher(t, s, 1)
	if _, res, _ := s.Take(ctx, id, 1, 7); res != stock.Taken {
		t.Fatalf("take: %v", res)
	}
	taken := time.Now()
	if got, _ := s.Expired(ctx, id, 1, 10); len(got) != 0 {
		t.Fatalf("expired at once: %v", got)
	}
	if back, _ := s.Settle(ctx, id, 1, stock.Lapse{User: 7}, 0); back {
		t.Fatal("reclaimed a hold before its deadline")
	}
	time.Sleep(time.Until(taken.Add(hold + 100*time.Millisecond)))
	if got, _ := s.Expired(ctx, id, 1, 10); len(got) != 1 || got[0] != (stock.Lapse{User: 7}) {
		t.Fatalf("expired: %v, want [7]", got)
	}
	if back, _ := s.Settle(ctx, id, 1, stock.Lapse{User: 7}, 0); !back {
		t.Fatal("did not reclaim an expired hold")
	}
	if back, _ := s.Settle(ctx, id, 1, stock.Lapse{User: 7}, 0); back {
		t.Fatal("reclaimed the same hold twice")
	}
	if n := left(t, s, id); n != 1 {
		t.Fatalf("left %d, want 1", n)
	}
}

// Reconcile corrects a drifted count only at a quiet moment: no hold open,
// nothing moved while the truth was read, and the truth available.
func TestReconcile(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	id := newVoucher(t, s, 10)
	k := stock.KeysOf(id)
	truth := func(n int64) func(context.Context) (int64, error) {
		return func(context.Context) (int64, error) { return n, nil }
	}

	if fixed, err := s.Reconcile(ctx, id, 1, truth(10)); err != nil || fixed {
		t.Fatalf("no drift: fixed %v %v", fixed, err)
	}
	if fixed, err := s.Reconcile(ctx, id, 1, truth(8)); err != nil || !fixed || left(t, s, id) != 8 {
		t.Fatalf("drift: fixed %v %v, left %d", fixed, err, left(t, s, id))
	}
	// A unit taken while the truth is read: the count moved, no change.
	moving := func(context.Context) (int64, error) {
		rdb.Decr(ctx, k.Stock)
		return 5, nil
	}
	if fixed, _ := s.Reconcile(ctx, id, 1, moving); fixed || left(t, s, id) != 7 {
		t.Fatalf("count moved meanwhile: fixed %v, left %d", fixed, left(t, s, id))
	}
	// An open hold: not a quiet moment.
	s.Take(ctx, id, 1, 1)
	if fixed, _ := s.Reconcile(ctx, id, 1, truth(3)); fixed {
		t.Fatal("reconciled with a hold open")
	}
	s.GiveBack(ctx, stock.Hold{Voucher: id, User: 1, Buckets: 1}, true)
	if fixed, err := s.Reconcile(ctx, id, 1, func(context.Context) (int64, error) { return 0, stock.ErrNotNow }); fixed || err != nil {
		t.Fatalf("truth not available: fixed %v, err %v", fixed, err)
	}
}

// A lost stock key is reloaded once: Load refuses when the key is back.
func TestLoadOnlyWhenMissing(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	id := newVoucher(t, s, 5)
	k := stock.KeysOf(id)
	rdb.Del(ctx, k.Stock, k.Buyers)
	if _, res, _ := s.Take(ctx, id, 1, 1); res != stock.Missing {
		t.Fatalf("take with the key lost: %v, want Missing", res)
	}
	if loaded, err := s.Load(ctx, id, 1, 3, []int64{1, 2}, nil, nil); err != nil || !loaded {
		t.Fatalf("load: %v %v", loaded, err)
	}
	if loaded, _ := s.Load(ctx, id, 1, 99, nil, nil, nil); loaded {
		t.Fatal("loaded over an existing key")
	}
	if _, res, _ := s.Take(ctx, id, 1, 2); res != stock.AlreadyBought {
		t.Fatalf("a loaded buyer: %v, want AlreadyBought", res)
	}
	if n := left(t, s, id); n != 3 {
		t.Fatalf("left %d, want 3", n)
	}
}

// A finished sale's keys do not stay in Redis forever: Forget takes the
// voucher off the sweeper's list and lets its keys expire.
func TestForgetLetsKeysExpire(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	ctx := context.Background()
	s := stock.NewStore(rdb, time.Minute)
	id := newVoucher(t, s, 3)
	if _, res, err := s.Take(ctx, id, 1, 1); err != nil || res != stock.Taken {
		t.Fatalf("take: %v %v", res, err)
	}
	extra := stock.KeyOf(id, "accepted")
	rdb.HSet(ctx, extra, "1", "42")
	t.Cleanup(func() { rdb.Del(ctx, extra) })
	if err := s.Forget(ctx, id, 1, time.Hour, extra); err != nil {
		t.Fatal(err)
	}
	ids, err := s.Vouchers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, id) {
		t.Error("still on the sweeper's list")
	}
	k := stock.KeysOf(id)
	for _, key := range []string{k.Stock, k.Buyers, k.Holds, extra} {
		if ttl := rdb.TTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour {
			t.Errorf("%s: TTL %s, want up to an hour", key, ttl)
		}
	}
}

// A cancelled order's unit comes back once: again (a retry, a second
// instance) it changes nothing; while the stock key is missing it waits,
// and a reload that counted it (its order in Load's returned) marks it
// made, so that the return after the reload adds nothing, while a return
// the reload did not count adds its unit.
func TestReturnOncePerOrder(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	id := newVoucher(t, s, 5)
	t.Cleanup(func() { rdb.Del(ctx, stock.KeysOf(id).Returned) })
	ret := func(orders ...int64) []stock.ReturnResult {
		t.Helper()
		var rs []stock.Returned
		for _, o := range orders {
			rs = append(rs, stock.Returned{Order: o})
		}
		res, err := s.Return(ctx, id, 1, rs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if got := ret(1, 2, 1); !slices.Equal(got, []stock.ReturnResult{stock.ReturnAdded, stock.ReturnAdded, stock.ReturnMadeOld}) || left(t, s, id) != 7 {
		t.Fatalf("returns of orders 1, 2, 1: %v, stock %d; want added, added, made before and 7", got, left(t, s, id))
	}
	rdb.Del(ctx, stock.KeysOf(id).Stock) // Redis lost the count
	if got := ret(3); got[0] != stock.ReturnNoStock {
		t.Fatalf("a return while the stock key is missing: %v, want no stock", got)
	}
	// The reload's snapshot counted order 3's return (MySQL's stock has
	// it), not order 4's, committed after the snapshot.
	if loaded, err := s.Load(ctx, id, 1, 8, nil, []stock.Returned{{Order: 3}}, nil); err != nil || !loaded {
		t.Fatalf("load: %v %v", loaded, err)
	}
	if got := ret(3, 4); !slices.Equal(got, []stock.ReturnResult{stock.ReturnMadeOld, stock.ReturnAdded}) || left(t, s, id) != 9 {
		t.Fatalf("returns after the reload: %v, stock %d; want made before, added and 9", got, left(t, s, id))
	}
}
