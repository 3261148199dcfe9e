package main

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// startMany starts n instances on one stack.
func startMany(t *testing.T, st stack, n int, extra ...string) []*instance {
	t.Helper()
	out := make([]*instance, n)
	for i := range out {
		out[i] = start(t, st.env(freeAddr(t), extra...))
	}
	return out
}

// rush releases every user at once; each tries tries times, each try on
// the next instance in turn.
func rush(l *ledger, insts []*instance, users []user, voucherID string, tries int) {
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() {
			<-gate
			for try := range tries {
				buy(l, insts[(i+try)%len(insts)].Base, u, voucherID)
			}
		})
	}
	close(gate)
	wg.Wait()
}

// onlyExpected fails on transport errors and on answers other than 200
// and the codes listed.
func onlyExpected(t *testing.T, l *ledger, codes ...string) {
	t.Helper()
	ok := map[string]bool{}
	for _, c := range codes {
		ok[c] = true
	}
	bad := 0
	for _, o := range l.all {
		if o.Err != nil || (o.Status != http.StatusOK && !ok[o.Code]) {
			if bad < 5 {
				t.Errorf("unexpected answer: status %d code %q err %v", o.Status, o.Code, o.Err)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d unexpected answers", bad)
	}
}

// Three instances share one MySQL and one Redis; hundreds of users fire
// at once at one voucher, several tries each, on different instances.
func TestSaleAcrossThreeInstances(t *testing.T) {
	for _, tc := range []struct {
		name         string
		stock, users int
		tries        int
	}{
		{"stock below demand", 100, 600, 3},
		{"stock above demand", 500, 200, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStack(t, 0)
			insts := startMany(t, st, 3)
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			vid := openVoucher(t, insts[0].Base, admin, tc.stock)
			users := loginMany(t, insts[1].Base, tc.users)

			var l ledger
			rush(&l, insts, users, vid, tc.tries)

			onlyExpected(t, &l, "sold_out", "already_ordered")
			won := l.wins(t)
			if want := min(tc.stock, tc.users); len(won) != want {
				t.Errorf("%d users won, want exactly %d (stock %d, demand %d)", len(won), want, tc.stock, tc.users)
			}
			db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)
			s := waitRest(t, db, rdb, vid, 5*time.Second)
			checkInvariants(t, s, int64(tc.stock), won)
			if want := max(tc.stock-tc.users, 0); s.Stock != int64(want) {
				t.Errorf("stock left %d, want %d", s.Stock, want)
			}
			t.Logf("200: %d, sold_out: %d, already_ordered: %d", len(won), l.count(409, "sold_out"), l.count(409, "already_ordered"))
		})
	}
}

// Redis loses everything mid-sale. The stock is rebuilt from MySQL (once,
// under a lock), nothing is oversold, nobody orders twice, and in the end
// every unit is sold and Redis agrees with MySQL.
func TestRedisFlushedMidSale(t *testing.T) {
	st := newStack(t, 13) // database 13 is this test's alone: it flushes it
	rdb := testenv.Redis(t, st.RedisDB)
	insts := startMany(t, st, 3)
	admin, _ := mustLogin(t, insts[0].Base, adminPhone)
	const initial = 100
	vid := openVoucher(t, insts[0].Base, admin, initial)
	users := loginMany(t, insts[0].Base, 400)

	var l ledger
	var flushed sync.Once
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() {
			<-gate
			for try := range 3 {
				o := buy(&l, insts[(i+try)%3].Base, u, vid)
				if o.Status == http.StatusOK && i%7 == 0 {
					// Somewhere early in the sale, Redis forgets it all:
					// stock, buyers, holds, even the ID counters.
					flushed.Do(func() { rdb.FlushDB(context.Background()) })
				}
			}
		})
	}
	close(gate)
	wg.Wait()

	// Newcomers buy whatever the sale left, proving no unit was lost.
	more := loginMany(t, insts[0].Base, 150)
	rush(&l, insts, more, vid, 2)

	onlyExpected(t, &l, "sold_out", "already_ordered", "busy")
	won := l.wins(t)
	db := testenv.Open(t, st.DSN)
	s := waitRest(t, db, rdb, vid, 10*time.Second)
	checkInvariants(t, s, initial, won)
	if len(s.Orders) != initial {
		t.Errorf("%d orders after the newcomers, want the whole stock %d", len(s.Orders), initial)
	}
}

// MySQL fails after Redis took the stock: every request answers
// unavailable, and every unit goes back to Redis at once.
func TestMySQLFailsAfterRedisTookStock(t *testing.T) {
	st := newStack(t, 0)
	inst := start(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	const initial = 10
	vid := openVoucher(t, inst.Base, admin, initial)
	users := loginMany(t, inst.Base, 30)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	// Every INSERT of an order fails inside MySQL, after the stock script.
	if err := db.Exec("CREATE TRIGGER fail_orders BEFORE INSERT ON voucher_orders FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure'").Error; err != nil {
		t.Fatal(err)
	}
	var l ledger
	rush(&l, []*instance{inst}, users, vid, 1)
	onlyExpected(t, &l, "unavailable", "sold_out")
	if n := l.count(http.StatusServiceUnavailable, "unavailable"); n < initial {
		t.Errorf("%d requests answered unavailable, want at least %d (the stock they took)", n, initial)
	}
	s := readState(t, db, rdb, vid)
	if s.RedisStock != initial || s.Holds != 0 || len(s.Orders) != 0 {
		t.Fatalf("after the failures: redis stock %d (want %d), holds %d, orders %d", s.RedisStock, initial, s.Holds, len(s.Orders))
	}
	if n := rdb.SCard(context.Background(), voucherKey(vid, "buyers")).Val(); n != 0 {
		t.Errorf("%d users still remembered as buyers after failing", n)
	}

	// MySQL recovers: the same users can buy, and the stock is all there.
	if err := db.Exec("DROP TRIGGER fail_orders").Error; err != nil {
		t.Fatal(err)
	}
	var again ledger
	rush(&again, []*instance{inst}, users, vid, 1)
	onlyExpected(t, &again, "sold_out")
	won := again.wins(t)
	if len(won) != initial {
		t.Errorf("%d orders after recovery, want %d", len(won), initial)
	}
	checkInvariants(t, waitRest(t, db, rdb, vid, 5*time.Second), initial, won)
}
