package order

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"gorm.io/gorm"

	"seckill/internal/stock"
)

// A unit given back (see lifecycle.go): giveBack puts it back in MySQL, in
// the transaction that cancelled or refunded its order, and records it in
// stock_returns; returnUnits then puts it back in Redis, once, and forgets
// the record. The expirer makes the returns a process that died left
// behind (drainReturns).

// giveBack records each unit of orders, just moved to status (cancelled
// or refunded), for Redis in stock_returns, and puts them back in MySQL's
// stock and counts them in the voucher's counter of that status, in the
// same UPDATE (one per voucher, in ID order as every transaction that
// locks voucher rows does, so that two cannot deadlock).
func giveBack(tx *gorm.DB, orders []Order, status string, now time.Time) error {
	var count string // the counter of status, a column of vouchers
	switch status {
	case StatusCancelled:
		count = "cancelled = cancelled + ?"
	case StatusRefunded:
		count = "refunded = refunded + ?"
	default:
		return fmt.Errorf("give back the units of orders %s: no unit comes back from that status", status)
	}
	rows := make([]stockReturn, len(orders))
	units := map[int64]int64{}
	for i, o := range orders {
		rows[i] = stockReturn{OrderID: o.ID, VoucherID: o.VoucherID, Bucket: o.Bucket, CreatedAt: now.UTC()}
		units[o.VoucherID]++
	}
	if err := tx.Create(&rows).Error; err != nil {
		return fmt.Errorf("record %d units for Redis: %w", len(rows), err)
	}
	// The voucher's row last: it is the sale's hot row, and the
	// transaction holds it from here to its COMMIT. On Galera every
	// transaction of another node that commits a change to it meanwhile
	// makes this one lose a conflict: the shorter the hold, the fewer.
	for _, voucherID := range slices.Sorted(maps.Keys(units)) {
		if err := tx.Exec("UPDATE vouchers SET stock = stock + ?, "+count+" WHERE id = ?", units[voucherID], units[voucherID], voucherID).Error; err != nil {
			return fmt.Errorf("give %d units back to voucher %d: %w", units[voucherID], voucherID, err)
		}
	}
	return nil
}

// stockReturn is a row of stock_returns: a unit back in MySQL, on its way
// back to Redis.
type stockReturn struct {
	OrderID   int64 `gorm:"primaryKey;autoIncrement:false"`
	VoucherID int64
	Bucket    int
	CreatedAt time.Time
}

func (stockReturn) TableName() string { return "stock_returns" }

// returnUnits gives the units of orders, back in MySQL, back to Redis,
// and forgets their stock_returns rows; it reports how many it made. What
// fails stays there for the next round of the expirer (drainReturns).
func (s *Service) returnUnits(ctx context.Context, orders []Order) int {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	byVoucher := map[int64][]stock.Returned{}
	for _, o := range orders {
		byVoucher[o.VoucherID] = append(byVoucher[o.VoucherID], stock.Returned{Order: o.ID, Bucket: o.Bucket})
	}
	var made []int64
	for voucherID, rs := range byVoucher {
		done, err := s.returnTo(ctx, voucherID, rs)
		if err != nil {
			s.log.WarnContext(ctx, "return units to Redis; the expirer will", "voucher", voucherID, "count", len(rs), "err", err)
		}
		made = append(made, done...)
	}
	if len(made) == 0 {
		return 0
	}
	if err := s.db.WithContext(ctx).Exec("DELETE FROM stock_returns WHERE order_id IN ?", made).Error; err != nil {
		// Made again next round: Return adds each order's unit once.
		s.log.WarnContext(ctx, "forget returns made", "count", len(made), "err", err)
		return 0
	}
	return len(made)
}

// returnTo puts the units rs of voucherID back in their buckets in Redis,
// once each, and returns the orders whose return is made. If Redis lost
// the voucher's keys, it reloads them first: the reload counts those
// units, and their returns then change nothing.
func (s *Service) returnTo(ctx context.Context, voucherID int64, rs []stock.Returned) ([]int64, error) {
	v, err := s.vouchers.Find(ctx, voucherID)
	if err != nil {
		return nil, err
	}
	res, err := s.stocks.Return(ctx, voucherID, v.Parts(), rs)
	if err != nil {
		return nil, err
	}
	var made []int64
	var again []stock.Returned
	for i, r := range res {
		switch r {
		case stock.ReturnAdded:
			s.obs.Returned()
			made = append(made, rs[i].Order)
		case stock.ReturnNoStock:
			again = append(again, rs[i])
		default:
			made = append(made, rs[i].Order)
		}
	}
	if len(again) == 0 {
		return made, nil
	}
	if err := s.reload(ctx, voucherID, v.Parts()); err != nil {
		return made, err
	}
	res, err = s.stocks.Return(ctx, voucherID, v.Parts(), again)
	if err != nil {
		return made, err
	}
	for i, r := range res {
		if r == stock.ReturnAdded {
			s.obs.Returned()
		}
		if r != stock.ReturnNoStock {
			made = append(made, again[i].Order)
		}
	}
	return made, nil
}
