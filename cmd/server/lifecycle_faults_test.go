package main

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/payment"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// The order's life under the faults of TestSaleSurvivesFaults that touch
// it: MySQL cut while buyers cancel and the provider's payments arrive,
// the answer to a payment's COMMIT lost, Redis restarted empty while
// units go back. The buyers and the provider retry what was answered 503,
// as they would. At rest, as without faults: every order paid or
// cancelled, never both; an event answered 200 is answered the same ever
// after (and, where MySQL stayed reachable, every delivery is a 200);
// stock + unpaid + paid = initial, Redis equal to MySQL, and the units
// that came back sell again.
func TestLifecycleSurvivesFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault tests take minutes")
	}
	faults := []struct {
		faultCase
		reachable    bool // MySQL answers throughout: every delivery and every cancel must be a 200 at once
		cancelsFirst bool // the cancels before the payments
	}{
		{faultCase{name: "mysql cut 2s", inject: func(t *testing.T, r *rig) {
			r.my.Cut()
			time.Sleep(2 * time.Second)
			r.my.Heal()
		}}, false, false},
		{faultCase{name: "payment commit reply dropped", inject: func(t *testing.T, r *rig) {
			// The first COMMIT once armed is a payment's: the expirer opens
			// no transaction while nothing is due, and the cancels wait
			// for the payments.
			select {
			case <-r.my.DropReplyAfter(faultproxy.MySQLQuery("COMMIT")):
			case <-time.After(5 * time.Second):
				t.Error("no COMMIT passed the proxy while the payments ran")
			}
		}}, true, false},
		{faultCase{name: "cancel commit reply dropped", inject: func(t *testing.T, r *rig) {
			// The same, with the cancels first: the first COMMIT is a
			// buyer's cancel, whose buyer must be told it is cancelled.
			select {
			case <-r.my.DropReplyAfter(faultproxy.MySQLQuery("COMMIT")):
			case <-time.After(5 * time.Second):
				t.Error("no COMMIT passed the proxy while the cancels ran")
			}
		}}, true, true},
		{faultCase{name: "redis restarted empty", own: "redis", inject: func(t *testing.T, r *rig) {
			r.ownRedis.Kill()
			time.Sleep(100 * time.Millisecond)
			r.ownRedis.Restart(t)
		}}, true, false},
	}
	for _, mode := range []string{"sync", "async"} {
		for _, f := range faults {
			t.Run(mode+"/"+f.name, func(t *testing.T) { lifecycleWithFault(t, mode, f.faultCase, f.reachable, f.cancelsFirst) })
		}
	}
}

func lifecycleWithFault(t *testing.T, mode string, fc faultCase, reachable, cancelsFirst bool) {
	r := newRig(t, fc.own)
	insts := r.instances(t, mode, 3)
	const initial, price, within = 60, 500, 8
	admin, _ := mustLogin(t, insts[0].Base, adminPhone)
	vid := createVoucher(t, insts[0].Base, admin, initial, time.Now().Add(-time.Minute), time.Now().Add(time.Hour),
		"price", price, "pay_within", within)
	users := loginMany(t, insts[1].Base, initial+20)
	var l ledger
	rush(&l, insts, users[:initial], vid, 1)
	won := l.wins(t)
	if len(won) != initial {
		t.Fatalf("%d of %d buyers got a unit", len(won), initial)
	}
	db := testenv.Open(t, withParseTime(t, r.checkDSN))
	rdb := redis.NewClient(&redis.Options{Addr: r.checkRd, DB: r.redisDB, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	waitFor(t, 10*time.Second, "every order written", func() bool {
		var n int64
		db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&n)
		return n == initial
	})

	// A third pay (each event delivered twice, at once), a third cancel,
	// a third let the deadline pass; the fault strikes as they start.
	type answer struct {
		event string
		r     reply
	}
	var mu sync.Mutex
	var answers []answer
	retrying := func(do func(try int) (reply, error)) reply {
		for try := 0; ; try++ {
			got, err := do(try)
			if err == nil && got.Status != http.StatusServiceUnavailable || try == 100 {
				if err != nil {
					t.Error(err)
				}
				return got
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	injected := make(chan struct{})
	go func() { defer close(injected); fc.inject(t, r) }()
	pay := func() {
		var pays sync.WaitGroup
		for i, u := range users[:initial/3] {
			id, _ := strconv.ParseInt(won[u.ID], 10, 64)
			e := payment.Event{ID: fmt.Sprintf("evt_%d", id), OrderID: id, Amount: price}
			for k := range 2 {
				pays.Go(func() {
					retrying(func(try int) (reply, error) {
						got, err := webhook(insts[(i+k+try)%3].Base, e)
						mu.Lock()
						answers = append(answers, answer{e.ID, got})
						mu.Unlock()
						return got, err
					})
				})
			}
		}
		pays.Wait()
	}
	cancel := func() {
		var cancels sync.WaitGroup
		for i, u := range users[initial/3 : 2*initial/3] {
			cancels.Go(func() {
				got := retrying(func(try int) (reply, error) {
					r, err := call("POST", insts[(i+try)%3].Base+"/orders/"+won[u.ID]+"/cancel", u.Token, nil)
					if reachable && err == nil && r.Status != http.StatusOK {
						t.Errorf("cancel order %s with MySQL reachable: %d %s, want 200 at once", won[u.ID], r.Status, r.Raw)
					}
					return r, err
				})
				if got.Status != http.StatusOK || got.Str("status") != "cancelled" {
					t.Errorf("cancel order %s: %d %s", won[u.ID], got.Status, got.Raw)
				}
			})
		}
		cancels.Wait()
	}
	if cancelsFirst {
		cancel()
		pay()
	} else {
		pay()
		cancel()
	}
	<-injected

	waitFor(t, 30*time.Second, "no order unpaid past its deadline", func() bool {
		var n int64
		db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = 'unpaid'", vid).Scan(&n)
		return n == 0
	})
	first := map[string]reply{}
	for _, a := range answers {
		if prev, ok := first[a.event]; ok && a.r.Raw != prev.Raw {
			t.Errorf("event %s answered %d %s after %d %s", a.event, a.r.Status, a.r.Raw, prev.Status, prev.Raw)
		}
		switch {
		case a.r.Status == http.StatusOK:
			if _, ok := first[a.event]; !ok {
				first[a.event] = a.r
			}
		case a.r.Status != http.StatusServiceUnavailable || reachable:
			t.Errorf("event %s answered %d %s", a.event, a.r.Status, a.r.Raw)
		}
	}
	rows := lifecycleRows(t, db, vid)
	for id, o := range rows {
		a, delivered := first[fmt.Sprintf("evt_%d", id)]
		kept := delivered && a.Str("status") == "paid" && a.Body["refund"] == nil
		switch {
		case o.paid && o.cancelled:
			t.Errorf("order %d was paid and cancelled", id)
		case o.status == "paid" && !kept, o.status != "paid" && kept:
			t.Errorf("order %d is %s, and its payment was answered %s", id, o.status, a.Raw)
		}
	}
	if lostLog := map[string]string{
		"payment commit reply dropped": "payment event: the answer to its COMMIT was lost",
		"cancel commit reply dropped":  "order transition: the answer to its COMMIT was lost",
	}[fc.name]; lostLog != "" {
		lost := false
		for _, in := range insts {
			lost = lost || strings.Contains(in.log.String(), lostLog)
		}
		if !lost {
			t.Errorf("no instance logged %q: the dropped COMMIT was another's, and the case proved nothing", lostLog)
		}
	}
	_, back := checkLifecycle(t, db, rdb, vid, initial)
	if back < initial/3 {
		t.Errorf("%d units came back, want at least the %d cancelled by their buyers", back, initial/3)
	}
	var again ledger
	rush(&again, insts, users[initial:], vid, 2)
	if n := len(again.wins(t)); n != min(back, len(users)-initial) {
		t.Errorf("%d newcomers bought, want %d of the %d units that came back", n, min(back, len(users)-initial), back)
	}
	waitFor(t, 10*time.Second, "the newcomers' orders written", func() bool {
		var n int64
		db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&n)
		return n == int64(initial+len(again.wins(t)))
	})
	checkLifecycle(t, db, rdb, vid, initial)
	t.Logf("%s/%s: %d paid, %d cancelled; %d deliveries", mode, fc.name, inStatus(rows, "paid"), inStatus(rows, "cancelled"), len(answers))
}
