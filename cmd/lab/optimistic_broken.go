package main

import (
	"context"

	"gorm.io/gorm"
)

// buyVersioned takes one unit if nobody changed the voucher since it was
// read: the version must still be the one read, and every write bumps it.
//
// It never oversells, but it fails more than it must. A buyer is refused
// because somebody else bought first, not because the stock ran out.
func buyVersioned(ctx context.Context, db *gorm.DB, user int64, pause func()) error {
	db = db.WithContext(ctx)
	var v struct{ Stock, Version int }
	if err := db.Raw("SELECT stock, version FROM vouchers WHERE id = ?", voucherID).Scan(&v).Error; err != nil {
		return err
	}
	if v.Stock <= 0 {
		return errSoldOut
	}

	pause() // the lab: the whole crowd reads the same version

	return db.Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE vouchers SET stock = stock - 1, version = version + 1 WHERE id = ? AND version = ?",
			voucherID, v.Version)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return errSoldOut // somebody wrote first; to this buyer it looks sold out
		}
		return tx.Exec("INSERT INTO orders (user_id, voucher_id) VALUES (?, ?)", user, voucherID).Error
	})
}
