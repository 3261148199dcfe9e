package order

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// 120 users, released at once, each press twice for each of two vouchers
// of 30 units (one in one bucket, one in three, where most buyers of a
// home bucket sold out take units of another): the group commit writes
// them in batches and closes each batch's holds with one script per
// shard (writer.go, closeHolds). The moment the last request has
// answered, and without waiting for anything:
//   - no oversell, nobody twice: at most 30 orders a voucher, one a user;
//   - every success is a row, of its user, with the ID it was answered,
//     and every row was answered as a success;
//   - Redis' stock + orders = initial = MySQL's stock + orders;
//   - every hold and claim is closed, and every buyer is remembered at
//     home (take.lua remembers them already; this checks that nothing
//     undid it).
//
// And each success, as it is answered, finds its hold closed: a 200
// leaves only once its batch's holds are (each batch's confirm is slowed
// by 50 ms, so that one answered sooner would see its hold open).
//
// It fails if a batch's holds are closed after its requests answer, or
// not at all, or in the wrong buckets; and if no batch of two or more
// was committed, since then it tested nothing of the batches.
func TestGroupCommitClosesEveryHold(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	// Every batch's confirm takes 50 ms longer: a request that answered
	// before its batch's holds were closed would find its hold open.
	var slowed atomic.Int64 // batches slowed: none would leave the check below blind
	rdb.AddHook(newAtConfirmAll(t, func(_ context.Context, _ []int64, send func() error) error {
		slowed.Add(1)
		time.Sleep(50 * time.Millisecond)
		return send()
	}))
	t.Cleanup(func() {
		if slowed.Load() == 0 {
			t.Error("no confirmall.lua went through the hook: the 50 ms slow-down never applied")
		}
	})
	db := testenv.Open(t, testenv.MySQLDSN(t))
	cfg := DefaultConfig
	obs := &batches{}
	cfg.Observer = obs
	s, vouchers := newService(t, db, rdb, cfg)
	const users, units = 120, 30
	type sale struct {
		id      int64
		buckets int
		won     sync.Map // user -> order ID
	}
	sales := []*sale{{buckets: 1}, {buckets: 3}}
	for _, v := range sales {
		v.id = onSaleIn(t, vouchers, units, v.buckets)
	}
	var other atomic.Int64 // answers neither success nor a refusal a sale expects
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for u := int64(1); u <= users; u++ {
		for _, v := range sales {
			for range 2 {
				wg.Go(func() {
					<-gate
					id, err := s.Seckill(context.Background(), u, v.id)
					switch {
					case err == nil:
						if prev, dup := v.won.LoadOrStore(u, id); dup {
							t.Errorf("voucher %d: user %d won twice, orders %d and %d", v.id, u, prev, id)
						}
						for b := range v.buckets {
							k := stock.BucketKeys(v.id, v.buckets, b)
							if rdb.ZScore(context.Background(), k.Holds, strconv.FormatInt(u, 10)).Err() == nil ||
								rdb.ZScore(context.Background(), k.Claims, strconv.FormatInt(u, 10)).Err() == nil {
								t.Errorf("voucher %d: user %d answered with their hold in bucket %d open", v.id, u, b)
							}
						}
					case errors.Is(err, ErrSoldOut), errors.Is(err, ErrAlreadyOrdered), errors.Is(err, ErrBusy):
					default:
						other.Add(1)
						t.Errorf("user %d, voucher %d: %v", u, v.id, err)
					}
				})
			}
		}
	}
	close(gate)
	wg.Wait()

	ctx := context.Background()
	for _, v := range sales {
		holds := int64(0)
		for b := range v.buckets {
			k := stock.BucketKeys(v.id, v.buckets, b)
			holds += rdb.ZCard(ctx, k.Holds).Val() + rdb.ZCard(ctx, k.Claims).Val()
		}
		if holds != 0 {
			t.Errorf("voucher of %d buckets: %d holds and claims open once every request answered", v.buckets, holds)
		}
		rows := ordersOfVoucher(t, db, v.id)
		won := map[int64]int64{}
		v.won.Range(func(u, id any) bool { won[u.(int64)] = id.(int64); return true })
		if len(rows) > units {
			t.Errorf("voucher of %d buckets: %d orders of %d units", v.buckets, len(rows), units)
		}
		if len(won) != len(rows) {
			t.Errorf("voucher of %d buckets: %d successes, %d rows", v.buckets, len(won), len(rows))
		}
		for u, id := range won {
			if rows[u] != id {
				t.Errorf("voucher of %d buckets: user %d answered order %d, MySQL holds %d", v.buckets, u, id, rows[u])
			}
			if home := stock.BucketKeys(v.id, v.buckets, stock.Home(u, v.buckets)); !rdb.SIsMember(ctx, home.Buyers, u).Val() {
				t.Errorf("voucher of %d buckets: buyer %d not remembered at home", v.buckets, u)
			}
		}
		redisLeft, ok, err := s.stocks.Left(ctx, v.id, v.buckets)
		if err != nil || !ok {
			t.Fatalf("stock in Redis: %v %v", ok, err)
		}
		var mysqlLeft int64
		db.Raw("SELECT stock FROM vouchers WHERE id = ?", v.id).Scan(&mysqlLeft)
		if redisLeft+int64(len(rows)) != units || mysqlLeft+int64(len(rows)) != units {
			t.Errorf("voucher of %d buckets: Redis %d and MySQL %d left, %d orders, of %d", v.buckets, redisLeft, mysqlLeft, len(rows), units)
		}
		if len(rows) < units && other.Load() == 0 {
			t.Errorf("voucher of %d buckets: %d of %d units sold to %d users pressing", v.buckets, len(rows), units, users)
		}
	}
	sizes := obs.commits()
	t.Logf("batches committed: %v", sizes)
	if slices.Max(append(sizes, 0)) < 2 {
		t.Errorf("no batch of two or more committed (%v): nothing tested the batches' confirm", sizes)
	}
}

// ordersOfVoucher is the voucher's orders in MySQL, by user.
func ordersOfVoucher(t *testing.T, db *gorm.DB, voucherID int64) map[int64]int64 {
	t.Helper()
	var rows []struct{ ID, UserID int64 }
	if err := db.Raw("SELECT id, user_id FROM voucher_orders WHERE voucher_id = ?", voucherID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := make(map[int64]int64, len(rows))
	for _, r := range rows {
		if _, dup := out[r.UserID]; dup {
			t.Errorf("user %d holds two orders of voucher %d", r.UserID, voucherID)
		}
		out[r.UserID] = r.ID
	}
	return out
}

// Redis cut off while the group commit closes a batch's holds (the
// batch's orders committed): every request of the batch still answers
// 200, its row committed, and the holds stay open, as when a request's
// own confirm failed. Once they expire the sweeper sees the rows and
// closes them, keeping the buyers and giving no unit back: Redis' stock
// equals MySQL's, and a buyer of the batch who presses again is told
// already_ordered. The cut is made on a TCP proxy between the service
// and a redis-server of the test's own, when the first confirmall.lua
// of two holds or more is sent; other commands in flight then fail too,
// and their requests answer 503 (their units back, or swept).
//
// It fails if a committed order of the struck batch is answered other
// than 200, or a 200 has no row, if the fault struck no batch, if the
// sweeper leaves a hold open, forgets a buyer, or gives back a unit of
// an order that exists.
func TestGroupCommitConfirmCutOff(t *testing.T) {
	srv := testenv.StartRedis(t)
	proxy := faultproxy.Start(t, srv.Addr())
	var armed atomic.Bool
	var strike atomic.Pointer[[]int64]
	// Once armed: the first confirm of two holds or more.
	var failed atomic.Int64 // holds of the confirms that failed, for whatever reason
	cut := newAtConfirmAll(t, func(_ context.Context, users []int64, send func() error) error {
		err := func() error {
			if len(users) < 2 || !armed.CompareAndSwap(true, false) {
				return send()
			}
			strike.Store(&users)
			proxy.Cut()
			defer proxy.Heal()
			return send()
		}()
		if err != nil && !strings.HasPrefix(err.Error(), "NOSCRIPT") { // NOSCRIPT: sent again as EVAL
			failed.Add(int64(len(users)))
		}
		return err
	})
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(cut)
	db := testenv.Open(t, testenv.MySQLDSN(t))
	const hold = 3 * time.Second
	cfg := DefaultConfig
	cfg.WriteTimeout = hold / 3
	obs := &batches{}
	cfg.Observer = obs
	s, vouchers := newServiceHolding(t, db, rdb, cfg, hold)
	const units, users = 30, 40
	id := onSale(t, vouchers, units)
	ctx := context.Background()
	// One order first: the scripts loaded, the ID pool filled.
	if _, err := s.Seckill(ctx, 1000, id); err != nil {
		t.Fatal(err)
	}

	armed.Store(true)
	answers := make([]error, users+1)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for u := int64(1); u <= users; u++ {
		wg.Go(func() {
			<-gate
			_, answers[u] = s.Seckill(ctx, u, id)
		})
	}
	close(gate)
	wg.Wait()
	if strike.Load() == nil {
		t.Fatalf("no confirm of two holds or more was sent (batches %v): the fault struck nothing", obs.commits())
	}

	struck := *strike.Load()
	t.Logf("the cut struck the confirm of %d holds; batches %v", len(struck), obs.commits())
	rows := ordersOfVoucher(t, db, id)
	for u := int64(1); u <= users; u++ {
		_, row := rows[u]
		switch err := answers[u]; {
		case err == nil && !row:
			t.Errorf("user %d answered 200 without a row", u)
		case err != nil && row:
			t.Errorf("user %d: %v, but the order is committed", u, err)
		}
	}
	k := stock.KeysOf(id)
	open := rdb.ZRange(ctx, k.Holds, 0, -1).Val()
	for _, u := range struck {
		if answers[u] != nil {
			t.Errorf("user %d of the struck batch: %v, want 200", u, answers[u])
		}
		if !slices.Contains(open, strconv.FormatInt(u, 10)) {
			t.Errorf("user %d of the struck batch: hold closed, though its confirm never reached Redis", u)
		}
	}
	// Told to the operator (seckill_holds_unconfirmed_total): the holds of
	// every confirm that failed, each once (the struck batch's, and any
	// other's that met the cut). Every order here is written by the group
	// commit and confirmed in one call a batch: no request confirms its own.
	if n := obs.left(); n < len(struck) || int64(n) != failed.Load() {
		t.Errorf("%d holds counted as left to the sweeper, want %d, the holds of the confirms that failed (the struck batch's %d among them)", n, failed.Load(), len(struck))
	}

	// The holds expire; the sweeper settles them by MySQL's rows.
	time.Sleep(hold + 200*time.Millisecond)
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.ZCard(ctx, k.Holds).Val(); n != 0 {
		t.Errorf("%d holds open after the sweep", n)
	}
	for _, u := range struck {
		if !rdb.SIsMember(ctx, k.Buyers, u).Val() {
			t.Errorf("user %d of the struck batch forgotten as a buyer", u)
		}
	}
	rows = ordersOfVoucher(t, db, id)
	redisLeft, ok, err := s.stocks.Left(ctx, id, 1)
	if err != nil || !ok {
		t.Fatalf("stock in Redis: %v %v", ok, err)
	}
	var mysqlLeft int64
	db.Raw("SELECT stock FROM vouchers WHERE id = ?", id).Scan(&mysqlLeft)
	if redisLeft != mysqlLeft || mysqlLeft+int64(len(rows)) != units {
		t.Errorf("after the sweep: Redis %d left, MySQL %d, %d orders of %d", redisLeft, mysqlLeft, len(rows), units)
	}
	// A fresh instance, which remembers nothing of the buyer, asks Redis.
	again, _ := newServiceHolding(t, db, rdb, cfg, hold)
	u := struck[0]
	if _, err := again.Seckill(ctx, u, id); !errors.Is(err, ErrAlreadyOrdered) {
		t.Errorf("user %d of the struck batch presses again: %v, want already ordered", u, err)
	}
}

// atConfirmAll is a hook that runs around every confirmall.lua sent
// (EVALSHA sha numkeys keys... flag n user... flag n user...), given the
// users of its first group; other commands pass.
type atConfirmAll struct {
	sha    string
	around func(ctx context.Context, users []int64, send func() error) error
}

// newAtConfirmAll returns the hook; add it to a client with AddHook.
func newAtConfirmAll(t *testing.T, around func(ctx context.Context, users []int64, send func() error) error) *atConfirmAll {
	t.Helper()
	src, err := os.ReadFile("../stock/confirmall.lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return &atConfirmAll{sha: hex.EncodeToString(sum[:]), around: around}
}

func (c *atConfirmAll) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *atConfirmAll) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *atConfirmAll) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if cmd.Name() != "evalsha" || len(args) < 3 || args[1] != c.sha {
			return next(ctx, cmd)
		}
		first := 3 + args[2].(int) // its flag, n, then the users
		var users []int64
		for _, a := range args[first+2 : first+2+args[first+1].(int)] {
			users = append(users, a.(int64))
		}
		return c.around(ctx, users, func() error { return next(ctx, cmd) })
	}
}
