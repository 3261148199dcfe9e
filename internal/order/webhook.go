package order

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/payment"
)

// The payment provider's webhook: its word that a buyer paid for an order
// (package payment checks that the word is the provider's). A provider
// calls late, twice, out of order, and retries whatever it did not see
// answered, so an event is applied at most once, keyed by its event_id:
// the event is inserted first, in the transaction that changes the order,
// with the answer given, and a retry gets that answer and changes nothing.
// An event this service has applied is never answered with a 5xx: the
// provider would retry it, and it must hear the same answer again.

// PaymentAnswer is the webhook's answer to an event it took.
type PaymentAnswer struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
	// Refund: the payment is not kept (the order was cancelled, or is
	// paid already): the provider gives the money back.
	Refund bool `json:"refund,omitempty"`
}

var (
	// ErrBadEvent: an event naming no order, or another amount than the
	// order's. Nothing changes.
	ErrBadEvent = apperr.Invalid("the event names no order of this service, or another amount than the order's")
	// errPaymentTooEarly: the order is accepted (async) but not yet a row;
	// the provider retries.
	errPaymentTooEarly = apperr.RetryAfter(apperr.Down(errors.New("the order is not written yet")), time.Second)

	errEventSeen   = errors.New("event applied before")
	errNoSuchOrder = errors.New("no such order")
	errWrongAmount = errors.New("wrong amount")
)

// ApplyPayment applies a payment event to its order, once.
//
//   - unpaid, its deadline not passed: paid;
//   - unpaid, its deadline passed (not yet swept): cancelled (timeout),
//     its unit back on sale, and the payment refused (refund);
//   - cancelled: the payment refused; paid already (another event): the
//     double payment refused; refunded: refused too.
func (s *Service) ApplyPayment(ctx context.Context, e payment.Event) (PaymentAnswer, error) {
	// A row of an older version's instance gets its amount and deadline
	// first (an undated one would be paid for 0 cents).
	if _, err := s.row(ctx, e.OrderID); err != nil {
		return PaymentAnswer{}, err
	}
	now := s.stamp()
	ans := PaymentAnswer{OrderID: strconv.FormatInt(e.OrderID, 10)}
	var cancelled *Order
	// Run again whole when it loses a conflict (a Galera certification
	// failure on the voucher's row, which a cancel here updates), as every
	// write of the order's life is: so it starts from nothing each time.
	outcome, err := transactRetried(ctx, s.db, s.obs, nil, func(tx *gorm.DB) error {
		cancelled, ans.Status, ans.Refund = nil, "", false
		// The event first: its key is the event_id, so that of two
		// deliveries of one event at once, the second waits here for the
		// first's transaction, then finds the event applied.
		err := tx.Exec("INSERT INTO payment_events (event_id, order_id, amount, status, refund, created_at) VALUES (?, ?, ?, '', ?, ?)",
			e.ID, e.OrderID, e.Amount, false, now.UTC()).Error
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			return errEventSeen
		}
		if err != nil {
			return fmt.Errorf("record payment event %s: %w", e.ID, err)
		}
		o, err := lockOrder(tx, e.OrderID)
		switch {
		case err != nil:
			return err
		case o == nil:
			return errNoSuchOrder
		case o.Amount != e.Amount:
			return errWrongAmount
		}
		switch o.Status {
		case StatusUnpaid, statusCreated:
			paid, err := pay(tx, o, now) // false once its deadline passed
			if err != nil {
				return err
			}
			if paid {
				ans.Status = StatusPaid
				break
			}
			done, err := cancel(tx, o, CancelTimeout, now)
			if err != nil {
				return err
			}
			if done {
				cancelled = o
			}
			ans.Status, ans.Refund = StatusCancelled, true
		default: // cancelled, paid (by another event) or refunded
			ans.Status, ans.Refund = o.Status, true
		}
		return tx.Exec("UPDATE payment_events SET status = ?, refund = ? WHERE event_id = ?", ans.Status, ans.Refund, e.ID).Error
	})
	switch {
	case errors.Is(err, errEventSeen):
		return s.paymentAnswer(ctx, e.ID)
	case errors.Is(err, errWrongAmount):
		return PaymentAnswer{}, ErrBadEvent
	case errors.Is(err, errNoSuchOrder):
		return PaymentAnswer{}, s.noRow(ctx, e.OrderID)
	case outcome == Unknown:
		// The COMMIT's answer was lost: if it committed, the event is
		// there, and its answer is the one to give (the locking read waits
		// for the transaction to end).
		s.log.WarnContext(ctx, "payment event: the answer to its COMMIT was lost; looking it up", "event", e.ID, "order", e.OrderID, "err", err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
		defer cancel()
		a, lerr := s.paymentAnswer(rctx, e.ID)
		if lerr != nil {
			return PaymentAnswer{}, apperr.Down(errors.Join(err, lerr))
		}
		// Its unit, if it cancelled the order, is in stock_returns: the
		// expirer returns it.
		return a, nil
	case err != nil:
		return PaymentAnswer{}, apperr.Down(err)
	}
	switch {
	case ans.Status == StatusPaid:
		s.obs.Paid()
	case cancelled != nil:
		s.obs.Cancelled(CancelTimeout)
		s.returnUnits(ctx, []Order{*cancelled})
	}
	return ans, nil
}

// noRow answers an event for an order that is no row: one still in the
// queue (async) is paid once written, and the provider retries until then;
// one MySQL refused (a dead letter) cannot be paid; anything else is no
// order of ours.
func (s *Service) noRow(ctx context.Context, id int64) error {
	p, err := s.mode.accepted(ctx, id)
	switch {
	case err != nil:
		return apperr.Down(err)
	case p != nil && p.Status == StatusFailed:
		return ErrBadEvent
	case p != nil:
		return errPaymentTooEarly
	}
	// Async's consumer commits the row, then forgets the pending marker:
	// read between the two, the order was in neither. A row there now is
	// paid when the provider retries.
	o, err := find(ctx, s.db, id)
	switch {
	case err != nil:
		return apperr.Down(err)
	case o != nil:
		return errPaymentTooEarly
	}
	return ErrBadEvent
}

// paymentAnswer reads the answer given to event id when it was applied,
// with a locking read: an event whose transaction is still open (its
// COMMIT on the way) is waited for, not taken for absent.
func (s *Service) paymentAnswer(ctx context.Context, id string) (PaymentAnswer, error) {
	var rows []struct {
		OrderID int64
		Status  string
		Refund  bool
	}
	q := "SELECT order_id, status, refund FROM payment_events WHERE event_id = ?"
	if s.db.Dialector.Name() == "mysql" {
		q += " LOCK IN SHARE MODE"
	}
	_, err := transactWith(ctx, s.db, readCommitted(s.db), func(tx *gorm.DB) error { return tx.Raw(q, id).Scan(&rows).Error })
	if err != nil {
		return PaymentAnswer{}, apperr.Down(fmt.Errorf("read payment event %s: %w", id, err))
	}
	if len(rows) == 0 || rows[0].Status == "" {
		return PaymentAnswer{}, apperr.Down(fmt.Errorf("payment event %s: not applied", id))
	}
	return PaymentAnswer{OrderID: strconv.FormatInt(rows[0].OrderID, 10), Status: rows[0].Status, Refund: rows[0].Refund}, nil
}

// lockOrder reads order id in tx, locking its row until the transaction
// ends (SELECT ... FOR UPDATE): its status cannot change under the caller.
// SQLite (the embedded demo) has one writer at a time, so a plain read.
func lockOrder(tx *gorm.DB, id int64) (*Order, error) {
	q := "SELECT * FROM voucher_orders WHERE id = ?"
	if tx.Dialector.Name() == "mysql" {
		q += " FOR UPDATE"
	}
	var found []Order
	if err := tx.Raw(q, id).Scan(&found).Error; err != nil {
		return nil, fmt.Errorf("read order %d: %w", id, err)
	}
	if len(found) == 0 {
		return nil, nil
	}
	return &found[0], nil
}
