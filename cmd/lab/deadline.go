package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"gorm.io/gorm"
)

// Experiment 15: pay against the deadline.
//
// After the click, a buyer has a few minutes to pay; unpaid by then, the
// order is cancelled and its unit goes back on sale. Two things then
// decide one order's fate at once: the payment provider's webhook, and the
// deadline's sweeper (two of them: every instance runs one). Each checks
// the status ("still unpaid?") and then writes its own: the payment is
// kept and the order cancelled, its unit sold again while the buyer has
// paid for it; and each sweeper gives the unit back, twice. The fix makes
// the status change the check itself: UPDATE ... WHERE status = 'unpaid',
// and whoever changed no row lost, and learns it (the payment is
// refunded, the sweeper gives nothing back).
var payDeadline = experiment{
	name:   "pay-deadline",
	title:  "pay against the deadline, check then act",
	counts: "double settlement", // a payment kept for a unit given back, or a unit given back twice
	lesson: "the transition is the arbiter: UPDATE ... WHERE status = 'unpaid', and only the one that changed the row acts",
	broken: func(ctx context.Context) (outcome, error) { return deadlineRun(ctx, payChecked, expireChecked) },
	fixed:  func(ctx context.Context) (outcome, error) { return deadlineRun(ctx, payGuarded, expireGuarded) },
}

// deadlineOrders are the orders whose deadline falls as their payment
// arrives; every unit of the voucher is in one of them.
const deadlineOrders = 10

// lifecycleSchema gives the lab's orders a status, all unpaid.
const lifecycleSchema = `ALTER TABLE orders ADD COLUMN status TEXT NOT NULL DEFAULT 'unpaid'`

// payFunc applies a payment to an order and reports whether it was kept
// (false: refused, and refunded). expireFunc cancels an order whose
// deadline passed, and reports whether it gave its unit back.
type (
	payFunc    func(ctx context.Context, db *gorm.DB, order int64, pause func()) (kept bool, err error)
	expireFunc func(ctx context.Context, db *gorm.DB, order int64, pause func()) (returned bool, err error)
)

// deadlineRun sells every unit, then races, for each order, its payment
// against two sweepers. A violation is an order whose payment was kept
// while its unit went back on sale, or a unit given back more than once.
func deadlineRun(ctx context.Context, pay payFunc, expire expireFunc) (outcome, error) {
	db, closeDB, err := openDB(ctx, 0, lifecycleSchema)
	if err != nil {
		return outcome{}, err
	}
	defer closeDB()
	for i := range deadlineOrders {
		if err := db.WithContext(ctx).Exec("INSERT INTO orders (id, user_id, voucher_id) VALUES (?, ?, ?)", i+1, i+1, voucherID).Error; err != nil {
			return outcome{}, err
		}
	}

	kept := make([]bool, deadlineOrders)
	returned := make([]atomic.Int32, deadlineOrders) // two sweepers per order
	errs := make([]error, 3*deadlineOrders)
	race(3*deadlineOrders, func(i int, pause func()) {
		order := i/3 + 1
		if i%3 == 0 {
			kept[order-1], errs[i] = pay(ctx, db, int64(order), pause)
			return
		}
		back, err := expire(ctx, db, int64(order), pause)
		if back {
			returned[order-1].Add(1)
		}
		errs[i] = err
	})
	for _, err := range errs {
		if err != nil {
			return outcome{}, err
		}
	}
	stock, err := stockLeft(ctx, db)
	if err != nil {
		return outcome{}, err
	}
	var bothWays, twice, paid, back int
	for i := range deadlineOrders {
		if kept[i] {
			paid++
			if returned[i].Load() > 0 {
				bothWays++
			}
		}
		n := int(returned[i].Load())
		back += n
		twice += max(n-1, 0)
	}
	return outcome{
		violations: bothWays + twice,
		// Which of the three wins an order in the fixed variant is the
		// scheduler's choice, so the summary counts only what must not
		// happen; the split is in the measures.
		summary: fmt.Sprintf("of %d orders, %d paid for and given back, %d given back twice",
			deadlineOrders, bothWays, twice),
		measures: map[string]int{"payments_kept": paid, "units_returned": back, "paid_and_returned": bothWays, "returned_twice": twice, "stock": stock},
	}, nil
}
