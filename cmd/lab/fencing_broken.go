package main

import (
	"context"

	"gorm.io/gorm"
)

// storeSale writes whatever the holder computed. It trusts that only the
// lock's holder can be writing, so a holder that lost the lock overwrites
// the work of the one that took it over.
func storeSale(ctx context.Context, db *gorm.DB, user int64, stock int, _ int64) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("UPDATE vouchers SET stock = ? WHERE id = ?", stock, voucherID).Error; err != nil {
			return err
		}
		return tx.Exec("INSERT INTO orders (user_id, voucher_id) VALUES (?, ?)", user, voucherID).Error
	})
}
