package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/payment"
	"seckill/internal/testenv"
)

// webhook delivers a payment event to base, signed as the provider signs
// it, and returns the answer.
func webhook(base string, e payment.Event) (reply, error) {
	body := e.Body()
	req, err := http.NewRequest("POST", base+"/payments/webhook", bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(payment.Header, payment.Sign([]byte(testPaySecret), body, time.Now()))
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	if err := json.Unmarshal(raw, &r.Body); err != nil {
		return r, fmt.Errorf("webhook: answer is not JSON: %q", raw)
	}
	return r, nil
}

// deliver delivers e until it is answered with something else than a 503,
// as a provider retries, trying the instances in turn.
func deliver(insts []*instance, first int, e payment.Event) (reply, error) {
	for try := 0; ; try++ {
		r, err := webhook(insts[(first+try)%len(insts)].Base, e)
		if err != nil || r.Status != http.StatusServiceUnavailable || try == 100 {
			return r, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A sale on three instances, then its orders' lives: a third of the buyers
// pay (each event delivered twice at once, to two instances, and a second
// payment after it), a third cancel (some twice), a third let the deadline
// pass; some payments race the deadline. At rest: every order paid or
// cancelled, never both; each event applied once and answered the same
// every time; stock + unpaid + paid = initial; Redis equal to MySQL; and
// the units that came back are sold again to new buyers, and no more.
func TestOrderLifecycleAcrossThreeInstances(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			redisDB := 0
			if mode == "async" {
				redisDB = 11 // the orders streams are one per Redis database
			}
			st := newStack(t, redisDB)
			insts := startMany(t, st, 3, "SECKILL_MODE", mode)
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			const initial, price, within = 90, 1990, 12
			vid := createVoucher(t, insts[0].Base, admin, initial, time.Now().Add(-time.Minute), time.Now().Add(time.Hour),
				"price", price, "pay_within", within)
			users := loginMany(t, insts[1].Base, initial)

			var l ledger
			rush(&l, insts, users, vid, 1)
			onlyExpected(t, &l)
			won := l.wins(t)
			if len(won) != initial {
				t.Fatalf("%d of %d buyers got a unit", len(won), initial)
			}
			db := testenv.Open(t, withParseTime(t, st.DSN))
			// Async: the orders are rows within moments.
			waitFor(t, 10*time.Second, "every order written", func() bool {
				var n int64
				db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&n)
				return n == initial
			})

			type answer struct {
				event payment.Event
				r     reply
				err   error
			}
			var mu sync.Mutex
			var answers []answer
			record := func(e payment.Event, r reply, err error) {
				mu.Lock()
				answers = append(answers, answer{e, r, err})
				mu.Unlock()
			}
			var wg sync.WaitGroup
			// Each order as its buyer reads it; the deadline of those that
			// pay at it, or after.
			payBys := map[int64]time.Time{}
			for i, u := range users {
				id, _ := strconv.ParseInt(won[u.ID], 10, 64)
				if i%6 != 2 && i%6 != 5 && i%9 != 0 {
					continue
				}
				o := mustCall(t, "GET", insts[i%3].Base+"/orders/"+won[u.ID], u.Token, nil)
				payBy, err := time.Parse(time.RFC3339Nano, o.Str("pay_by"))
				if o.Status != http.StatusOK || o.Str("status") != "unpaid" || o.Body["amount"] != float64(price) || err != nil {
					t.Fatalf("order %d before its life: %d %s", id, o.Status, o.Raw)
				}
				payBys[id] = payBy
			}
			for i, u := range users {
				id, _ := strconv.ParseInt(won[u.ID], 10, 64)
				payBy := payBys[id]
				first := payment.Event{ID: fmt.Sprintf("evt_%d_1", id), OrderID: id, Amount: price}
				second := payment.Event{ID: fmt.Sprintf("evt_%d_2", id), OrderID: id, Amount: price}
				switch i % 6 {
				case 0, 1: // pays: the event twice at once, then another payment
					for k := range 2 {
						wg.Go(func() { r, err := deliver(insts, i+k, first); record(first, r, err) })
					}
					wg.Go(func() {
						time.Sleep(200 * time.Millisecond)
						r, err := deliver(insts, i+2, second)
						record(second, r, err)
					})
				case 2: // pays right at the deadline: it wins or loses, never both
					wg.Go(func() {
						time.Sleep(time.Until(payBy) + time.Duration(i%5-2)*20*time.Millisecond)
						r, err := deliver(insts, i, first)
						record(first, r, err)
						r, err = deliver(insts, i+1, first) // and the provider's retry
						record(first, r, err)
					})
				case 3, 4: // cancels, sometimes twice at once
					for k := range 1 + i%2 {
						wg.Go(func() {
							r, err := call("POST", insts[(i+k)%3].Base+"/orders/"+won[u.ID]+"/cancel", u.Token, nil)
							if err != nil || r.Status != http.StatusOK || r.Str("status") != "cancelled" || r.Str("cancel_reason") != "buyer" {
								t.Errorf("cancel order %d: %v %d %s", id, err, r.Status, r.Raw)
							}
						})
					}
				case 5: // lets the deadline pass, then pays late
					wg.Go(func() {
						time.Sleep(time.Until(payBy) + 1500*time.Millisecond)
						r, err := deliver(insts, i, first)
						record(first, r, err)
					})
				}
			}
			wg.Wait()

			// The deadline's bound: nothing unpaid 30 s after its pay_by (here
			// within a few sweeps of SWEEP_EVERY, 500 ms).
			waitFor(t, 15*time.Second, "no order unpaid past its deadline", func() bool {
				var n int64
				db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = 'unpaid'", vid).Scan(&n)
				return n == 0
			})
			byEvent := map[string]reply{}
			kept := map[int64]int{}
			for _, a := range answers {
				if a.err != nil || a.r.Status != http.StatusOK {
					t.Errorf("event %s: %v %d %s", a.event.ID, a.err, a.r.Status, a.r.Raw)
					continue
				}
				if prev, ok := byEvent[a.event.ID]; ok && prev.Raw != a.r.Raw {
					t.Errorf("event %s answered %s, then %s", a.event.ID, prev.Raw, a.r.Raw)
				}
				if _, ok := byEvent[a.event.ID]; !ok && a.r.Str("status") == "paid" && a.r.Body["refund"] == nil {
					kept[a.event.OrderID]++
				}
				byEvent[a.event.ID] = a.r
			}
			rows := lifecycleRows(t, db, vid)
			for id, o := range rows {
				switch {
				case o.paid && o.cancelled:
					t.Errorf("order %d was paid and cancelled", id)
				case o.status == "paid" && kept[id] != 1:
					t.Errorf("order %d is paid, and %d payments were kept", id, kept[id])
				case o.status == "cancelled" && kept[id] != 0:
					t.Errorf("order %d is cancelled, and a payment was kept", id)
				case o.status != "paid" && o.status != "cancelled":
					t.Errorf("order %d is %s at rest", id, o.status)
				}
			}
			var events int64
			db.Raw("SELECT COUNT(*) FROM payment_events WHERE order_id IN (SELECT id FROM voucher_orders WHERE voucher_id = ?)", vid).Scan(&events)
			if events != int64(len(byEvent)) {
				t.Errorf("%d events recorded, %d delivered", events, len(byEvent))
			}
			rdb := testenv.Redis(t, st.RedisDB)
			_, back := checkLifecycle(t, db, rdb, vid, initial)
			if back == 0 {
				t.Fatal("no unit came back: the test proves nothing")
			}

			// The units that came back sell again, and no more than they.
			more := loginMany(t, insts[2].Base, back+20)
			var again ledger
			rush(&again, insts, more, vid, 2)
			onlyExpected(t, &again, "sold_out", "already_ordered")
			if n := len(again.wins(t)); n != back {
				t.Errorf("%d newcomers bought, want the %d units that came back", n, back)
			}
			// The first buyers hold their orders for life.
			if o := buy(&again, insts[0].Base, users[3], vid); o.Code != "already_ordered" && o.Code != "sold_out" {
				t.Errorf("a buyer whose order was cancelled buys again: %d %s", o.Status, o.Code)
			}
			waitFor(t, 10*time.Second, "the newcomers' orders written", func() bool {
				var n int64
				db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&n)
				return n == int64(initial+back)
			})
			checkLifecycle(t, db, rdb, vid, initial)
			t.Logf("%d paid, %d cancelled (%d returned units sold again)", inStatus(rows, "paid"), inStatus(rows, "cancelled"), back)
		})
	}
}

// lifecycleRow is what a test reads of an order's life.
type lifecycleRow struct {
	status          string
	paid, cancelled bool // paid_at, cancelled_at set
}

func lifecycleRows(t *testing.T, db *gorm.DB, voucherID string) map[int64]lifecycleRow {
	t.Helper()
	var rows []struct {
		ID                  int64
		Status              string
		PaidAt, CancelledAt *time.Time
	}
	if err := db.Raw("SELECT id, status, paid_at, cancelled_at FROM voucher_orders WHERE voucher_id = ?", voucherID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := map[int64]lifecycleRow{}
	for _, r := range rows {
		out[r.ID] = lifecycleRow{status: r.Status, paid: r.PaidAt != nil, cancelled: r.CancelledAt != nil}
	}
	return out
}

func inStatus(rows map[int64]lifecycleRow, status string) int {
	n := 0
	for _, r := range rows {
		if r.status == status {
			n++
		}
	}
	return n
}

// checkLifecycle waits until the voucher is at rest (no unit on its way
// back to Redis, no hold open, Redis equal to MySQL), then checks the
// contract's invariant: initial = stock + orders unpaid or paid, and the
// voucher's counts equal to its rows'. It returns the state at rest, and
// the units that came back (cancelled and refunded orders).
func checkLifecycle(t *testing.T, db *gorm.DB, rdb redis.UniversalClient, voucherID string, initial int) (storeState, int) {
	t.Helper()
	waitFor(t, 15*time.Second, "every returned unit back in Redis", func() bool {
		var n int64
		db.Raw("SELECT COUNT(*) FROM stock_returns WHERE voucher_id = ?", voucherID).Scan(&n)
		return n == 0
	})
	s := waitRest(t, db, rdb, voucherID, 10*time.Second)
	checkCounts(t, s)
	var live, back int64
	db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status IN ('unpaid', 'paid')", voucherID).Scan(&live)
	db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status IN ('cancelled', 'refunded')", voucherID).Scan(&back)
	if s.Stock+live != int64(initial) {
		t.Errorf("stock %d + unpaid or paid orders %d = %d, want the initial %d", s.Stock, live, s.Stock+live, initial)
	}
	for u, n := range s.Users {
		if n > 1 {
			t.Errorf("user %d holds %d orders", u, n)
		}
	}
	return s, int(back)
}

// The lifecycle's answers, through HTTP, as the contract lists them: the
// webhook's 401 and 400 (nothing changes), the pending order's 503 and
// 409 with Retry-After (async), invalid_state for a transition the status
// does not allow, and the voucher's price and pay_within bounds.
func TestAPIOrderLifecycle(t *testing.T) {
	st := newStack(t, 10) // async: a Redis database of its own
	in := start(t, st.env(freeAddr(t), "SECKILL_MODE", "async"))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	for _, bad := range []map[string]any{{"price": -1}, {"price": 100_000_001}, {"pay_within": 0}, {"pay_within": 86_401}, {"price": "1"}} {
		body := map[string]any{"title": "t", "stock": 1, "begin_time": time.Now().UTC().Format(time.RFC3339), "end_time": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}
		for k, v := range bad {
			body[k] = v
		}
		if r := mustCall(t, "POST", in.Base+"/vouchers", admin, body); r.Status != http.StatusBadRequest || r.Code() != "invalid_argument" {
			t.Errorf("voucher with %v: %d %s, want 400 invalid_argument", bad, r.Status, r.Raw)
		}
	}
	vid := createVoucher(t, in.Base, admin, 10, time.Now().Add(-time.Minute), time.Now().Add(time.Hour), "price", 700)
	if v := mustCall(t, "GET", in.Base+"/vouchers/"+vid, "", nil); v.Body["price"] != float64(700) || v.Body["pay_within"] != float64(900) {
		t.Errorf("voucher: %s, want price 700 and the default pay_within 900", v.Raw)
	}
	u := loginMany(t, in.Base, 1)[0]
	db := testenv.Open(t, withParseTime(t, st.DSN))

	// MySQL refuses every order for a while: the order stays pending.
	if err := db.Exec("CREATE TRIGGER hold_orders BEFORE INSERT ON voucher_orders FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'held by the test'").Error; err != nil {
		t.Fatal(err)
	}
	r := mustCall(t, "POST", in.Base+"/seckill/"+vid, u.Token, nil)
	id := r.Str("order_id")
	oid, _ := strconv.ParseInt(id, 10, 64)
	if o := mustCall(t, "GET", in.Base+"/orders/"+id, u.Token, nil); o.Str("status") != "pending" || o.Body["amount"] != float64(700) || o.Str("pay_by") == "" {
		t.Fatalf("the pending order: %s", o.Raw)
	}
	e := payment.Event{ID: "evt_pending", OrderID: oid, Amount: 700}
	if r, err := webhook(in.Base, e); err != nil || r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Errorf("payment of a pending order: %v %d %s, want 503 with Retry-After", err, r.Status, r.Raw)
	}
	if r := mustCall(t, "POST", in.Base+"/orders/"+id+"/cancel", u.Token, nil); r.Status != http.StatusConflict || r.Code() != "invalid_state" || r.Header.Get("Retry-After") == "" {
		t.Errorf("cancel of a pending order: %d %s, want 409 invalid_state with Retry-After", r.Status, r.Raw)
	}
	if err := db.Exec("DROP TRIGGER hold_orders").Error; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the order written", func() bool {
		return mustCall(t, "GET", in.Base+"/orders/"+id, u.Token, nil).Str("status") == "unpaid"
	})

	// The webhook refuses what is not the provider's, or not an order's.
	body := e.Body()
	send := func(header string, body []byte) reply {
		req, _ := http.NewRequest("POST", in.Base+"/payments/webhook", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set(payment.Header, header)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		r := reply{Status: resp.StatusCode, Raw: string(raw)}
		json.Unmarshal(raw, &r.Body)
		return r
	}
	sign := func(b []byte, at time.Time) string { return payment.Sign([]byte(testPaySecret), b, at) }
	for _, tc := range []struct {
		name   string
		header string
		body   []byte
		status int
		code   string
	}{
		{"no signature", "", body, 401, "unauthorized"},
		{"another key", payment.Sign([]byte("not-the-secret-0123456789abcdef012"), body, time.Now()), body, 401, "unauthorized"},
		{"signed 301 s ago", sign(body, time.Now().Add(-301*time.Second)), body, 401, "unauthorized"},
		{"signed for another body", sign([]byte(`{}`), time.Now()), body, 401, "unauthorized"},
		{"malformed", sign([]byte(`{"event_id":"x"}`), time.Now()), []byte(`{"event_id":"x"}`), 400, "invalid_argument"},
		{"unknown order", sign(payment.Event{ID: "evt_x", OrderID: 12345, Amount: 700}.Body(), time.Now()), payment.Event{ID: "evt_x", OrderID: 12345, Amount: 700}.Body(), 400, "invalid_argument"},
		{"another amount", sign(payment.Event{ID: "evt_y", OrderID: oid, Amount: 1}.Body(), time.Now()), payment.Event{ID: "evt_y", OrderID: oid, Amount: 1}.Body(), 400, "invalid_argument"},
	} {
		if r := send(tc.header, tc.body); r.Status != tc.status || r.Code() != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, r.Status, r.Raw, tc.status, tc.code)
		}
	}
	if o := mustCall(t, "GET", in.Base+"/orders/"+id, u.Token, nil); o.Str("status") != "unpaid" {
		t.Fatalf("after the refused events: %s, want unpaid", o.Raw)
	}
	// Refund of an unpaid order: invalid_state. Then paid; cancel:
	// invalid_state; refund, twice: refunded, once.
	if r := mustCall(t, "POST", in.Base+"/orders/"+id+"/refund", u.Token, nil); r.Status != http.StatusConflict || r.Code() != "invalid_state" {
		t.Errorf("refund of an unpaid order: %d %s", r.Status, r.Raw)
	}
	if r, err := webhook(in.Base, e); err != nil || r.Status != 200 || r.Str("status") != "paid" || r.Body["refund"] != nil {
		t.Fatalf("payment: %v %d %s", err, r.Status, r.Raw)
	}
	if r := mustCall(t, "POST", in.Base+"/orders/"+id+"/cancel", u.Token, nil); r.Status != http.StatusConflict || r.Code() != "invalid_state" {
		t.Errorf("cancel of a paid order: %d %s", r.Status, r.Raw)
	}
	for range 2 {
		if r := mustCall(t, "POST", in.Base+"/orders/"+id+"/refund", u.Token, nil); r.Status != 200 || r.Str("status") != "refunded" || r.Str("refunded_at") == "" {
			t.Errorf("refund: %d %s", r.Status, r.Raw)
		}
	}
	if r, err := webhook(in.Base, payment.Event{ID: "evt_late", OrderID: oid, Amount: 700}); err != nil || r.Str("status") != "refunded" || r.Body["refund"] != true {
		t.Errorf("a payment of a refunded order: %v %s, want refunded with a refund", err, r.Raw)
	}
	if n := voucherStock(t, in.Base, vid); n != 10 {
		t.Errorf("stock %d after the refund, want all 10 back", n)
	}
}
