package order

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"gorm.io/gorm"
)

// Writing many orders in one transaction: async mode's consumer
// (writeBatch, through QueueWriter) and sync mode's group commit
// (writeNew, writer.go).

// errIDCollision is an entry whose order ID another order already has.
var errIDCollision = errors.New("order ID collision")

// errWrittenMeanwhile: the order was written by another writer while this
// one tried (a claim raced a slow consumer). The transaction rolls back;
// the next attempt finds the row and settles the entry.
var errWrittenMeanwhile = errors.New("order written meanwhile by another writer")

// writeBatch writes orders in one transaction: insert them in one
// multi-row INSERT, skipping those already written (a redelivery), and
// take each voucher's units with one guarded UPDATE. ">= n" is "> 0" for
// n units: a batch that would take more than is left fails whole.
//
// Almost every batch is new: an entry comes back only after its consumer
// died or its write failed. So the INSERT is tried first, with nothing
// looked up; only if it hits a key already there (InnoDB then undoes the
// statement, not the transaction) does writeRedelivered look which orders
// were written before and insert the rest. The look is a SELECT of every
// ID in the batch, MySQL's CPU that the common case no longer pays.
func writeBatch(tx *gorm.DB, orders []Order) error {
	fresh := make([]Order, 0, len(orders))
	inBatch := make(map[int64]Order, len(orders))
	for _, o := range orders {
		if d, ok := inBatch[o.ID]; ok {
			// Twice in this batch. The same order twice is one entry
			// delivered twice; two orders with one ID is a collision, which
			// must fail as the single INSERT's would, not become one row
			// and two answers of 200.
			if d.UserID != o.UserID || d.VoucherID != o.VoucherID {
				return fmt.Errorf("%w: order %d given to two orders in one batch", errIDCollision, o.ID)
			}
			continue
		}
		inBatch[o.ID] = o
		fresh = append(fresh, o)
	}
	// One INSERT statement (gorm's CreateBatchSize is not set): if it
	// fails, none of its rows stays, which writeRedelivered counts on.
	err := tx.Create(&fresh).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return writeRedelivered(tx, fresh, err)
	}
	if err != nil {
		return fmt.Errorf("insert %d orders: %w", len(fresh), err)
	}
	return take(tx, units(fresh))
}

// writeRedelivered is writeBatch once its INSERT hit a key already there
// (dup, its error): it skips the orders already written, inserts the rest
// and takes their units. orders holds each ID once.
func writeRedelivered(tx *gorm.DB, orders []Order, dup error) error {
	ids := make([]int64, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	var done []Order
	if err := tx.Raw("SELECT id, user_id, voucher_id FROM voucher_orders WHERE id IN ?", ids).Scan(&done).Error; err != nil {
		return fmt.Errorf("find written orders: %w", err)
	}
	owner := make(map[int64]Order, len(done)) // of the IDs already written
	for _, d := range done {
		owner[d.ID] = d
	}
	if len(done) == 0 {
		// No ID was there: the key hit was a user's other order of the
		// voucher, and the same INSERT would hit it again.
		if len(orders) == 1 {
			return keyHit(tx, &orders[0])
		}
		return fmt.Errorf("insert %d orders: %w", len(orders), dup)
	}
	var fresh []Order
	for _, o := range orders {
		d, ok := owner[o.ID]
		switch {
		case !ok:
			fresh = append(fresh, o)
		case d.UserID != o.UserID || d.VoucherID != o.VoucherID:
			// The same ID for another order is not a redelivery: Redis
			// lost its ID counters and handed out an ID already used.
			return fmt.Errorf("%w: order %d is already another order's ID", errIDCollision, o.ID)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	if err := tx.Create(&fresh).Error; err != nil {
		if errors.Is(err, gorm.ErrDuplicatedKey) && len(fresh) == 1 {
			return keyHit(tx, &fresh[0])
		}
		return fmt.Errorf("insert %d orders: %w", len(fresh), err)
	}
	return take(tx, units(fresh))
}

// keyHit tells which key the INSERT of the one order o hit. The same order
// written meanwhile by another writer is success (errWrittenMeanwhile: the
// transaction rolls back, and the next attempt finds the row); the user's
// other order is a refusal.
func keyHit(tx *gorm.DB, o *Order) error {
	if err := duplicate(tx, o); err != nil {
		return err
	}
	return errWrittenMeanwhile
}

// units counts the orders of each voucher.
func units(orders []Order) map[int64]int64 {
	n := map[int64]int64{}
	for _, o := range orders {
		n[o.VoucherID]++
	}
	return n
}

// writeNew writes orders that no writer has written before, in one
// transaction: sync mode's group commit, where each request hands over its
// own new order once. It is writeBatch without the look for duplicates in
// the batch and without the way back for a redelivery (which happens only
// in async mode). An order whose ID is already used, or whose user already
// has an order, fails the INSERT and with it the batch; the caller then
// writes each order alone, and learns which key each one hit.
func writeNew(tx *gorm.DB, orders []Order) error {
	if err := tx.Create(&orders).Error; err != nil {
		return fmt.Errorf("insert %d orders: %w", len(orders), err)
	}
	return take(tx, units(orders))
}

// take takes units[v] units of each voucher v, with one guarded UPDATE
// each, which counts them sold too (see insert).
func take(tx *gorm.DB, units map[int64]int64) error {
	// Voucher rows are locked in ID order, so that two batches touching the
	// same vouchers cannot each hold one the other waits for (a deadlock).
	for _, voucherID := range slices.Sorted(maps.Keys(units)) {
		n := units[voucherID]
		res := tx.Exec("UPDATE vouchers SET stock = stock - ?, sold = sold + ? WHERE id = ? AND stock >= ?", n, n, voucherID, n)
		if res.Error != nil {
			return fmt.Errorf("deduct %d from voucher %d: %w", n, voucherID, res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrSoldOut
		}
	}
	return nil
}
