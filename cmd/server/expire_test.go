package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// An instance dies in the middle of expiring orders, twice: once inside a
// batch's transaction (nothing of it may survive: its row locks go, and
// another instance cancels the orders), once between the batch's COMMIT
// and the units' return to Redis (the return must still be made, once, by
// another instance). At rest every order is cancelled once, MySQL's stock
// is whole again, and so is Redis'.
func TestExpirerKilledMidSweep(t *testing.T) {
	st := newStack(t, 0)
	const units = 300
	db := testenv.Open(t, withParseTime(t, st.DSN))
	rdb := testenv.Redis(t, st.RedisDB)
	fast := []string{"SWEEP_EVERY", "200ms"}

	// A voucher sold out to units unpaid orders, written straight into
	// MySQL, due in an hour; Redis counts none left either.
	first := spawn(t, st.env(freeAddr(t), fast...))
	admin, _ := mustLogin(t, first.Base, adminPhone)
	vid := createVoucher(t, first.Base, admin, units, time.Now().Add(-time.Minute), time.Now().Add(time.Hour), "pay_within", 3600)
	id, _ := strconv.ParseInt(vid, 10, 64)
	rows := make([]string, units)
	for i := range rows {
		rows[i] = fmt.Sprintf("(%d, %d, %d, 'unpaid', NOW(3), 0, NOW(3) + INTERVAL 1 HOUR, 0)", i+1, i+1, id)
	}
	if err := db.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at, amount, pay_by, bucket) VALUES " + strings.Join(rows, ", ")).Error; err != nil {
		t.Fatal(err)
	}
	db.Exec("UPDATE vouchers SET stock = 0, sold = ? WHERE id = ?", units, vid) // as the sale would count them
	rdb.Set(context.Background(), stock.KeysOf(id).Stock, 0, 0)
	count := func(q string, args ...any) (n int64) {
		db.Raw(q, args...).Scan(&n)
		return n
	}
	unpaid := func() int64 {
		return count("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = 'unpaid'", vid)
	}

	// 1. Inside the transaction: the voucher's row is locked, so the
	// batch waits at giving the units back, its orders already cancelled
	// in it. The instance is killed there.
	lock := lockVoucherRow(t, st.DSN, vid)
	db.Exec("UPDATE voucher_orders SET pay_by = NOW(3) - INTERVAL 1 SECOND WHERE voucher_id = ?", vid)
	// The evidence: the batch's wait for the row times out (the DSN's
	// innodb_lock_wait_timeout, 4 s) and is logged; the next round waits
	// again 200 ms later, and is killed inside that wait.
	waitFor(t, 30*time.Second, "a batch that waited for the voucher's row", func() bool {
		return strings.Contains(first.log.String(), "units back to voucher "+vid)
	})
	time.Sleep(time.Second)
	first.cmd.Process.Kill()
	<-first.done
	lock()
	if n := unpaid(); n != units {
		t.Fatalf("%d orders unpaid after the killed batch, want all %d: a part of its transaction survived", n, units)
	}

	// 2. Between the COMMIT and Redis: an instance whose Redis stops
	// answering cancels the orders, and dies while it tries to return
	// their units. The orders fall due a few seconds from now, once its
	// Redis is cut.
	db.Exec("UPDATE voucher_orders SET pay_by = NOW(3) + INTERVAL 1 HOUR WHERE voucher_id = ?", vid)
	proxy := faultproxy.Start(t, testenvRedisAddr())
	env := st.env(freeAddr(t), fast...)
	env["REDIS_ADDR"] = proxy.Addr()
	second := spawn(t, env)
	proxy.Blackhole()
	db.Exec("UPDATE voucher_orders SET pay_by = NOW(3) WHERE voucher_id = ?", vid)
	waitFor(t, 20*time.Second, "the orders cancelled, their units not yet in Redis", func() bool {
		return count("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = 'cancelled'", vid) == units &&
			count("SELECT COUNT(*) FROM stock_returns WHERE voucher_id = ?", vid) == units
	})
	second.cmd.Process.Kill()
	<-second.done
	if n, _ := rdb.Get(context.Background(), stock.KeysOf(id).Stock).Int64(); n != 0 {
		t.Fatalf("Redis has %d units before any return was made", n)
	}

	// 3. A third instance makes the returns, once.
	third := spawn(t, st.env(freeAddr(t), fast...))
	s, back := checkLifecycle(t, db, rdb, vid, units)
	if back != units {
		t.Errorf("%d orders cancelled, want %d", back, units)
	}
	if s.Stock != units || s.RedisStock != units {
		t.Errorf("stock %d in MySQL, %d in Redis; want %d in both", s.Stock, s.RedisStock, units)
	}
	if r := mustCall(t, "GET", third.Base+"/vouchers/"+vid, "", nil); r.Status != http.StatusOK || r.Body["stock"] != float64(units) {
		t.Errorf("GET /vouchers: %d %s, want stock %d", r.Status, r.Raw, units)
	}
}

// lockVoucherRow locks voucher vid's row in a transaction of its own
// until the returned function is called.
func lockVoucherRow(t *testing.T, dsn, vid string) (unlock func()) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("SELECT id FROM vouchers WHERE id = ? FOR UPDATE", vid); err != nil {
		t.Fatal(err)
	}
	done := false
	unlock = func() {
		if !done {
			done = true
			tx.Rollback()
			db.Close()
		}
	}
	t.Cleanup(unlock)
	return unlock
}
