package order

import (
	"context"
	"sync"
	"testing"
	"time"
)

// The expirer wakes when orders fall due, not only every period: with a
// period of 30 s, orders due at once are cancelled by the first round, a
// second or so after it starts, and orders that fall due 3 s later by the
// round that wakes for them, right after their pay_by. A ticker alone
// would cancel nothing for 30 s. Every order cancelled is cancelled at or
// after its pay_by, never before, and at rest its unit is back, once.
func TestExpirerWakesWhenOrdersFallDue(t *testing.T) {
	r := newLifecycleRig(t, 1, 6)
	orders := r.buy(t, 6)
	start := time.Now()
	dueNow, dueLater := start.UTC().Add(-time.Second), start.UTC().Add(3*time.Second)
	for i, id := range orders {
		payBy := dueNow
		if i >= 3 {
			payBy = dueLater
		}
		if err := r.db.Exec("UPDATE voucher_orders SET pay_by = ? WHERE id = ?", payBy, id).Error; err != nil {
			t.Fatal(err)
		}
	}

	const period = 30 * time.Second
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.svcs[0].RunExpirer(ctx, period) })
	halt := sync.OnceFunc(func() { stop(); wg.Wait() })
	defer halt()

	// Well before the period: a round for the orders due now, then one
	// when the others fall due.
	within := 12 * time.Second
	for {
		var unpaid int64
		if err := r.db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = ?", r.voucher, StatusUnpaid).Scan(&unpaid).Error; err != nil {
			t.Fatal(err)
		}
		if unpaid == 0 {
			break
		}
		if time.Since(start) > within {
			t.Fatalf("%d of 6 orders still unpaid %s after the expirer started (period %s), the last due %s after it started: it waited for its period",
				unpaid, within, period, dueLater.Sub(start.UTC()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("all 6 cancelled %s after the expirer started", time.Since(start).Round(time.Millisecond))
	halt()

	for i, id := range orders {
		var o Order
		if err := r.db.Take(&o, id).Error; err != nil {
			t.Fatal(err)
		}
		if o.CancelReason == nil || *o.CancelReason != CancelTimeout || o.CancelledAt == nil || o.PayBy == nil {
			t.Fatalf("order %d: status %s, reason %v, cancelled at %v, pay by %v: want cancelled by its deadline", id, o.Status, o.CancelReason, o.CancelledAt, o.PayBy)
		}
		late := o.CancelledAt.Sub(*o.PayBy)
		if late < 0 {
			t.Errorf("order %d cancelled %s before its pay_by", id, -late)
		}
		// The later orders: by the round that woke for them (the first
		// round starts at least expireRest after the expirer, and its
		// orders were due a second before that).
		if i >= 3 && late > 3*time.Second {
			t.Errorf("order %d cancelled %s after its pay_by: the expirer did not wake for it", id, late)
		}
	}
	if by := r.atRest(t); by[StatusCancelled] != 6 {
		t.Errorf("orders by status %v: want all 6 cancelled", by)
	}
}
