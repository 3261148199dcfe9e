package order

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order/queue"
	"seckill/internal/payment"
	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// lifecycleRig is a sale on a real MySQL and Redis: instances Services
// (sync mode) sharing them, as instances of the server do, and a voucher
// of initial units at price 500.
type lifecycleRig struct {
	db       *gorm.DB
	rdb      *redis.Client
	stocks   *stock.Store
	svcs     []*Service
	obs      *counting
	voucher  int64
	initial  int64
	provider *flakyProvider
}

// flakyProvider is the Fake provider, whose asks fail while failing is
// set: a provider down, or an answer lost on the way.
type flakyProvider struct {
	*payment.Fake
	failing atomic.Bool
}

var errProviderDown = errors.New("provider down")

func (p *flakyProvider) Charge(ctx context.Context, orderID, amount int64) error {
	if p.failing.Load() {
		return errProviderDown
	}
	return p.Fake.Charge(ctx, orderID, amount)
}

func (p *flakyProvider) Refund(ctx context.Context, orderID, amount int64) error {
	if p.failing.Load() {
		return errProviderDown
	}
	return p.Fake.Refund(ctx, orderID, amount)
}

func newLifecycleRig(t *testing.T, instances int, initial int64) *lifecycleRig {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &lifecycleRig{db: testenv.Open(t, testenv.MySQLDSN(t)), rdb: testenv.Redis(t, 0), obs: &counting{}, initial: initial}
	r.stocks = stock.NewStore(r.rdb, 15*time.Second)
	r.provider = &flakyProvider{Fake: payment.NewFake([]byte("lifecycle-test-secret-0123456789abcdef"), log)}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait(); r.provider.Close() })
	var vouchers *voucher.Service
	for range instances {
		vouchers = voucher.NewService(r.db, r.stocks, nil, nil, time.Now, log)
		q := queue.New(r.rdb, r.stocks)
		cfg := DefaultConfig
		cfg.Observer, cfg.Provider = r.obs, r.provider
		s := NewService(r.db, q, vouchers, r.stocks, lock.NewRedis(r.rdb), idworker.New(r.rdb, time.Now, IDFloor(r.db, q)), time.Now, log, cfg)
		wg.Go(func() { s.RunWriter(ctx) })
		t.Cleanup(s.Close)
		r.svcs = append(r.svcs, s)
	}
	title, price, within := "lifecycle", int64(500), 900
	begin, end := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	v, err := vouchers.Create(context.Background(), 0, "", voucher.CreateInput{Title: &title, Stock: &initial, BeginTime: &begin, EndTime: &end, Price: &price, PayWithin: &within})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Sscan(v.ID, &r.voucher)
	return r
}

// buy has users 1..n buy a unit each, and returns their orders' IDs.
func (r *lifecycleRig) buy(t *testing.T, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		id, err := r.svcs[i%len(r.svcs)].Seckill(context.Background(), int64(i+1), r.voucher)
		if err != nil {
			t.Fatalf("user %d buys: %v", i+1, err)
		}
		ids[i] = id
	}
	return ids
}

// dueIn sets every unpaid order's deadline d from now.
func (r *lifecycleRig) dueIn(t *testing.T, d time.Duration) {
	t.Helper()
	if err := r.db.Exec("UPDATE voucher_orders SET pay_by = ? WHERE voucher_id = ? AND status = 'unpaid'", time.Now().UTC().Add(d), r.voucher).Error; err != nil {
		t.Fatal(err)
	}
}

// atRest drains the returns to Redis, then checks the contract's
// invariants: stock + unpaid + paid = initial in MySQL, Redis equal to
// MySQL, no return left to make, and each cancelled or refunded order's
// unit returned exactly once (the Observer's count), and the voucher's
// counters equal to its orders' rows. It returns the orders by status.
func (r *lifecycleRig) atRest(t *testing.T) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	if err := r.svcs[0].drainReturns(ctx); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Status string
		N      int64
	}
	r.db.Raw("SELECT status, COUNT(*) AS n FROM voucher_orders WHERE voucher_id = ? GROUP BY status", r.voucher).Scan(&rows)
	by := map[string]int64{}
	for _, row := range rows {
		by[row.Status] = row.N
	}
	var left, pending int64
	r.db.Raw("SELECT stock FROM vouchers WHERE id = ?", r.voucher).Scan(&left)
	r.db.Raw("SELECT COUNT(*) FROM stock_returns").Scan(&pending)
	if got := left + by[StatusUnpaid] + by[StatusPaid]; got != r.initial {
		t.Errorf("stock %d + unpaid %d + paid %d = %d, want the initial %d (%v)", left, by[StatusUnpaid], by[StatusPaid], got, r.initial, by)
	}
	if pending != 0 {
		t.Errorf("%d returns to Redis still to make", pending)
	}
	inRedis, ok, err := r.stocks.Left(ctx, r.voucher, 1)
	if err != nil || !ok || inRedis != left {
		t.Errorf("Redis has %d (%v, %v), MySQL %d", inRedis, ok, err, left)
	}
	if back := r.obs.returned.Load(); back != by[StatusCancelled]+by[StatusRefunded] {
		t.Errorf("%d units returned to Redis for %d cancelled and %d refunded orders", back, by[StatusCancelled], by[StatusRefunded])
	}
	checkCounts(t, r.db, r.voucher)
	return by
}

// A payment and the deadline arriving together: every order ends paid or
// cancelled, never both; a unit comes back only for a cancelled one, once;
// every delivery of one event gets one answer; a payment that lost is
// refused with a refund, and a second payment of a paid order too. Three
// instances' expirers, the payments and the buyers' cancels all race.
func TestPaymentAgainstTheDeadline(t *testing.T) {
	r := newLifecycleRig(t, 3, 200)
	orders := r.buy(t, 120)
	r.dueIn(t, 60*time.Millisecond)

	type delivery struct {
		event payment.Event
		ans   PaymentAnswer
		err   error
	}
	var mu sync.Mutex
	got := map[int64][]delivery{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	jitter := func() { time.Sleep(time.Duration(rand.IntN(120)) * time.Millisecond) }
	for i, id := range orders {
		first := payment.Event{ID: fmt.Sprintf("ev-%d-a", id), OrderID: id, Amount: 500}
		second := payment.Event{ID: fmt.Sprintf("ev-%d-b", id), OrderID: id, Amount: 500}
		for _, e := range []payment.Event{first, first, second} { // a duplicate delivery, and a second payment
			wg.Go(func() {
				<-start
				jitter()
				a, err := r.svcs[rand.IntN(len(r.svcs))].ApplyPayment(context.Background(), e)
				mu.Lock()
				got[id] = append(got[id], delivery{e, a, err})
				mu.Unlock()
			})
		}
		if i%3 == 0 { // a third of the buyers also try to cancel
			wg.Go(func() {
				<-start
				jitter()
				_, err := r.svcs[rand.IntN(len(r.svcs))].Cancel(context.Background(), id, int64(i+1))
				if err != nil && !errors.Is(err, ErrInvalidState) {
					t.Errorf("cancel order %d: %v", id, err)
				}
			})
		}
	}
	for _, s := range r.svcs {
		wg.Go(func() {
			<-start
			for range 6 {
				jitter()
				if _, err := s.Expire(context.Background()); err != nil {
					t.Errorf("expire: %v", err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	// Whatever is still unpaid is due: one more round settles it.
	if _, err := r.svcs[0].Expire(context.Background()); err != nil {
		t.Fatal(err)
	}

	by := r.atRest(t)
	if by[StatusPaid]+by[StatusCancelled] != int64(len(orders)) {
		t.Fatalf("orders by status %v: each of the %d should be paid or cancelled", by, len(orders))
	}
	for _, id := range orders {
		var o Order
		if err := r.db.Take(&o, id).Error; err != nil {
			t.Fatal(err)
		}
		if o.PaidAt != nil && o.CancelledAt != nil {
			t.Errorf("order %d was paid and cancelled", id)
		}
		answers := map[string]PaymentAnswer{}
		paid := 0
		for _, d := range got[id] {
			if d.err != nil {
				t.Errorf("order %d, event %s: %v", id, d.event.ID, d.err)
				continue
			}
			if prev, ok := answers[d.event.ID]; ok && prev != d.ans {
				t.Errorf("order %d, event %s answered %+v, then %+v", id, d.event.ID, prev, d.ans)
			}
			answers[d.event.ID] = d.ans
		}
		for _, a := range answers {
			if a.Status == StatusPaid && !a.Refund {
				paid++
			}
		}
		switch {
		case o.Status == StatusPaid && paid != 1:
			t.Errorf("order %d is paid, and %d events were kept (answers %v)", id, paid, answers)
		case o.Status == StatusCancelled && paid != 0:
			t.Errorf("order %d is cancelled, and a payment was kept (answers %v)", id, answers)
		}
	}
	var events int64
	r.db.Raw("SELECT COUNT(*) FROM payment_events").Scan(&events)
	if events != int64(2*len(orders)) {
		t.Errorf("%d payment events recorded, want one per event: %d", events, 2*len(orders))
	}
	t.Logf("%v; %d returned", by, r.obs.returned.Load())
}

// Units that come back are sold again: after every order of a sold-out
// voucher is cancelled by its deadline, new buyers buy them all, and no
// more.
func TestReturnedUnitsSellAgain(t *testing.T) {
	r := newLifecycleRig(t, 2, 30)
	r.buy(t, 30)
	if _, err := r.svcs[0].Seckill(context.Background(), 1000, r.voucher); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("a buyer past the stock: %v, want sold out", err)
	}
	r.dueIn(t, -time.Second)
	var wg sync.WaitGroup
	for _, s := range r.svcs {
		wg.Go(func() {
			if _, err := s.Expire(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if by := r.atRest(t); by[StatusCancelled] != 30 {
		t.Fatalf("orders by status %v, want 30 cancelled", by)
	}
	if n := r.obs.cancelled.Load(); n != 30 {
		t.Fatalf("%d cancels counted by two expirers at once, want 30", n)
	}
	// The instance that found the voucher sold out remembers it for a
	// moment (Config.SoldOutMemo).
	time.Sleep(2 * DefaultConfig.SoldOutMemo)
	// The first buyers hold their (cancelled) orders for life.
	if _, err := r.svcs[1].Seckill(context.Background(), 1, r.voucher); !errors.Is(err, ErrAlreadyOrdered) {
		t.Fatalf("a buyer whose order was cancelled, again: %v, want already ordered", err)
	}
	sold := 0
	for u := int64(2000); u < 2040; u++ {
		_, err := r.svcs[int(u)%2].Seckill(context.Background(), u, r.voucher)
		switch {
		case err == nil:
			sold++
		case !errors.Is(err, ErrSoldOut):
			t.Fatal(err)
		}
	}
	if sold != 30 {
		t.Fatalf("%d returned units sold again, want 30", sold)
	}
	r.atRest(t)
}

// Refunds: the buyer and an admin refund a paid order at once, twice each;
// one refund happens, its unit comes back once, and the provider is asked
// to give back the amount once per order.
func TestRefundOnce(t *testing.T) {
	r := newLifecycleRig(t, 2, 10)
	orders := r.buy(t, 5)
	for _, id := range orders {
		if a, err := r.svcs[0].ApplyPayment(context.Background(), payment.Event{ID: fmt.Sprint("pay-", id), OrderID: id, Amount: 500}); err != nil || a.Status != StatusPaid {
			t.Fatalf("pay order %d: %+v %v", id, a, err)
		}
	}
	var wg sync.WaitGroup
	for i, id := range orders {
		for k := range 4 {
			wg.Go(func() {
				v, err := r.svcs[k%2].Refund(context.Background(), id, int64(i+1), k >= 2)
				if err != nil || v.Status != StatusRefunded {
					t.Errorf("refund order %d: %+v %v", id, v, err)
				}
			})
		}
	}
	wg.Wait()
	if by := r.atRest(t); by[StatusRefunded] != 5 {
		t.Fatalf("orders by status %v, want 5 refunded", by)
	}
	if n := r.obs.refunded.Load(); n != 5 {
		t.Errorf("%d refunds counted, want 5", n)
	}
	for _, id := range orders {
		if got := r.provider.Refunded(id); got != 500 {
			t.Errorf("order %d: the provider gave back %d, want 500", id, got)
		}
		// Asked once, though refunded by four calls and asked again below.
		if _, err := r.svcs[1].Refund(context.Background(), id, 0, true); err != nil {
			t.Errorf("refund a refunded order again: %v", err)
		}
		if _, refunds := r.provider.Asked(id); refunds != 1 {
			t.Errorf("order %d: the provider was asked %d times to refund it, want once", id, refunds)
		}
		// A refunded order cannot be cancelled, nor paid again.
		if _, err := r.svcs[0].Cancel(context.Background(), id, 1); !errors.Is(err, ErrInvalidState) && !errors.Is(err, ErrNotFound) {
			t.Errorf("cancel a refunded order: %v", err)
		}
		a, err := r.svcs[0].ApplyPayment(context.Background(), payment.Event{ID: fmt.Sprint("late-", id), OrderID: id, Amount: 500})
		if err != nil || a.Status != StatusRefunded || !a.Refund {
			t.Errorf("a payment of a refunded order: %+v %v, want refunded with a refund", a, err)
		}
	}
}

// A refund the provider did not take is asked again by the next call, and
// then never more.
func TestRefundAskedAgainAfterAFailure(t *testing.T) {
	r := newLifecycleRig(t, 1, 2)
	id := r.buy(t, 1)[0]
	if a, err := r.svcs[0].ApplyPayment(context.Background(), payment.Event{ID: "pay-once", OrderID: id, Amount: 500}); err != nil || a.Status != StatusPaid {
		t.Fatalf("pay: %+v %v", a, err)
	}
	r.provider.failing.Store(true)
	if _, err := r.svcs[0].Refund(context.Background(), id, 1, false); !errors.Is(err, errProviderDown) {
		t.Fatalf("refund with the provider down: %v, want its error", err)
	}
	r.provider.failing.Store(false)
	for range 3 {
		if v, err := r.svcs[0].Refund(context.Background(), id, 1, false); err != nil || v.Status != StatusRefunded {
			t.Fatalf("refund again: %+v %v", v, err)
		}
	}
	if _, refunds := r.provider.Asked(id); refunds != 1 || r.provider.Refunded(id) != 500 {
		t.Errorf("the provider took %d asks and gave back %d, want one ask and 500", refunds, r.provider.Refunded(id))
	}
}

// A refund whose asker died after claiming the ask (or whose provider
// failed, and whose buyer never came back) is finished by the expirer's
// round, once; a claim younger than askAgainAfter is left to its asker.
func TestRefundFinishedByTheExpirer(t *testing.T) {
	r := newLifecycleRig(t, 2, 3)
	ctx := context.Background()
	ids := r.buy(t, 2)
	for _, id := range ids {
		if a, err := r.svcs[0].ApplyPayment(ctx, payment.Event{ID: fmt.Sprint("pay-", id), OrderID: id, Amount: 500}); err != nil || a.Status != StatusPaid {
			t.Fatalf("pay: %+v %v", a, err)
		}
	}
	r.provider.failing.Store(true)
	for i, id := range ids {
		if _, err := r.svcs[0].Refund(ctx, id, int64(i+1), false); !errors.Is(err, errProviderDown) {
			t.Fatalf("refund with the provider down: %v", err)
		}
	}
	r.provider.failing.Store(false)
	// Order 0: its asker claimed the ask two minutes ago and died. Order
	// 1: someone claimed it a moment ago, and is asking.
	now := time.Now().UTC()
	r.db.Exec("UPDATE voucher_orders SET refund_asked_at = ? WHERE id = ?", now.Add(-2*time.Minute), ids[0])
	r.db.Exec("UPDATE voucher_orders SET refund_asked_at = ? WHERE id = ?", now, ids[1])
	for range 3 {
		for _, s := range r.svcs {
			if err := s.finishRefunds(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, refunds := r.provider.Asked(ids[0]); refunds != 1 || r.provider.Refunded(ids[0]) != 500 {
		t.Errorf("a dead asker's refund: asked %d times, gave back %d; want once, 500", refunds, r.provider.Refunded(ids[0]))
	}
	if _, refunds := r.provider.Asked(ids[1]); refunds != 0 {
		t.Errorf("a refund being asked for: asked %d times by the expirer, want 0", refunds)
	}
}

// Many clicks of "pay", at once, on two instances: the provider is asked
// to charge once per order, and every click is answered with the order.
// A charge the provider refused is asked again by the next click.
func TestPayAskedOnce(t *testing.T) {
	r := newLifecycleRig(t, 2, 10)
	orders := r.buy(t, 4)
	var wg sync.WaitGroup
	for i, id := range orders {
		for k := range 5 {
			wg.Go(func() {
				v, err := r.svcs[k%2].Pay(context.Background(), id, int64(i+1))
				if err != nil || v.Status != StatusUnpaid {
					t.Errorf("click %d on order %d: %+v %v", k, id, v, err)
				}
			})
		}
	}
	wg.Wait()
	for _, id := range orders {
		if charges, _ := r.provider.Asked(id); charges != 1 {
			t.Errorf("order %d: the provider was asked %d times to charge it, want once", id, charges)
		}
	}
	if _, err := r.svcs[0].Pay(context.Background(), orders[0], 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("another user pays the order: %v, want not found", err)
	}

	// A failed ask gives its claim up: the next click asks.
	id, err := r.svcs[0].Seckill(context.Background(), 5, r.voucher)
	if err != nil {
		t.Fatal(err)
	}
	r.provider.failing.Store(true)
	if _, err := r.svcs[0].Pay(context.Background(), id, 5); !errors.Is(err, errProviderDown) {
		t.Fatalf("pay with the provider down: %v, want its error", err)
	}
	r.provider.failing.Store(false)
	for range 2 {
		if _, err := r.svcs[1].Pay(context.Background(), id, 5); err != nil {
			t.Fatalf("pay again: %v", err)
		}
	}
	if charges, _ := r.provider.Asked(id); charges != 1 {
		t.Errorf("after a failed ask, the provider was asked %d times, want once", charges)
	}
}

// Payment events are told apart by their exact ID: two IDs that differ
// only in letter case are two events, for two orders or for one (a
// case-folding column took the second for a retry of the first: for
// another order, that order's payment was answered with the first order's
// answer and never applied; for the same order, a double payment was not
// given back).
func TestEventIDsCompareExactly(t *testing.T) {
	r := newLifecycleRig(t, 1, 3)
	orders := r.buy(t, 2)
	ctx := context.Background()
	for _, tc := range []struct {
		event  string
		order  int64
		status string
		refund bool
	}{
		{"evt_CaseTest_1", orders[0], StatusPaid, false},
		{"evt_casetest_1", orders[1], StatusPaid, false},  // another order
		{"EVT_CASETEST_1", orders[0], StatusPaid, true},   // the same order again: a double payment
		{"evt_CaseTest_1", orders[0], StatusPaid, false},  // a retry: the first answer
		{"evt_casetest_1 ", orders[1], StatusPaid, false}, // not an ID (ParseEvent refuses it); MySQL would pad it
	} {
		if strings.HasSuffix(tc.event, " ") {
			var n int64
			r.db.Raw("SELECT COUNT(*) FROM payment_events WHERE event_id = ?", tc.event).Scan(&n)
			if n != 0 {
				t.Errorf("%q finds %d events: trailing spaces are compared", tc.event, n)
			}
			continue
		}
		a, err := r.svcs[0].ApplyPayment(ctx, payment.Event{ID: tc.event, OrderID: tc.order, Amount: 500})
		want := PaymentAnswer{OrderID: fmt.Sprint(tc.order), Status: tc.status, Refund: tc.refund}
		if err != nil || a != want {
			t.Errorf("event %s for order %d: %+v %v, want %+v", tc.event, tc.order, a, err, want)
		}
	}
	if by := r.atRest(t); by[StatusPaid] != 2 {
		t.Errorf("orders by status %v, want both paid", by)
	}
}

// counting is an Observer that counts what the lifecycle reports.
type counting struct {
	nobody
	paid, cancelled, refunded, returned atomic.Int64
}

func (c *counting) Paid()            { c.paid.Add(1) }
func (c *counting) Cancelled(string) { c.cancelled.Add(1) }
func (c *counting) Refunded()        { c.refunded.Add(1) }
func (c *counting) Returned()        { c.returned.Add(1) }
