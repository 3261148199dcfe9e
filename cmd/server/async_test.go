package main

import (
	"context"
	"database/sql"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// Async mode: orders are accepted in Redis and written by the consumer
// group. Each test has a Redis database of its own (see newStack).

// waitWritten waits until every order answered 200 is a row and the
// queue is empty, and returns the state at rest.
func waitWritten(t *testing.T, db *gorm.DB, rdb redis.UniversalClient, vid string, won map[string]string, within time.Duration) storeState {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := readState(t, db, rdb, vid)
		missing := 0
		for _, id := range won {
			if _, ok := s.Orders[id]; !ok {
				missing++
			}
		}
		// Every stream the voucher's orders go to (one per bucket), and
		// its count of queued orders (what reconciliation waits on),
		// which must come back to zero with them.
		var lag, pending, queued int64
		id, _ := strconv.ParseInt(vid, 10, 64)
		for b := range s.Buckets {
			stream := queue.StreamKey(stock.BucketShard(id, s.Buckets, b))
			lag += rdb.XLen(context.Background(), stream).Val()
			if p, err := rdb.XPending(context.Background(), stream, queue.GroupName).Result(); err == nil {
				pending += p.Count
			}
			n, _ := rdb.Get(context.Background(), stock.BucketKey(id, s.Buckets, b, "queued")).Int64()
			queued += n
		}
		if missing == 0 && pending == 0 && queued == 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %d orders answered 200 are not in MySQL (stream length %d, pending %d, queued count %d)", within, missing, lag, pending, queued)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAsyncSaleAcrossThreeInstances(t *testing.T) {
	for _, tc := range []struct {
		name           string
		stock, users   int
		wantAllWinners bool
	}{
		{"stock below demand", 100, 500, false},
		{"stock above demand", 400, 200, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStack(t, 10)
			insts := startMany(t, st, 3, "SECKILL_MODE", "async")
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			vid := openVoucher(t, insts[0].Base, admin, tc.stock)
			users := loginMany(t, insts[0].Base, tc.users)

			var l ledger
			rush(&l, insts, users, vid, 3)

			onlyExpected(t, &l, "sold_out", "already_ordered")
			won := l.wins(t)
			want := min(tc.stock, tc.users)
			if len(won) != want {
				t.Errorf("%d users won, want %d", len(won), want)
			}
			db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)
			s := waitWritten(t, db, rdb, vid, won, 10*time.Second)
			checkInvariants(t, s, int64(tc.stock), won)
			if len(s.Orders) != len(won) {
				t.Errorf("%d rows, %d answers of 200", len(s.Orders), len(won))
			}
			s = waitRest(t, db, rdb, vid, 5*time.Second)
			for id := range won {
				r := mustCall(t, "GET", insts[2].Base+"/orders/"+won[id], admin, nil)
				if r.Status != http.StatusOK || r.Str("status") != "unpaid" {
					t.Fatalf("GET order %s: %d %s", won[id], r.Status, r.Raw)
				}
				break
			}
		})
	}
}

// An order reads as pending while it waits in the stream, then created.
func TestAsyncOrderPendingThenCreated(t *testing.T) {
	st := newStack(t, 10)
	inst := start(t, st.env(freeAddr(t), "SECKILL_MODE", "async"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	vid := openVoucher(t, inst.Base, admin, 5)
	tok, _ := mustLogin(t, inst.Base, "13912345678")
	unlock := lockVouchers(t, st.DSN) // the consumer's write waits
	r := mustCall(t, "POST", inst.Base+"/seckill/"+vid, tok, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("seckill: %d %s", r.Status, r.Raw)
	}
	id := r.Str("order_id")
	if got := mustCall(t, "GET", inst.Base+"/orders/"+id, tok, nil); got.Status != 200 || got.Str("status") != "pending" {
		t.Fatalf("before the write: %d %s, want 200 pending", got.Status, got.Raw)
	}
	other, _ := mustLogin(t, inst.Base, "13912345679")
	if got := mustCall(t, "GET", inst.Base+"/orders/"+id, other, nil); got.Status != http.StatusNotFound {
		t.Fatalf("someone else's pending order: %d, want 404", got.Status)
	}
	unlock()
	waitFor(t, 10*time.Second, "the order to be written", func() bool {
		got := mustCall(t, "GET", inst.Base+"/orders/"+id, tok, nil)
		return got.Status == 200 && got.Str("status") == "unpaid"
	})
}

// SIGKILL a process whose consumer holds entries it has not written: a
// consumer started later claims them, and every 200 is a row.
func TestAsyncSIGKILLLosesNothing(t *testing.T) {
	st := newStack(t, 11)
	extra := []string{"SECKILL_MODE", "async", "CLAIM_IDLE", "1s"}
	victim := spawn(t, st.env(freeAddr(t), extra...))
	admin, _ := mustLogin(t, victim.Base, adminPhone)
	const initial = 60
	vid := openVoucher(t, victim.Base, admin, initial)
	users := loginMany(t, victim.Base, 40)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	unlock := lockVouchers(t, st.DSN) // the victim's consumer reads, then waits on MySQL
	var l ledger
	var wg sync.WaitGroup
	for _, u := range users {
		wg.Go(func() { buy(&l, victim.Base, u, vid) })
	}
	wg.Wait()
	onlyExpected(t, &l)
	won := l.wins(t)
	if len(won) != len(users) {
		t.Fatalf("%d of %d accepted", len(won), len(users))
	}
	waitFor(t, 5*time.Second, "the victim's consumer to hold entries", func() bool {
		p, err := rdb.XPending(context.Background(), streamOf(vid), queue.GroupName).Result()
		return err == nil && p.Count > 0
	})
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.done
	unlock()

	survivor := spawn(t, st.env(freeAddr(t), extra...))
	s := waitWritten(t, db, rdb, vid, won, 15*time.Second)
	checkInvariants(t, s, initial, won)
	if len(s.Orders) != len(won) {
		t.Errorf("%d rows for %d answers of 200", len(s.Orders), len(won))
	}
	if !strings.Contains(survivor.log.String(), "claimed entries") {
		t.Errorf("the survivor did not claim the dead consumer's entries")
	}
}

// SIGTERM with accepted orders not yet written: the process writes them
// before it exits.
func TestAsyncSIGTERMWritesWhatItAccepted(t *testing.T) {
	st := newStack(t, 12)
	p := spawn(t, st.env(freeAddr(t), "SECKILL_MODE", "async"))
	admin, _ := mustLogin(t, p.Base, adminPhone)
	const initial = 100
	vid := openVoucher(t, p.Base, admin, initial)
	users := loginMany(t, p.Base, 80)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	unlock := lockVouchers(t, st.DSN)
	var l ledger
	rush(&l, []*instance{{Base: p.Base}}, users, vid, 1)
	onlyExpected(t, &l)
	won := l.wins(t)
	p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	unlock()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no exit within 30s of SIGTERM")
	}
	if p.err != nil {
		t.Errorf("exit after SIGTERM: %v", p.err)
	}
	// No other consumer exists: whatever is in MySQL now, the dying
	// process wrote.
	s := readState(t, db, rdb, vid)
	checkInvariants(t, s, initial, won)
	if len(s.Orders) != len(won) {
		t.Errorf("%d of %d accepted orders written before exit", len(s.Orders), len(won))
	}
}

// A batch that MySQL refuses for a while (lock wait timeouts, many more
// times than MaxDeliveries) is retried until it lands, and never
// dead-lettered; a poison entry goes to the dead letters without blocking
// the rest.
func TestAsyncFailuresRetriedAndDeadLettered(t *testing.T) {
	st := newStack(t, 14)
	dsn := st.DSN + "&innodb_lock_wait_timeout=1"
	st2 := stack{DSN: dsn, RedisDB: st.RedisDB}
	inst := start(t, st2.env(freeAddr(t), "SECKILL_MODE", "async", "CLAIM_IDLE", "4s", "ASYNC_MAX_DELIVERIES", "2"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	const initial = 20
	vid := openVoucher(t, inst.Base, admin, initial)
	users := loginMany(t, inst.Base, 5)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	// A poison entry: no order can be made of it.
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: streamOf(vid), Values: map[string]any{"id": "x", "user": "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	// Hold the voucher's row lock: every write waits 1s, then fails.
	release := holdVoucherRow(t, st.DSN, vid)
	var l ledger
	rush(&l, []*instance{inst}, users, vid, 1)
	won := l.wins(t)
	if len(won) != len(users) {
		t.Fatalf("%d of %d accepted", len(won), len(users))
	}
	// Each write waits 1s for the row lock, then MySQL answers "lock wait
	// timeout" (within the batch's 2s budget, CLAIM_IDLE/2). Held long
	// enough for more deliveries than ASYNC_MAX_DELIVERIES (2): a MySQL
	// that keeps timing out must never cost an accepted order.
	time.Sleep(9 * time.Second)
	if n := len(readState(t, db, rdb, vid).Orders); n != 0 {
		t.Fatalf("%d orders written through a held row lock", n)
	}
	// Sick once, backing off until a real write succeeds: not bouncing
	// between sick and healthy on a probe that succeeds beside the lock.
	if n := strings.Count(inst.log.String(), "MySQL does not take writes;"); n != 1 {
		t.Errorf("the consumer fell sick %d times while the row lock was held, want once", n)
	}
	release()

	s := waitWritten(t, db, rdb, vid, won, 20*time.Second)
	checkInvariants(t, s, initial, won)
	r := mustCall(t, "GET", inst.Base+"/admin/queue", admin, nil)
	if r.Status != 200 || r.Body["dead_letters"] != float64(1) {
		t.Errorf("admin queue view: %d %s, want one dead letter", r.Status, r.Raw)
	}
	if !strings.Contains(inst.log.String(), "does not take writes") {
		t.Errorf("the failing writes were not logged")
	}
}

// Redis loses a voucher's stock and buyers while accepted orders still
// wait in the stream. The reload must count them: their units are taken
// and their users have bought, or it oversells and lets them buy twice.
func TestAsyncReloadCountsQueuedOrders(t *testing.T) {
	st := newStack(t, 10)
	inst := start(t, st.env(freeAddr(t), "SECKILL_MODE", "async"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	const initial = 30
	vid := openVoucher(t, inst.Base, admin, initial)
	users := loginMany(t, inst.Base, 60)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	// Accepted orders stay in the stream: the consumer's UPDATE waits on
	// the voucher's row lock, while plain reads (the reload's) go on.
	unlock := holdVoucherRow(t, st.DSN, vid)
	var l ledger
	rush(&l, []*instance{inst}, users[:20], vid, 1)
	if n := len(l.wins(t)); n != 20 {
		t.Fatalf("%d of 20 accepted", n)
	}
	keys := []string{voucherKey(vid, "stock"), voucherKey(vid, "buyers")}
	if err := rdb.Del(context.Background(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
	// The first 20 try again (each must be refused), and 40 newcomers
	// compete for the 10 units left.
	rush(&l, []*instance{inst}, users, vid, 1)
	unlock()

	onlyExpected(t, &l, "sold_out", "already_ordered")
	won := l.wins(t) // fails if anyone won twice
	if len(won) != initial {
		t.Errorf("%d orders accepted in all, want %d", len(won), initial)
	}
	s := waitWritten(t, db, rdb, vid, won, 10*time.Second)
	checkInvariants(t, s, initial, won)
}

// holdVoucherRow locks the voucher's row in a transaction of the test's
// own: writes to it wait, consistent reads do not.
func holdVoucherRow(t *testing.T, dsn, vid string) (release func()) {
	t.Helper()
	raw, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := raw.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("SELECT stock FROM vouchers WHERE id = ? FOR UPDATE", vid); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { tx.Rollback(); raw.Close() }) }
	t.Cleanup(release)
	return release
}

// A consumer that cannot write must not swallow the stream. One instance
// loses MySQL (its connections cut, new ones refused) but keeps Redis, so
// it goes on accepting orders; its consumer must stop taking entries and
// leave its own to go idle, so that the healthy instance's consumer claims
// and writes every one of them while the sick one is still cut off.
// (Before: the sick consumer kept reading new entries and rereading its
// own, which reset their idle time, and nothing it held landed until its
// MySQL came back.)
func TestAsyncSickConsumerLetsOthersWrite(t *testing.T) {
	st := newStack(t, 13)
	cfg, err := mysql.ParseDSN(st.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, cfg.Addr)
	cfg.Addr = proxy.Addr()
	sick := start(t, stack{DSN: cfg.FormatDSN(), RedisDB: st.RedisDB}.env(freeAddr(t), "SECKILL_MODE", "async", "CLAIM_IDLE", "2s"))
	healthy := start(t, st.env(freeAddr(t), "SECKILL_MODE", "async", "CLAIM_IDLE", "2s"))
	admin, _ := mustLogin(t, healthy.Base, adminPhone)
	const initial = 200
	vid := openVoucher(t, healthy.Base, admin, initial)
	users := loginMany(t, healthy.Base, 150)
	if r := mustCall(t, "GET", sick.Base+"/vouchers/"+vid, "", nil); r.Status != http.StatusOK {
		t.Fatalf("warm the sick instance's voucher cache: %d %s", r.Status, r.Raw)
	}
	// The day's first order starts the ID sequence, which asks MySQL.
	var l ledger
	rush(&l, []*instance{healthy}, users[:1], vid, 1)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	proxy.Cut()
	rush(&l, []*instance{sick, healthy}, users[1:], vid, 1)
	onlyExpected(t, &l)
	won := l.wins(t)
	if len(won) != len(users) {
		t.Fatalf("%d of %d accepted", len(won), len(users))
	}
	// CLAIM_IDLE is 2s: what the sick consumer took goes idle and is
	// claimed within a few seconds, while its MySQL stays cut.
	s := waitWritten(t, db, rdb, vid, won, 15*time.Second)
	checkInvariants(t, s, initial, won)
	if !strings.Contains(sick.log.String(), "does not take writes") {
		t.Errorf("the sick consumer never noticed")
	}
	proxy.Heal()
}

// Dead letters are not a grave. MySQL refuses two users' orders for good
// (a trigger answers "data too long", a verdict on the row): they go to
// the dead letters after ASYNC_MAX_DELIVERIES, their orders read "failed",
// their units are back on sale at once, and their buyers are free. Once the
// cause is gone, one buyer simply buys again (not turned away by the
// instance's memory of buyers), and an admin replays the other's order: the
// same order ID lands. Replaying the first one's is refused with its
// reason, since that buyer now holds an order. The numbers add up.
func TestAsyncDeadLetterSettledAndReplayed(t *testing.T) {
	st := newStack(t, 11)
	inst := start(t, st.env(freeAddr(t), "SECKILL_MODE", "async", "CLAIM_IDLE", "2s", "ASYNC_MAX_DELIVERIES", "2"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	const initial = 10
	vid := openVoucher(t, inst.Base, admin, initial)
	users := loginMany(t, inst.Base, 5)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)
	again, replayed := users[1], users[2]
	trigger := "CREATE TRIGGER refuse_two BEFORE INSERT ON voucher_orders FOR EACH ROW " +
		"IF NEW.user_id IN (" + again.ID + ", " + replayed.ID + ") THEN SIGNAL SQLSTATE '22001' SET MYSQL_ERRNO = 1406, MESSAGE_TEXT = 'refused by the test'; END IF"
	if err := db.Exec(trigger).Error; err != nil {
		t.Fatal(err)
	}

	var l ledger
	for _, u := range users {
		if o := buy(&l, inst.Base, u, vid); o.Status != http.StatusOK {
			t.Fatalf("buy: %+v", o)
		}
	}
	first := l.wins(t)
	letters := map[string]map[string]any{} // user -> dead letter
	waitFor(t, 20*time.Second, "the refused orders to become dead letters", func() bool {
		r := mustCall(t, "GET", inst.Base+"/admin/dead-letters", admin, nil)
		dead, _ := r.Body["dead_letters"].([]any)
		for _, d := range dead {
			m, _ := d.(map[string]any)
			letters[m["user_id"].(string)] = m
		}
		return r.Status == http.StatusOK && len(dead) == 2
	})
	for _, u := range []user{again, replayed} {
		if letters[u.ID]["order_id"] != first[u.ID] {
			t.Fatalf("dead letters %v, want order %s of user %s among them", letters, first[u.ID], u.ID)
		}
		if r := mustCall(t, "GET", inst.Base+"/orders/"+first[u.ID], u.Token, nil); r.Str("status") != "failed" {
			t.Fatalf("a dead-lettered order reads %d %s, want failed", r.Status, r.Raw)
		}
	}
	// Settled: the units are back in Redis, and MySQL never took them.
	s := readState(t, db, rdb, vid)
	if s.Stock != initial-3 || len(s.Orders) != 3 || s.RedisStock != initial-3 {
		t.Fatalf("after the dead letters: mysql stock %d, orders %d, redis stock %d; want %d, 3, %d", s.Stock, len(s.Orders), s.RedisStock, initial-3, initial-3)
	}

	if r := mustCall(t, "POST", inst.Base+"/admin/dead-letters/replay", admin, map[string]any{}); r.Status != http.StatusBadRequest {
		t.Errorf("replay with neither ids nor all: %d %s, want 400", r.Status, r.Raw)
	}
	if r := mustCall(t, "POST", inst.Base+"/admin/dead-letters/replay", again.Token, map[string]any{"all": true}); r.Status != http.StatusForbidden {
		t.Errorf("replay by a user: %d, want 403", r.Status)
	}
	if err := db.Exec("DROP TRIGGER refuse_two").Error; err != nil {
		t.Fatal(err)
	}
	// The freed buyer buys again, on the instance that accepted the lost
	// order (its memory of buyers must not answer already_ordered).
	time.Sleep(time.Second)
	o := buy(&l, inst.Base, again, vid)
	if o.Status != http.StatusOK {
		t.Fatalf("the freed buyer buys again: %+v, want 200", o)
	}
	r := mustCall(t, "POST", inst.Base+"/admin/dead-letters/replay", admin, map[string]any{"all": true})
	results := map[string]string{}
	res, _ := r.Body["replayed"].([]any)
	for _, x := range res {
		m, _ := x.(map[string]any)
		results[m["order_id"].(string)] = m["result"].(string)
	}
	if r.Status != http.StatusOK || results[first[replayed.ID]] != "requeued" || results[first[again.ID]] != "already_ordered" {
		t.Fatalf("replay all: %d %s, want %s requeued and %s already_ordered", r.Status, r.Raw, first[replayed.ID], first[again.ID])
	}
	won := map[string]string{}
	for u, id := range first {
		won[u] = id
	}
	won[again.ID] = o.OrderID
	s = waitWritten(t, db, rdb, vid, won, 10*time.Second)
	checkInvariants(t, s, initial, won)
	if len(s.Orders) != 5 {
		t.Errorf("%d orders in the end, want 5", len(s.Orders))
	}
	if r := mustCall(t, "GET", inst.Base+"/orders/"+first[replayed.ID], replayed.Token, nil); r.Str("status") != "unpaid" {
		t.Errorf("the replayed order reads %d %s, want unpaid", r.Status, r.Raw)
	}
	r = mustCall(t, "POST", inst.Base+"/admin/dead-letters/replay", admin, map[string]any{"ids": []string{letters[replayed.ID]["id"].(string)}})
	if res, _ := r.Body["replayed"].([]any); len(res) != 1 || res[0].(map[string]any)["result"] != "not_found" {
		t.Errorf("replaying it again: %s, want not_found", r.Raw)
	}
	waitRest(t, db, rdb, vid, 5*time.Second)
}

// streamOf names the orders stream of voucher vid's shard.
// streamsOf names the streams the orders of voucher vid, of n buckets,
// go to: one per bucket (its shard's).
func streamsOf(vid string, n int) []string {
	id, _ := strconv.ParseInt(vid, 10, 64)
	var out []string
	for b := range max(n, 1) {
		out = append(out, queue.StreamKey(stock.BucketShard(id, n, b)))
	}
	return out
}

func streamOf(vid string) string {
	id, _ := strconv.ParseInt(vid, 10, 64)
	return queue.StreamKey(stock.ShardOf(id))
}

// voucherKey names voucher vid's key name (stock.KeyOf).
func voucherKey(vid, name string) string {
	id, _ := strconv.ParseInt(vid, 10, 64)
	return stock.KeyOf(id, name)
}
