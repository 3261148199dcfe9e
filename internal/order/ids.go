package order

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order/queue"
)

// Order IDs: drawn from the instance's pool (idworker.Pool), a block of
// the day's Redis sequence at a time; and, when Redis lost the sequence,
// started again above every ID in use, in MySQL and in the queue.

// orderIDPrefix names the order-ID sequence: icr:order:{yyyy:MM:dd}.
const orderIDPrefix = "order"

// ErrIDsExhausted means the day's 4,294,967,295 order IDs are used up.
var ErrIDsExhausted = apperr.New(apperr.Busy, "no order IDs left today")

// idError is what a request answers when it could not draw an order ID:
// ErrIDsExhausted with a Retry-After until the next UTC day, whose
// sequence starts afresh, or Redis being away.
func idError(err error, now time.Time) error {
	if !errors.Is(err, idworker.ErrSequenceExhausted) {
		return apperr.Down(err)
	}
	now = now.UTC()
	return apperr.RetryAfter(ErrIDsExhausted, now.Truncate(24*time.Hour).Add(24*time.Hour).Sub(now))
}

// seed starts the day's order-ID sequence (idworker.Seed), for the ID
// pool when it finds the sequence missing (the sweeper seeds each day
// ahead, so this is rare: a Redis that lost its keys, a first start). The
// pool refills one caller at a time, and alone shares an attempt among
// the callers of one instance; across instances the lock makes one of them
// ask MySQL while the rest wait for it and then find it there. (The
// sweeper seeds ahead with idworker's Seed directly: SET NX keeps the
// first of any seeds that race.)
func (s *Service) seed(ctx context.Context, day time.Time) error {
	return s.alone(ctx, "seed:"+idworker.Key(orderIDPrefix, day), func(ctx context.Context) error {
		lk, err := s.locks.Obtain(ctx, "id-seed:"+orderIDPrefix, s.cfg.LockTTL, lock.Wait())
		if err != nil {
			return apperr.Down(fmt.Errorf("lock seeding of order IDs: %w", err))
		}
		defer lk.Release(context.WithoutCancel(ctx))
		return apperr.Down(s.ids.Seed(ctx, orderIDPrefix, day))
	})
}

// IDFloor is the idworker.Floor of order IDs: the highest sequence number
// among the orders in MySQL and those in the queue (accepted, or
// dead-lettered and perhaps replayed later) with an ID in [lo, hi). After
// Redis lost the day's sequence, it restarts above this, so no ID a 200
// gave out is given again.
//
// In MySQL it reads the highest ID (the primary key's last entry), then
// the highest sequence among the IDs of the two minutes before it: with
// clocks that disagree, an instance a little behind may have made a later
// sequence number under an earlier second. Both reads are primary-key
// ranges, not a scan of the day's orders.
func IDFloor(db *gorm.DB, q *queue.Queue) idworker.Floor {
	return func(ctx context.Context, prefix string, lo, hi int64) (int64, error) {
		if prefix != orderIDPrefix {
			return 0, fmt.Errorf("order.IDFloor knows only the %q sequence, not %q", orderIDPrefix, prefix)
		}
		const mask, skew = 1<<32 - 1, 120 // seconds
		var last, top int64
		err := db.WithContext(ctx).Raw("SELECT COALESCE(MAX(id), 0) FROM voucher_orders WHERE id >= ? AND id < ?", lo, hi).Scan(&last).Error
		if err == nil && last > 0 {
			from := max(lo, (last>>32-skew)<<32)
			err = db.WithContext(ctx).Raw("SELECT COALESCE(MAX(id & ?), 0) FROM voucher_orders WHERE id >= ? AND id < ?", mask, from, hi).Scan(&top).Error
		}
		if err != nil {
			return 0, fmt.Errorf("highest order ID in MySQL: %w", err)
		}
		err = q.EachOrderID(ctx, func(id int64) {
			if id >= lo && id < hi {
				top = max(top, id&mask)
			}
		})
		if err != nil {
			return 0, fmt.Errorf("highest order ID in the queue: %w", err)
		}
		return top, nil
	}
}
