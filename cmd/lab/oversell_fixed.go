package main

import (
	"context"

	"gorm.io/gorm"
)

// buyGuarded takes one unit only if one is left, in a single statement.
//
// "stock > 0" in the WHERE clause is evaluated by the database on the row
// it is about to change, while no other write can touch that row. When
// the last unit is gone the UPDATE changes nothing, and RowsAffected says
// so. The order is written in the same transaction: a unit is never taken
// without its order, nor an order written without its unit.
func buyGuarded(ctx context.Context, db *gorm.DB, user int64, pause func()) error {
	pause() // the lab: the same crowd arrives at once

	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ? AND stock > 0", voucherID)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return errSoldOut
		}
		return tx.Exec("INSERT INTO orders (user_id, voucher_id) VALUES (?, ?)", user, voucherID).Error
	})
}
