package main

import (
	"context"

	"gorm.io/gorm"
)

// payGuarded keeps a payment only if its own write finds the order
// unpaid: the check is in the UPDATE, which the database applies to the
// row as it is when the write runs, one writer at a time. No row changed:
// the deadline won, and the payment is refunded (internal/order/webhook.go).
func payGuarded(ctx context.Context, db *gorm.DB, order int64, pause func()) (bool, error) {
	pause() // the same crowd as the broken variant

	res := db.WithContext(ctx).Exec("UPDATE orders SET status = 'paid' WHERE id = ? AND status = 'unpaid'", order)
	return res.RowsAffected == 1, res.Error
}

// expireGuarded cancels the order only if its own write finds it unpaid,
// and gives the unit back only then, in the same transaction: of the
// payment and two sweepers, one changes the row, and at most one unit
// comes back (internal/order/expire.go).
func expireGuarded(ctx context.Context, db *gorm.DB, order int64, pause func()) (bool, error) {
	pause()

	returned := false
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE orders SET status = 'cancelled' WHERE id = ? AND status = 'unpaid'", order)
		if res.Error != nil || res.RowsAffected == 0 {
			return res.Error
		}
		returned = true
		return tx.Exec("UPDATE vouchers SET stock = stock + 1 WHERE id = ?", voucherID).Error
	})
	return returned, err
}
