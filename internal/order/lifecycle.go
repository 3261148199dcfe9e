package order

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"seckill/internal/apperr"
)

// After the click: an order is unpaid until it is paid (the payment
// provider's webhook, webhook.go) or cancelled (by its buyer, or by its
// deadline: expire.go); a paid order may be refunded. Cancelled and
// refunded are final, and each gives its unit back on sale, once.
//
// Every transition is one guarded UPDATE ... WHERE status = <from>: of a
// payment and the deadline arriving in the same millisecond, or of two
// instances cancelling one order, exactly one changes the row, and only
// the one that did gives the unit back, in the same transaction
// (giveBack). The loser learns it from the rows affected and reads what
// the order became. Reading the status first and writing the new one
// after (the lab's "pay against the deadline") lets both win: an order
// paid and cancelled, a unit returned twice.
//
// A unit given back is back in MySQL when the transaction commits. Redis
// gets it after (returnUnits): the same transaction records it in
// stock_returns, and the row goes only once Redis has the unit, which
// stock.Store.Return adds at most once per order. A process that dies in
// between leaves the row, and the next round of any instance's expirer
// makes the return.

var (
	// ErrInvalidState: the order's status does not allow this (paying a
	// cancelled order, cancelling a paid one, refunding an unpaid one).
	ErrInvalidState = apperr.New(apperr.InvalidState, "the order's status does not allow this")
	// errNotWritten: async mode's order is accepted but not yet a row; it
	// can be cancelled in a moment.
	errNotWritten = apperr.RetryAfter(apperr.New(apperr.InvalidState, "the order is not written yet; try again in a moment"), time.Second)
)

// unpaid is the guard of a transition from unpaid: an instance of a
// version before the lifecycle wrote 'created' for it.
const unpaid = "status IN ('unpaid', 'created')"

// Cancel cancels the caller's unpaid order, and its unit goes back on
// sale. A cancelled order answers as it is, changing nothing.
func (s *Service) Cancel(ctx context.Context, id, callerID int64) (View, error) {
	o, err := s.mine(ctx, id, callerID, false)
	if err != nil {
		return View{}, err
	}
	switch o.Status {
	case StatusCancelled:
		return o.view(), nil
	case StatusUnpaid, statusCreated:
	default:
		return View{}, ErrInvalidState
	}
	now := s.stamp()
	var done bool
	// A conflict (on Galera, another node's cancel, payment or expirer
	// wrote the order's or the voucher's row first) is run again whole:
	// the guard then finds the order as the winner left it.
	outcome, err := transactRetried(ctx, s.db, s.obs, nil, func(tx *gorm.DB) (err error) {
		done, err = cancel(tx, o, CancelByBuyer, now)
		return err
	})
	if outcome == Unknown {
		// If it committed, its unit's return is in stock_returns, which
		// the expirer drains; the buyer is told what the order became.
		return s.lostAnswer(ctx, id, StatusCancelled, err)
	}
	if outcome != Written {
		return View{}, apperr.Down(err)
	}
	if done {
		s.obs.Cancelled(CancelByBuyer)
		s.returnUnits(ctx, []Order{*o})
	}
	return s.after(ctx, id, done, StatusCancelled)
}

// Refund refunds a paid order, asked by its buyer or an admin: the money
// goes back (the provider's Refund) and the unit back on sale. A refunded
// order answers as it is, changing nothing in it.
//
// The provider is asked to give the money back once per order: the ask
// is claimed in the order's row (claimAsk), and once the provider took it
// (refund_sent_at) nobody asks again. A refund whose ask failed is asked
// again by the next call or the expirer's next round; one whose asker
// died, askAgainAfter later, by the expirer (finishRefunds) if no call
// comes. The provider's Refund is keyed by the order, so that an ask whose
// answer was lost cannot give back twice.
func (s *Service) Refund(ctx context.Context, id, callerID int64, admin bool) (View, error) {
	o, err := s.mine(ctx, id, callerID, admin)
	if err != nil {
		return View{}, err
	}
	switch o.Status {
	case StatusPaid, StatusRefunded:
	default:
		return View{}, ErrInvalidState
	}
	done := false
	if o.Status == StatusPaid {
		now := s.stamp()
		outcome, err := transactRetried(ctx, s.db, s.obs, nil, func(tx *gorm.DB) (err error) {
			done, err = refund(tx, o, now)
			return err
		})
		if outcome == Unknown {
			// Refunded or not, the buyer learns it; refunded, the
			// provider is asked below, as for a retry.
			if _, err := s.lostAnswer(ctx, id, StatusRefunded, err); err != nil {
				return View{}, err
			}
		} else if outcome != Written {
			return View{}, apperr.Down(err)
		}
		if done {
			s.obs.Refunded()
			s.returnUnits(ctx, []Order{*o})
		}
	}
	v, err := s.after(ctx, id, done, StatusRefunded)
	if err != nil {
		return View{}, err
	}
	if s.cfg.Provider == nil {
		s.log.ErrorContext(ctx, "order refunded, but no payment provider is configured to give the money back", "order", id, "amount", o.Amount)
		return v, nil
	}
	if err := s.askRefund(ctx, id, o.Amount); err != nil {
		// The order is refunded: its buyer's retry, or the expirer's
		// next round, asks the provider again.
		return View{}, apperr.Down(err)
	}
	return v, nil
}

// Pay asks the payment provider to charge the caller for their unpaid
// order. The order is paid when the provider confirms, through the
// webhook; Pay answers the order as it is now.
//
// The provider is asked once per order, not once per click: a buyer who
// presses "pay" five times while the first charge is on its way would
// otherwise be charged five times, and given back four (issue 35). The
// ask is claimed first, in the order's row (claimAsk): of any number of
// clicks on any number of instances, one claims it and asks; the others
// answer the order as it is, the charge on its way. A charge the provider
// refused gives the claim up, and the next click asks again; one whose
// asker died is asked again askAgainAfter later, and the provider's own
// idempotency key (payment.Provider: the order) keeps that from charging
// twice.
func (s *Service) Pay(ctx context.Context, id, callerID int64) (View, error) {
	o, err := s.mine(ctx, id, callerID, false)
	if err != nil {
		return View{}, err
	}
	if o.Status != StatusUnpaid && o.Status != statusCreated {
		return View{}, ErrInvalidState
	}
	if o.PayBy != nil && !s.now().Before(*o.PayBy) {
		return View{}, ErrInvalidState // its deadline passed: it is being cancelled
	}
	if s.cfg.Provider == nil {
		return View{}, apperr.Down(errors.New("no payment provider is configured"))
	}
	at, asked, err := s.claimAsk(ctx, id, "charge_asked_at", unpaid)
	if err != nil {
		return View{}, apperr.Down(err)
	}
	if !asked {
		// Asked already, and not yet confirmed; or paid or cancelled
		// meanwhile: the buyer sees which.
		return s.after(ctx, id, false, StatusUnpaid)
	}
	if err := s.cfg.Provider.Charge(ctx, id, o.Amount); err != nil {
		s.giveUpAsk(ctx, id, "charge_asked_at", at)
		return View{}, apperr.Down(fmt.Errorf("charge order %d: %w", id, err))
	}
	return o.view(), nil
}

// finishRefunds asks the provider for the refunds of refunded orders that
// it has not taken (refund_sent_at NULL) and that nobody is asking for now
// (no claim, or one older than askAgainAfter): the asker died between its
// claim and the provider's answer, or the provider failed and the buyer
// never came back. Every instance's expirer runs it; each ask is claimed
// as a request's is, so that one instance asks.
func (s *Service) finishRefunds(ctx context.Context) error {
	if s.cfg.Provider == nil {
		return nil
	}
	var due []Order
	err := s.db.WithContext(ctx).Where("status = ? AND refund_sent_at IS NULL AND (refund_asked_at IS NULL OR refund_asked_at <= ?)",
		StatusRefunded, s.stamp().Add(-askAgainAfter).UTC()).Limit(expireBatch).Find(&due).Error
	if err != nil {
		return fmt.Errorf("read refunds not given: %w", err)
	}
	for _, o := range due {
		if err := s.askRefund(ctx, o.ID, o.Amount); err != nil {
			return err
		}
	}
	return nil
}

// askRefund asks the provider to give back amount for order id, refunded,
// if no one else is asking and it has not taken the refund yet: claimed
// first, given up if the provider fails, recorded once it took it.
func (s *Service) askRefund(ctx context.Context, id, amount int64) error {
	at, asked, err := s.claimAsk(ctx, id, "refund_asked_at", "status = 'refunded' AND refund_sent_at IS NULL")
	if err != nil || !asked {
		return err // given back already, or being given back
	}
	if err := s.cfg.Provider.Refund(ctx, id, amount); err != nil {
		s.giveUpAsk(ctx, id, "refund_asked_at", at)
		return fmt.Errorf("refund order %d with the provider: %w", id, err)
	}
	if err := s.db.WithContext(ctx).Exec("UPDATE voucher_orders SET refund_sent_at = ? WHERE id = ?", s.stamp().UTC(), id).Error; err != nil {
		// Not recorded: asked once more later, which the provider's key
		// on the order makes harmless.
		s.log.WarnContext(ctx, "record a refund the provider took", "order", id, "err", err)
	}
	return nil
}

// askAgainAfter is how long an ask of the provider (a charge, a refund)
// stands before another request may make it again: long enough that a
// provider's answer is in, short enough that a buyer whose request died
// after claiming the ask can pay a minute later.
const askAgainAfter = time.Minute

// claimAsk claims the right to ask the provider for money for order id,
// in column (charge_asked_at, refund_asked_at): one guarded UPDATE, true
// for the one request that changed the row, while the order is in state
// (a WHERE clause) and nobody asked within askAgainAfter. It returns the
// time it wrote, which giveUpAsk needs.
func (s *Service) claimAsk(ctx context.Context, id int64, column, state string) (time.Time, bool, error) {
	now := s.stamp()
	res := s.db.WithContext(ctx).Exec("UPDATE voucher_orders SET "+column+" = ? WHERE id = ? AND "+state+
		" AND ("+column+" IS NULL OR "+column+" <= ?)", now.UTC(), id, now.Add(-askAgainAfter).UTC())
	if res.Error != nil {
		return time.Time{}, false, fmt.Errorf("claim %s of order %d: %w", column, id, res.Error)
	}
	return now, res.RowsAffected == 1, nil
}

// giveUpAsk gives back a claim of claimAsk made at at, whose ask failed,
// so that the next request asks at once. A claim someone else made since
// is left alone. If this fails, the claim lapses after askAgainAfter.
func (s *Service) giveUpAsk(ctx context.Context, id int64, column string, at time.Time) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	if err := s.db.WithContext(ctx).Exec("UPDATE voucher_orders SET "+column+" = NULL WHERE id = ? AND "+column+" = ?", id, at.UTC()).Error; err != nil {
		s.log.WarnContext(ctx, "give up the claim of a failed ask; it lapses", "order", id, "column", column, "err", err)
	}
}

// mine reads an order of the caller (any order, for an admin), as a row:
// ErrNotFound for someone else's, errNotWritten for one not yet written.
func (s *Service) mine(ctx context.Context, id, callerID int64, admin bool) (*Order, error) {
	o, err := s.row(ctx, id)
	if err != nil {
		return nil, err
	}
	if o == nil {
		// Not a row: perhaps an order still in the queue.
		if p, err := s.mode.accepted(ctx, id); err != nil {
			return nil, apperr.Down(err)
		} else if p != nil && (admin || p.UserID == callerID) {
			if p.Status == StatusFailed {
				return nil, ErrInvalidState
			}
			return nil, errNotWritten
		}
		// Async's consumer commits the row, then forgets the order's
		// pending marker: read between the two, it was in neither. Once
		// more.
		if o, err = s.row(ctx, id); err != nil {
			return nil, err
		}
		if o == nil {
			return nil, ErrNotFound
		}
	}
	if !admin && o.UserID != callerID {
		return nil, ErrNotFound
	}
	return o, nil
}

// stamp is the time a transition records: to the millisecond, as MySQL's
// DATETIME(3) keeps it (and as SQLite then compares it, as text).
func (s *Service) stamp() time.Time { return s.now().UTC().Truncate(time.Millisecond) }

// lostAnswer tells the caller of a transition to status whose COMMIT's
// answer was lost (cause) what became of order id: it reads the order
// with a locking read, which waits for a transaction still open on its
// row, as resolve does for a new order. The order as it is now if it
// reached status, else the 503 of cause (nothing changed: try again).
func (s *Service) lostAnswer(ctx context.Context, id int64, status string, cause error) (View, error) {
	s.log.WarnContext(ctx, "order transition: the answer to its COMMIT was lost; looking it up", "order", id, "to", status, "err", cause)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	var o *Order
	_, err := transactWith(ctx, s.db, readCommitted(s.db), func(tx *gorm.DB) (err error) {
		o, err = lockOrder(tx, id)
		return err
	})
	if err != nil || o == nil || o.Status != status {
		return View{}, apperr.Down(errors.Join(cause, err))
	}
	return o.view(), nil
}

// row reads order id from MySQL; one that an instance of an older
// version wrote ('created') is dated first (dateVoucher), so that its
// amount and deadline are known.
func (s *Service) row(ctx context.Context, id int64) (*Order, error) {
	o, err := find(ctx, s.db, id)
	if err == nil && o != nil && o.Status == statusCreated {
		if err = s.dateVoucher(ctx, o.VoucherID, o.ID); err == nil {
			o, err = find(ctx, s.db, id)
		}
	}
	if err != nil {
		return nil, apperr.Down(err)
	}
	return o, nil
}

// after reads the order id once a transition to status was tried: if
// this call made it (done), or someone else did meanwhile, the order as it
// is now; else ErrInvalidState (a payment won the race against a cancel,
// say).
func (s *Service) after(ctx context.Context, id int64, done bool, status string) (View, error) {
	o, err := find(ctx, s.db, id)
	switch {
	case err != nil || o == nil:
		if done {
			return View{}, apperr.Down(fmt.Errorf("read order %d after it became %s: %w", id, status, err))
		}
		return View{}, apperr.Down(err)
	case o.Status != status:
		return View{}, ErrInvalidState
	}
	return o.view(), nil
}

// The transitions, each a guarded UPDATE in the caller's transaction: they
// report whether they changed the order.

// cancel moves o from unpaid to cancelled, for reason, and gives its unit
// back.
func cancel(tx *gorm.DB, o *Order, reason string, now time.Time) (bool, error) {
	res := tx.Exec("UPDATE voucher_orders SET status = ?, cancel_reason = ?, cancelled_at = ? WHERE id = ? AND "+unpaid,
		StatusCancelled, reason, now.UTC(), o.ID)
	if res.Error != nil {
		return false, fmt.Errorf("cancel order %d: %w", o.ID, res.Error)
	}
	if res.RowsAffected == 0 {
		return false, nil
	}
	return true, giveBack(tx, []Order{*o}, StatusCancelled, now)
}

// refund moves o from paid to refunded, and gives its unit back.
func refund(tx *gorm.DB, o *Order, now time.Time) (bool, error) {
	res := tx.Exec("UPDATE voucher_orders SET status = ?, refunded_at = ? WHERE id = ? AND status = ?",
		StatusRefunded, now.UTC(), o.ID, StatusPaid)
	if res.Error != nil {
		return false, fmt.Errorf("refund order %d: %w", o.ID, res.Error)
	}
	if res.RowsAffected == 0 {
		return false, nil
	}
	return true, giveBack(tx, []Order{*o}, StatusRefunded, now)
}

// pay moves o from unpaid to paid, if its deadline has not passed (a row
// an older version wrote has none until Expire gives it one), and counts
// it in the voucher's paid (migration 0005: the live page's figures). The
// count locks the voucher's row after the order's, as a cancel's giveBack
// does and every transaction that locks both: a payment may wait a moment
// behind a sale's writes, and cannot deadlock with them.
func pay(tx *gorm.DB, o *Order, now time.Time) (bool, error) {
	res := tx.Exec("UPDATE voucher_orders SET status = ?, paid_at = ? WHERE id = ? AND "+unpaid+" AND (pay_by > ? OR pay_by IS NULL)",
		StatusPaid, now.UTC(), o.ID, now.UTC())
	if res.Error != nil {
		return false, fmt.Errorf("pay order %d: %w", o.ID, res.Error)
	}
	if res.RowsAffected == 0 {
		return false, nil
	}
	if err := tx.Exec("UPDATE vouchers SET paid = paid + 1 WHERE id = ?", o.VoucherID).Error; err != nil {
		return false, fmt.Errorf("count order %d paid: %w", o.ID, err)
	}
	return true, nil
}
