package order

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/payment"
	"seckill/internal/testenv"
)

// checkCounts checks a voucher's counters (migration 0005: sold, paid,
// cancelled, refunded, each the orders that ever entered that state)
// against its orders' rows, read in one snapshot with them.
func checkCounts(t *testing.T, db *gorm.DB, voucherID int64) {
	t.Helper()
	var counted, rows struct{ Sold, Paid, Cancelled, Refunded int64 }
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw("SELECT sold, paid, cancelled, refunded FROM vouchers WHERE id = ?", voucherID).Scan(&counted).Error; err != nil {
			return err
		}
		return tx.Raw(`SELECT COUNT(*) AS sold,
				COALESCE(SUM(status IN ('paid', 'refunded')), 0) AS paid,
				COALESCE(SUM(status = 'cancelled'), 0) AS cancelled,
				COALESCE(SUM(status = 'refunded'), 0) AS refunded
			FROM voucher_orders WHERE voucher_id = ?`, voucherID).Scan(&rows).Error
	})
	if err != nil {
		t.Fatalf("read the counts of voucher %d: %v", voucherID, err)
	}
	if counted != rows {
		t.Errorf("voucher %d counts %+v, its orders' rows %+v", voucherID, counted, rows)
	}
}

// A voucher's counters follow its orders through every path that writes
// or moves one: a sale one order at a time (insert) and in a group commit
// (writeNew), async's consumer writing a batch, and again on a
// redelivery (writeBatch, which writes nothing twice), payments, a
// second payment, cancels by the buyer, refunds, a late payment that
// cancels its order, and the deadline's cancels (Expire).
func TestVoucherCountsFollowTheOrders(t *testing.T) {
	r := newLifecycleRig(t, 2, 60)
	ctx := context.Background()
	orders := r.buy(t, 20) // users 1..20, one at a time
	var wg sync.WaitGroup
	at := make([]int64, 20)
	for i := range at { // users 101..120, at once
		wg.Go(func() {
			id, err := r.svcs[i%2].Seckill(ctx, int64(101+i), r.voucher)
			if err != nil {
				t.Errorf("user %d buys: %v", 101+i, err)
			}
			at[i] = id
		})
	}
	wg.Wait()
	orders = append(orders, at...)
	checkCounts(t, r.db, r.voucher)

	v, err := r.svcs[0].vouchers.Find(ctx, r.voucher)
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]Order, 5)
	for i := range batch { // users 201..205, as async's consumer writes them
		batch[i] = newOrder(v, testenv.ID(), int64(201+i), time.Now(), 0)
	}
	for range 2 {
		if _, err := transact(ctx, r.db, func(tx *gorm.DB) error { return writeBatch(tx, batch) }); err != nil {
			t.Fatal(err)
		}
	}
	checkCounts(t, r.db, r.voucher)

	pay := func(id int64, event string) PaymentAnswer {
		t.Helper()
		a, err := r.svcs[int(id%2)].ApplyPayment(ctx, payment.Event{ID: fmt.Sprint(event, id), OrderID: id, Amount: 500})
		if err != nil {
			t.Fatalf("pay order %d: %v", id, err)
		}
		return a
	}
	for _, id := range orders[:20] {
		pay(id, "pay-")
	}
	pay(orders[0], "again-") // a second payment: refused, nothing counted
	for i, id := range orders[20:28] {
		if _, err := r.svcs[i%2].Cancel(ctx, id, int64(101+i)); err != nil {
			t.Fatalf("cancel order %d: %v", id, err)
		}
	}
	for i, id := range orders[:6] {
		if _, err := r.svcs[i%2].Refund(ctx, id, int64(i+1), i%3 == 0); err != nil {
			t.Fatalf("refund order %d: %v", id, err)
		}
	}
	checkCounts(t, r.db, r.voucher)

	r.dueIn(t, -time.Second)
	if a := pay(orders[30], "late-"); a.Status != StatusCancelled || !a.Refund {
		t.Errorf("a payment past the deadline: %+v, want cancelled with a refund", a)
	}
	if _, err := r.svcs[1].Expire(ctx); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, r.db, r.voucher)
	var unpaid int64
	r.db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = 'unpaid'", r.voucher).Scan(&unpaid)
	if unpaid != 0 {
		t.Errorf("%d orders unpaid after the deadline's round", unpaid)
	}
	// A cancel of a cancelled order, or a refund of a refunded one,
	// changes nothing, and counts nothing.
	if _, err := r.svcs[0].Cancel(ctx, orders[20], 101); err != nil {
		t.Fatal(err)
	}
	if _, err := r.svcs[0].Refund(ctx, orders[0], 1, false); err != nil && !errors.Is(err, ErrInvalidState) {
		t.Fatal(err)
	}
	checkCounts(t, r.db, r.voucher)
}
