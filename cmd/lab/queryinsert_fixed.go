package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"seckill/internal/lock"
)

// oneOrderPerUser makes the database refuse a second order of a user for
// the same voucher, whatever the code in front of it does.
const oneOrderPerUser = `CREATE UNIQUE INDEX one_order_per_user ON orders (user_id, voucher_id)`

// orderLocked writes the user's order unless the user has one already,
// holding a lock named after the user and the voucher.
//
// The lock makes the user's requests take turns: the count of the second
// one sees the first one's order. It is tried once: a second request
// while the first is served is a double click, answered "busy" without
// costing the database anything. The unique index catches what the lock
// lets through (a lost lock, experiments 7 to 11), and its violation is a
// refusal like the count's, in a transaction that gives the unit back.
func orderLocked(ctx context.Context, locks lock.Locker, db *gorm.DB, user int64, pause func()) error {
	lk, err := locks.Obtain(ctx, fmt.Sprintf("order:voucher:%d:user:%d", voucherID, user), 10*time.Second)
	if errors.Is(err, lock.ErrNotAcquired) {
		return errBusy
	}
	if err != nil {
		return err
	}
	defer lk.Release(ctx)

	n, err := countOrders(ctx, db, user)
	if err != nil {
		return err
	}
	if n > 0 {
		return errAlreadyOrdered
	}

	pause() // the lab: the same requests, at the same point

	err = buyGuarded(lk.Context(), db, user, func() {})
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return errAlreadyOrdered
	}
	return err
}
