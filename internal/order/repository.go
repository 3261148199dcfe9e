package order

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"gorm.io/gorm"

	"seckill/internal/stock"
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
//
// The same UPDATE counts the order in the voucher's sold (migration 0005):
// the live page reads a sale's figures from that row instead of counting
// its orders, and the count rides on the lock the stock takes anyway.
func insert(tx *gorm.DB, o *Order) error {
	err := tx.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at, amount, pay_by, bucket) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
		o.ID, o.UserID, o.VoucherID, o.Status, o.CreatedAt, o.Amount, o.PayBy, o.Bucket).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		if err := duplicate(tx, o); err != nil {
			return err
		}
		return nil // already written: its stock was taken with it
	}
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	res := tx.Exec("UPDATE vouchers SET stock = stock - 1, sold = sold + 1 WHERE id = ? AND stock > 0", o.VoucherID)
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
//
// Its reads lock (on MySQL): a plain read in a transaction sees the rows as
// they were at the transaction's first read (REPEATABLE READ), so a row
// another writer committed after that, the very row the INSERT hit, would
// be invisible, and "written meanwhile" would be told as "ID taken". A
// locking read sees the newest committed row; the failed INSERT holds
// shared locks on those records already, so it waits for nothing more.
func duplicate(tx *gorm.DB, o *Order) error {
	lock := ""
	if tx.Dialector.Name() == "mysql" {
		lock = " LOCK IN SHARE MODE"
	}
	var same, user int64
	if err := tx.Raw("SELECT COUNT(*) FROM voucher_orders WHERE id = ? AND user_id = ? AND voucher_id = ?"+lock,
		o.ID, o.UserID, o.VoucherID).Scan(&same).Error; err != nil {
		return fmt.Errorf("check duplicate order: %w", err)
	}
	if same > 0 {
		return nil
	}
	if err := tx.Raw("SELECT COUNT(*) FROM voucher_orders WHERE user_id = ? AND voucher_id = ?"+lock,
		o.UserID, o.VoucherID).Scan(&user).Error; err != nil {
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

// A snapshot is a voucher's figures in MySQL as of one moment, what a
// reload puts back in Redis: the units left, the buyers (every order
// counts, cancelled and refunded ones too: one order per user, for life),
// and the units MySQL took back that Redis has not yet (stock_returns):
// they are in Left, and must not be added to Redis again.
type snapshot struct {
	Left     int64
	Buyers   []int64
	Returned []stock.Returned
	// Seen: each bucket's stock in Redis as read before the rest (async
	// mode's; nil in sync mode): see stock.Store.Load.
	Seen []int64
}

// snapshotOf reads a voucher's snapshot: every SELECT runs in one
// REPEATABLE READ transaction, so they see the same moment and agree with
// each other.
func snapshotOf(ctx context.Context, db *gorm.DB, voucherID int64) (snapshot, error) {
	snap, _, err := snapshotWith(ctx, db, voucherID, nil)
	return snap, err
}

// snapshotWith is snapshotOf, also telling which of orderIDs exist in the
// same snapshot.
func snapshotWith(ctx context.Context, db *gorm.DB, voucherID int64, orderIDs []int64) (snap snapshot, exist map[int64]bool, err error) {
	exist = map[int64]bool{}
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&snap.Left).Error; err != nil {
			return err
		}
		if err := tx.Raw("SELECT user_id FROM voucher_orders WHERE voucher_id = ?", voucherID).Scan(&snap.Buyers).Error; err != nil {
			return err
		}
		var returns []struct {
			OrderID int64
			Bucket  int
		}
		if err := tx.Raw("SELECT order_id, bucket FROM stock_returns WHERE voucher_id = ?", voucherID).Scan(&returns).Error; err != nil {
			return err
		}
		for _, r := range returns {
			snap.Returned = append(snap.Returned, stock.Returned{Order: r.OrderID, Bucket: r.Bucket})
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
		return snapshot{}, nil, fmt.Errorf("snapshot voucher %d: %w", voucherID, err)
	}
	return snap, exist, nil
}

// stockLeft reads vouchers.stock, and whether MySQL took back units of
// the voucher that Redis has not yet (stock_returns): until they are in
// Redis, its count is lower than MySQL's for a reason. One statement, so
// that the two agree.
func stockLeft(ctx context.Context, db *gorm.DB, voucherID int64) (left int64, returning bool, err error) {
	var rows []struct {
		Stock          int64
		PendingReturns int64
	}
	err = db.WithContext(ctx).Raw("SELECT stock, (SELECT COUNT(*) FROM stock_returns WHERE voucher_id = ?) AS pending_returns FROM vouchers WHERE id = ?", voucherID, voucherID).Scan(&rows).Error
	if err != nil {
		return 0, false, fmt.Errorf("read stock of voucher %d: %w", voucherID, err)
	}
	if len(rows) == 0 {
		return 0, false, fmt.Errorf("read stock of voucher %d: no such voucher", voucherID)
	}
	return rows[0].Stock, rows[0].PendingReturns > 0, nil
}
