package order

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// The deadline: an unpaid order whose pay_by has passed is cancelled, and
// its unit goes back on sale. No process keeps a timer per order (a sale of
// 100,000 orders would be 100,000 timers, lost with the process that held
// them). The deadline is in the row, and an index on (status, pay_by)
// lists the orders due, oldest first, in one index range: every instance
// runs an expirer (RunExpirer) that cancels them a batch at a time.
//
// Several instances expire at once without getting in each other's way,
// and none cancels an order twice: each batch is read with SELECT ... FOR
// UPDATE SKIP LOCKED, so an instance takes the due orders no other holds,
// and skips those another is cancelling. The cancel itself is the guarded
// UPDATE of lifecycle.go, in the same transaction, with the units given
// back: an instance killed mid-batch leaves nothing half done (its
// transaction rolls back, its row locks go, and the next round of any
// instance takes the batch), and one killed after its COMMIT leaves its
// returns to Redis in stock_returns, which every round drains.

// expireBatch is how many due orders one transaction cancels.
const expireBatch = 1000

// Expire cancels unpaid orders whose pay_by has passed, a batch per
// transaction, until none is due or ctx ends, gives their units back,
// and reports how many it cancelled.
func (s *Service) Expire(ctx context.Context) (int, error) {
	// Old rows first, so that those due are expired with the rest; if it
	// fails, the due orders are still expired, and it is tried next round.
	if err := s.dated(ctx); err != nil && ctx.Err() == nil {
		s.log.WarnContext(ctx, "date orders of an older version", "err", err)
	}
	total := 0
	for ctx.Err() == nil {
		n, err := s.expireBatch(ctx)
		total += n
		if err != nil || n < expireBatch {
			return total, err
		}
	}
	return total, ctx.Err()
}

// expireBatch cancels up to expireBatch due orders in one transaction.
func (s *Service) expireBatch(ctx context.Context) (int, error) {
	now := s.stamp()
	// Most rounds find nothing due: one look at the index, outside any
	// transaction, and no transaction at all.
	var first []int64
	if err := s.db.WithContext(ctx).Raw("SELECT id FROM voucher_orders WHERE status = ? AND pay_by <= ? LIMIT 1", StatusUnpaid, now).Scan(&first).Error; err != nil {
		return 0, fmt.Errorf("look for orders due: %w", err)
	}
	if len(first) == 0 {
		return 0, nil
	}
	var due []Order
	// READ COMMITTED: the locking read locks the due rows it returns and
	// no gap around them, so that the sale's INSERTs of new unpaid orders
	// (further along the same index) never wait for a batch.
	//
	// On Galera the locks are each node's own: expirers on two nodes read
	// the same due rows, and the second to commit loses a conflict (as
	// does a batch that meets a cancel, a payment or an order of the
	// voucher from another node). The batch is then run again whole, and
	// reads what is still due.
	outcome, err := transactRetried(ctx, s.db, s.obs, readCommitted(s.db), func(tx *gorm.DB) error {
		due = nil // a conflict's retry reads the batch again
		// status = 'unpaid' alone, not the guard's IN (... 'created'):
		// with one status the index hands the rows over in pay_by order
		// and the read stops at the batch's end; with two, MySQL sorts
		// every due row for each batch (100,000 due: seconds a batch).
		// Rows of 'created' were dated just before (Expire).
		q := "SELECT id, user_id, voucher_id, bucket FROM voucher_orders WHERE status = ? AND pay_by <= ? ORDER BY pay_by LIMIT ?"
		if tx.Dialector.Name() == "mysql" {
			q += " FOR UPDATE SKIP LOCKED"
		}
		if err := tx.Raw(q, StatusUnpaid, now, expireBatch).Scan(&due).Error; err != nil {
			return fmt.Errorf("read orders due: %w", err)
		}
		if len(due) == 0 {
			return nil
		}
		ids := make([]int64, len(due))
		for i, o := range due {
			ids[i] = o.ID
		}
		// The guard still applies: rows locked by this transaction cannot
		// have moved, so every one of them is cancelled here.
		res := tx.Exec("UPDATE voucher_orders SET status = ?, cancel_reason = ?, cancelled_at = ? WHERE id IN ? AND "+unpaid+" AND pay_by <= ?",
			StatusCancelled, CancelTimeout, now, ids, now)
		if res.Error != nil {
			return fmt.Errorf("cancel %d orders due: %w", len(due), res.Error)
		}
		if res.RowsAffected != int64(len(due)) {
			return fmt.Errorf("cancel %d orders due: %d changed; retrying", len(due), res.RowsAffected)
		}
		return giveBack(tx, due, StatusCancelled, now)
	})
	if outcome != Written {
		// Unknown: if it committed, the next round drains its returns.
		return 0, err
	}
	for range due {
		s.obs.Cancelled(CancelTimeout)
	}
	if len(due) > 0 {
		s.log.InfoContext(ctx, "cancelled unpaid orders past their deadline", "count", len(due))
		s.returnUnits(ctx, due)
	}
	return len(due), nil
}

// dated gives the orders an instance of a version before the lifecycle
// wrote ('created': no amount, no deadline) their status, amount and
// deadline: during an upgrade, old and new instances run side by side.
// A voucher at a time, by a plain UPDATE of its rows (no JOIN: one that
// reads vouchers would share-lock the voucher's row, and deadlock with an
// old instance's order that holds the new row and waits for that one).
// Where there are none, it is one look at the (status, pay_by) index.
func (s *Service) dated(ctx context.Context) error {
	var vouchers []int64
	if err := s.db.WithContext(ctx).Raw("SELECT DISTINCT voucher_id FROM voucher_orders WHERE status = ? LIMIT 100", statusCreated).Scan(&vouchers).Error; err != nil {
		return fmt.Errorf("look for orders of an older version: %w", err)
	}
	for _, id := range vouchers {
		if err := s.dateVoucher(ctx, id, 0); err != nil {
			return err
		}
	}
	return nil
}

// dateVoucher dates the old orders of voucherID (orderID's alone if not 0).
func (s *Service) dateVoucher(ctx context.Context, voucherID, orderID int64) error {
	v, err := s.vouchers.Find(ctx, voucherID)
	if err != nil {
		return fmt.Errorf("date orders of voucher %d: %w", voucherID, err)
	}
	q, args := "UPDATE voucher_orders SET status = ?, amount = ?, pay_by = created_at + INTERVAL ? SECOND WHERE voucher_id = ? AND status = ?",
		[]any{StatusUnpaid, v.Price, v.PayWithin, voucherID, statusCreated}
	if orderID != 0 {
		q += " AND id = ?"
		args = append(args, orderID)
	}
	if s.db.Dialector.Name() != "mysql" {
		return nil // the embedded demo has no older instances, nor INTERVAL
	}
	// READ COMMITTED: it locks the rows it changes and no gap between them.
	_, err = transactWith(ctx, s.db, readCommitted(s.db), func(tx *gorm.DB) error {
		return tx.Exec(q, args...).Error
	})
	if err != nil {
		return fmt.Errorf("date orders of voucher %d: %w", voucherID, err)
	}
	return nil
}

// returnsAfter is how long a return to Redis is left to the request that
// made it before the expirer makes it instead (either may: Return adds a
// unit once).
const returnsAfter = 2 * time.Second

// drainReturns makes the returns to Redis that their requests did not
// (a process died, Redis was away): the rows of stock_returns older than
// returnsAfter.
func (s *Service) drainReturns(ctx context.Context) error {
	for ctx.Err() == nil {
		var rows []stockReturn
		err := s.db.WithContext(ctx).Where("created_at <= ?", s.now().UTC().Add(-returnsAfter)).Limit(expireBatch).Find(&rows).Error
		if err != nil {
			return fmt.Errorf("read returns to make: %w", err)
		}
		if len(rows) == 0 {
			return nil
		}
		orders := make([]Order, len(rows))
		for i, r := range rows {
			orders[i] = Order{ID: r.OrderID, VoucherID: r.VoucherID, Bucket: r.Bucket}
		}
		// Another page only if this one was full and all made: what
		// failed waits for the next round.
		if made := s.returnUnits(ctx, orders); len(rows) < expireBatch || made < len(rows) {
			return nil
		}
	}
	return ctx.Err()
}

// RunExpirer expires due orders and drains the returns, round after
// round, until ctx is done. Every instance runs one: they share the work
// (see above), and any of them may die.
//
// Between rounds it sleeps until the earliest unpaid order falls due
// (untilDue), but never past a period from the last round's start: a
// ticker alone would leave orders due in the same second waiting for its
// next tick, up to a whole period after their pay_by, and the returns and
// refunds left behind are still drained once a period (or at once after
// a round that took longer, as a ticker would).
func (s *Service) RunExpirer(ctx context.Context, every time.Duration) {
	wake := time.NewTimer(s.untilDue(ctx, every))
	defer wake.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake.C:
		}
		start := time.Now()
		if _, err := s.Expire(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "expire unpaid orders", "err", err)
		}
		if err := s.drainReturns(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "return units to Redis", "err", err)
		}
		if err := s.finishRefunds(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "ask the provider for refunds not yet given", "err", err)
		}
		wake.Reset(min(s.untilDue(ctx, every), max(every-time.Since(start), 0)))
	}
}

// expireRest is the least an expirer sleeps between rounds for orders
// falling due (the bound of a period from the last round's start wins
// over it). Without it, a
// round that leaves an order due (another instance holds its row, or the
// batch failed) would start the next at once, a busy loop; and a sale's
// orders, falling due one after another pay_within later, would each get
// a round and a transaction of their own, where a second's worth share one.
const expireRest = time.Second

// untilDue is how long the expirer sleeps before its next round: until the
// earliest pay_by of an unpaid order, at least expireRest and at most
// every (all of every if it cannot tell). pay_by was written by the
// clock of the instance that took the order (s.now), and Expire compares
// it with s.now: so is it here, so that the round wakes to find the order
// due. An order taken by an instance whose clock runs ahead of this one's
// is waited for a little longer than it needs; every bounds that.
func (s *Service) untilDue(ctx context.Context, every time.Duration) time.Duration {
	// One read of the (status, pay_by) index: its first unpaid entry.
	var next []Order
	err := s.db.WithContext(ctx).Raw("SELECT pay_by FROM voucher_orders WHERE status = ? AND pay_by IS NOT NULL ORDER BY pay_by LIMIT 1", StatusUnpaid).Scan(&next).Error
	if err != nil && ctx.Err() == nil {
		// Most likely MySQL is away, and the round before said so.
		s.log.DebugContext(ctx, "look for the next order due", "err", err)
	}
	if err != nil || len(next) == 0 || next[0].PayBy == nil {
		// Nothing unpaid, or MySQL cannot say: the period, as a ticker
		// would.
		return every
	}
	return min(max(next[0].PayBy.Sub(s.now()), expireRest), every)
}
