package main

import (
	"context"

	"gorm.io/gorm"
)

// storeSaleFenced writes what the holder computed only if no holder with a
// later token has written since. The voucher row keeps the last token it
// accepted; "fence < ?" in the WHERE clause refuses an older one, and
// RowsAffected says the write was refused. The holder itself cannot make
// this check: it may freeze between checking and writing. The storage
// checks at the moment of the write.
func storeSaleFenced(ctx context.Context, db *gorm.DB, user int64, stock int, fence int64) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE vouchers SET stock = ?, fence = ? WHERE id = ? AND fence < ?",
			stock, fence, voucherID, fence)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return errStaleFence
		}
		return tx.Exec("INSERT INTO orders (user_id, voucher_id) VALUES (?, ?)", user, voucherID).Error
	})
}
