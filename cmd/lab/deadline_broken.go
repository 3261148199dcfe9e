package main

import (
	"context"

	"gorm.io/gorm"
)

// payChecked keeps a payment if the order is still unpaid: it reads the
// status, then writes "paid".
func payChecked(ctx context.Context, db *gorm.DB, order int64, pause func()) (bool, error) {
	db = db.WithContext(ctx)
	var status string
	if err := db.Raw("SELECT status FROM orders WHERE id = ?", order).Scan(&status).Error; err != nil {
		return false, err
	}
	if status != "unpaid" {
		return false, nil // too late: refunded
	}

	pause() // the lab: the sweepers read "unpaid" too

	return true, db.Exec("UPDATE orders SET status = 'paid' WHERE id = ?", order).Error
}

// expireChecked cancels an order still unpaid past its deadline, and
// gives its unit back: it reads the status, then writes "cancelled".
func expireChecked(ctx context.Context, db *gorm.DB, order int64, pause func()) (bool, error) {
	db = db.WithContext(ctx)
	var status string
	if err := db.Raw("SELECT status FROM orders WHERE id = ?", order).Scan(&status).Error; err != nil {
		return false, err
	}
	if status != "unpaid" {
		return false, nil // paid, or cancelled by the other sweeper
	}

	pause() // the lab: the payment and the other sweeper read "unpaid" too

	return true, db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("UPDATE orders SET status = 'cancelled' WHERE id = ?", order).Error; err != nil {
			return err
		}
		return tx.Exec("UPDATE vouchers SET stock = stock + 1 WHERE id = ?", voucherID).Error
	})
}
