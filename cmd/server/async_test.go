package main

import (
	"context"
	"database/sql"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/testenv"
)

// Async mode: orders are accepted in Redis and written by the consumer
// group. Each test has a Redis database of its own (see newStack).

// waitWritten waits until every order answered 200 is a row and the
// queue is empty, and returns the state at rest.
func waitWritten(t *testing.T, db *gorm.DB, rdb *redis.Client, vid string, won map[string]string, within time.Duration) storeState {
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
		lag := rdb.XLen(context.Background(), "seckill:orders").Val()
		pending, _ := rdb.XPending(context.Background(), "seckill:orders", "persist").Result()
		if missing == 0 && (pending == nil || pending.Count == 0) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %d orders answered 200 are not in MySQL (stream length %d, pending %+v)", within, missing, lag, pending)
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
				if r.Status != http.StatusOK || r.Str("status") != "created" {
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
		return got.Status == 200 && got.Str("status") == "created"
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
		p, err := rdb.XPending(context.Background(), "seckill:orders", "persist").Result()
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
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: "seckill:orders", Values: map[string]any{"id": "x", "user": "1"}}).Err(); err != nil {
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
	release()

	s := waitWritten(t, db, rdb, vid, won, 20*time.Second)
	checkInvariants(t, s, initial, won)
	r := mustCall(t, "GET", inst.Base+"/admin/queue", admin, nil)
	if r.Status != 200 || r.Body["dead_letters"] != float64(1) {
		t.Errorf("admin queue view: %d %s, want one dead letter", r.Status, r.Raw)
	}
	if !strings.Contains(inst.log.String(), "failed") {
		t.Errorf("the failed batch was not logged")
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
	keys := []string{"seckill:{v" + vid + "}:stock", "seckill:{v" + vid + "}:buyers"}
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
