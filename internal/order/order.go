// Package order sells vouchers: POST /seckill/{voucherId} turns one unit of
// stock into one order row, at most one per user, never more than the stock.
//
// seckill.go tells the flow from top to bottom; read it first. The guards,
// outermost first, numbered as seckill.go's "Guard 1" to "Guard 4" mark
// them and as README.md and docs/buy-path.md list them (the token, the
// per-user token bucket and the cap on requests in flight come before,
// as middleware of cmd/server):
//
//  1. The voucher and its sale window, from memory (package voucher);
//     then the instance's memory (memory.go) answers a voucher sold out
//     and a buyer already settled without asking Redis.
//  2. One Lua script in Redis (package stock) takes a unit only if one is
//     left and the user has none, and records a hold: atomic, so no
//     oversell in Redis, and rejections never reach MySQL. In async mode
//     the same step queues the order (async.go, package order/queue): no
//     request takes guard 3, and guard 4 is the consumer's batch.
//  3. A per-user distributed lock (package lock), so that two requests of
//     one user on different instances cannot both write an order, even if
//     Redis lost its memory of buyers.
//  4. One MySQL transaction: the unique index on (user_id, voucher_id) and
//     the guarded UPDATE ... WHERE stock > 0. MySQL is the last guard and the
//     truth; the guards above exist to keep load away from it.
//
// Whatever fails after step 2 gives the unit back; a process that dies
// there leaves a hold that the Sweeper turns back into stock.
//
// Where each part lives:
//
//   - seckill.go: the Service, the flow, and sync mode (the row written
//     before the answer); async.go: async mode (the order queued in Redis
//     by package order/queue, which owns the stream, and written later by
//     its consumers through QueueWriter, persist.go).
//   - Where an order's row is written: repository.go (one order, and the
//     reads), batch.go (many in one transaction), writer.go (sync mode's
//     group commit); outcome.go tells what became of a write, and is the
//     one place that classifies MySQL's errors.
//   - memory.go: what an instance remembers to answer the flood from
//     memory; restore.go and ids.go: putting back what Redis lost (stock
//     keys, the order-ID sequence); sweeper.go: expired holds and drift.
//   - handler.go: the buy button and GET /orders/{id}; observe.go: what
//     the flow reports to metrics.
package order

import (
	"strconv"
	"time"

	"seckill/internal/apperr"
	"seckill/internal/voucher"
)

// Order is a row of voucher_orders.
type Order struct {
	ID        int64
	UserID    int64
	VoucherID int64
	Status    string
	CreatedAt time.Time
	// Amount is what the buyer pays, in cents: the voucher's price when
	// the order was taken.
	Amount int64
	// PayBy is when an unpaid order is cancelled: CreatedAt + the
	// voucher's pay_within. Nil only on a row an instance of a version
	// before the lifecycle wrote, which Expire then completes.
	PayBy        *time.Time
	PaidAt       *time.Time
	CancelledAt  *time.Time
	RefundedAt   *time.Time
	CancelReason *string
	// Bucket is the Redis bucket the unit came from, where it goes back
	// (package stock, buckets.go).
	Bucket int
}

// TableName is the contract's table name.
func (Order) TableName() string { return "voucher_orders" }

// newOrder is the order of userID for a unit of v taken at at from
// bucket, under the ID id: unpaid, at v's price, to be paid within v's
// pay_within.
func newOrder(v *voucher.Voucher, id, userID int64, at time.Time, bucket int) Order {
	at = at.UTC().Truncate(time.Millisecond)
	payBy := at.Add(time.Duration(v.PayWithin) * time.Second)
	return Order{ID: id, UserID: userID, VoucherID: v.ID, Status: StatusUnpaid, CreatedAt: at, Amount: v.Price, PayBy: &payBy, Bucket: bucket}
}

// Order statuses. An order is pending (async mode) until its row is
// written, then unpaid; an unpaid order becomes paid (the payment
// provider's webhook) or cancelled (its buyer, or its deadline); a paid one
// may be refunded. Those transitions, and no others (lifecycle.go).
const (
	StatusPending   = "pending" // accepted in Redis, not yet in MySQL (async mode)
	StatusUnpaid    = "unpaid"
	StatusPaid      = "paid"
	StatusCancelled = "cancelled" // final; the unit is back on sale
	StatusRefunded  = "refunded"  // final; the unit is back on sale
	StatusFailed    = "failed"    // accepted, but MySQL refused it (see the dead letters)
	// statusCreated is what versions before the lifecycle wrote for an
	// order: read as unpaid (an instance of one may still write it during
	// an upgrade), and never answered.
	statusCreated = "created"
)

// Why an order was cancelled.
const (
	CancelByBuyer = "buyer"
	CancelTimeout = "timeout"
)

var (
	ErrSoldOut        = apperr.New(apperr.SoldOut, "sold out")
	ErrAlreadyOrdered = apperr.New(apperr.AlreadyOrdered, "you already hold an order for this voucher")
	ErrBusy           = apperr.New(apperr.Busy, "another request of yours for this voucher is in progress; try again shortly")
	ErrNotFound       = apperr.New(apperr.NotFound, "no such order")
	// ErrNotAdmitted: the voucher has a waiting room (package room), and
	// the caller is not admitted: not in line, still waiting, or their
	// hold has ended. Nothing was taken.
	ErrNotAdmitted = apperr.New(apperr.NotAdmitted, "this voucher sells through its waiting room: join it (POST /vouchers/{id}/room) and buy once admitted")
)

// View is an order as the API shows it.
type View struct {
	ID           string     `json:"id"`
	UserID       string     `json:"user_id"`
	VoucherID    string     `json:"voucher_id"`
	Status       string     `json:"status"`
	CreatedAt    time.Time  `json:"created_at"`
	Amount       int64      `json:"amount"`
	PayBy        *time.Time `json:"pay_by,omitempty"`
	PaidAt       *time.Time `json:"paid_at,omitempty"`
	CancelledAt  *time.Time `json:"cancelled_at,omitempty"`
	RefundedAt   *time.Time `json:"refunded_at,omitempty"`
	CancelReason string     `json:"cancel_reason,omitempty"`
}

func (o *Order) view() View {
	utc := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		u := t.UTC()
		return &u
	}
	v := View{
		ID:          strconv.FormatInt(o.ID, 10),
		UserID:      strconv.FormatInt(o.UserID, 10),
		VoucherID:   strconv.FormatInt(o.VoucherID, 10),
		Status:      o.Status,
		CreatedAt:   o.CreatedAt.UTC(),
		Amount:      o.Amount,
		PayBy:       utc(o.PayBy),
		PaidAt:      utc(o.PaidAt),
		CancelledAt: utc(o.CancelledAt),
		RefundedAt:  utc(o.RefundedAt),
	}
	if v.Status == statusCreated {
		v.Status = StatusUnpaid
	}
	if o.CancelReason != nil {
		v.CancelReason = *o.CancelReason
	}
	return v
}
