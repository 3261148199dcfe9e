package order

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"gorm.io/gorm"
)

// insert writes one order inside a transaction, and takes its unit from
// vouchers.stock.
//
// The INSERT goes first: the unique index on (user_id, voucher_id) is the
// "has this user ordered?" check, done by the database atomically (a
// SELECT first would be a check-then-act race). The UPDATE goes second so
// that the hot voucher row is locked only from the UPDATE to the COMMIT:
// every other buyer of this voucher waits on that lock, so it must be
// held as briefly as possible.
//
// stock > 0 in the WHERE clause is what makes the decrement safe: reading
// the stock and writing back stock-1 would let two transactions both sell
// the last unit (a lost update). With the condition in the UPDATE, InnoDB
// re-checks it under the row lock, and 0 rows affected means sold out.
func insert(tx *gorm.DB, o *Order) error {
	err := tx.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (?, ?, ?, ?, ?)",
		o.ID, o.UserID, o.VoucherID, o.Status, o.CreatedAt).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		if err := duplicate(tx, o); err != nil {
			return err
		}
		return nil // already written: its stock was taken with it
	}
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	res := tx.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ? AND stock > 0", o.VoucherID)
	if res.Error != nil {
		return fmt.Errorf("deduct stock of voucher %d: %w", o.VoucherID, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrSoldOut
	}
	return nil
}

// errIDTaken means the order ID was already used. IDs are unique while
// Redis keeps its counters; after a flush the day's sequence starts again
// and may meet an ID made earlier in the same second. The caller takes a
// new ID and tries again.
var errIDTaken = errors.New("order ID already used")

// duplicate tells which unique key an INSERT of o hit: nil if o itself is
// already there (a commit whose answer was lost, then retried),
// ErrAlreadyOrdered if the user holds another order of the voucher,
// errIDTaken if another order has o's ID.
func duplicate(tx *gorm.DB, o *Order) error {
	var same, user int64
	if err := tx.Model(&Order{}).Where("id = ? AND user_id = ? AND voucher_id = ?", o.ID, o.UserID, o.VoucherID).Count(&same).Error; err != nil {
		return fmt.Errorf("check duplicate order: %w", err)
	}
	if same > 0 {
		return nil
	}
	if err := tx.Model(&Order{}).Where("user_id = ? AND voucher_id = ?", o.UserID, o.VoucherID).Count(&user).Error; err != nil {
		return fmt.Errorf("check duplicate order: %w", err)
	}
	if user > 0 {
		return ErrAlreadyOrdered
	}
	return errIDTaken
}

// find reads an order.
func find(ctx context.Context, db *gorm.DB, id int64) (*Order, error) {
	var o Order
	err := db.WithContext(ctx).Take(&o, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find order %d: %w", id, err)
	}
	return &o, nil
}

// snapshot reads a voucher's stock left and its buyers as of one moment:
// both SELECTs run in one REPEATABLE READ transaction, so they see the same
// snapshot and agree with each other.
func snapshot(ctx context.Context, db *gorm.DB, voucherID int64) (stock int64, buyers []int64, err error) {
	stock, buyers, _, err = snapshotWith(ctx, db, voucherID, nil)
	return stock, buyers, err
}

// snapshotWith is snapshot, also telling which of orderIDs exist in the
// same snapshot.
func snapshotWith(ctx context.Context, db *gorm.DB, voucherID int64, orderIDs []int64) (stock int64, buyers []int64, exist map[int64]bool, err error) {
	exist = map[int64]bool{}
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&stock).Error; err != nil {
			return err
		}
		if err := tx.Raw("SELECT user_id FROM voucher_orders WHERE voucher_id = ?", voucherID).Scan(&buyers).Error; err != nil {
			return err
		}
		for ids := range slices.Chunk(orderIDs, 1000) {
			var found []int64
			if err := tx.Raw("SELECT id FROM voucher_orders WHERE id IN ?", ids).Scan(&found).Error; err != nil {
				return err
			}
			for _, id := range found {
				exist[id] = true
			}
		}
		return nil
	})
	if err != nil {
		return 0, nil, nil, fmt.Errorf("snapshot voucher %d: %w", voucherID, err)
	}
	return stock, buyers, exist, nil
}

// stockLeft reads vouchers.stock.
func stockLeft(ctx context.Context, db *gorm.DB, voucherID int64) (int64, error) {
	var n []int64
	if err := db.WithContext(ctx).Raw("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("read stock of voucher %d: %w", voucherID, err)
	}
	if len(n) == 0 {
		return 0, fmt.Errorf("read stock of voucher %d: no such voucher", voucherID)
	}
	return n[0], nil
}
