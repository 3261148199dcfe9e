package main

import (
	"context"

	"gorm.io/gorm"
)

// buyChecked reads the stock, and if some is left, takes one unit.
//
// Each statement is atomic; the pair is not. Between the SELECT and the
// UPDATE other buyers read the same stock, and nothing in the UPDATE says
// "only if there is still some": the stock goes below zero.
func buyChecked(ctx context.Context, db *gorm.DB, user int64, pause func()) error {
	db = db.WithContext(ctx)
	var stock int
	if err := db.Raw("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&stock).Error; err != nil {
		return err
	}
	if stock <= 0 {
		return errSoldOut
	}

	pause() // the lab: every buyer has checked before anyone acts

	if err := db.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ?", voucherID).Error; err != nil {
		return err
	}
	return db.Exec("INSERT INTO orders (user_id, voucher_id) VALUES (?, ?)", user, voucherID).Error
}
