package order

import (
	"context"
	"errors"

	"gorm.io/gorm"

	"seckill/internal/order/queue"
	"seckill/internal/voucher"
)

// QueueWriter returns the queue.Writer of async mode's consumers: it
// writes the orders they read from the stream to the service's database,
// each batch in one transaction (writeBatch), and says what became of
// them; the service's vouchers give each order its amount and deadline,
// and its Observer is told of the conflicts a batch lost and was run
// again for.
func (s *Service) QueueWriter() queue.Writer {
	return queueWriter{s.db, s.vouchers, s.obs}
}

type queueWriter struct {
	db       *gorm.DB
	vouchers *voucher.Service
	obs      Observer
}

// Write writes entries as order rows, skipping those written before.
func (w queueWriter) Write(ctx context.Context, entries []queue.Entry) (queue.Verdict, error) {
	orders := make([]Order, len(entries))
	for i, e := range entries {
		v, err := w.vouchers.Find(ctx, e.VoucherID)
		if errors.Is(err, voucher.ErrNotFound) {
			// No such voucher in MySQL: the guarded UPDATE finds no unit
			// for it, and the entry is dead-lettered as sold out.
			v, err = &voucher.Voucher{ID: e.VoucherID, PayWithin: voucher.DefaultPayWithin}, nil
		}
		if err != nil {
			return queue.Later, err
		}
		orders[i] = newOrder(v, e.OrderID, e.UserID, e.At, e.Bucket)
	}
	// A batch that lost a conflict (another node, or another consumer,
	// wrote the voucher's row first) is run again here, whole, before the
	// consumer hears of it: to the consumer any failure not the entries'
	// own means MySQL takes no writes, and it backs off.
	write := func(tx *gorm.DB) error { return writeBatch(tx, orders) }
	outcome, err := transactRetried(ctx, w.db, w.obs, nil, write)
	if errors.Is(err, errWrittenMeanwhile) {
		// Another consumer wrote it while we tried: this time we find it.
		outcome, err = transactRetried(ctx, w.db, w.obs, nil, write)
	}
	return verdict(outcome, err), err
}

// verdict is what a write that ended in outcome and err tells the queue.
func verdict(outcome Outcome, err error) queue.Verdict {
	switch {
	case outcome == Written:
		return queue.Written
	case outcome == Unknown:
		return queue.Later // the next attempt finds the rows if it committed
	case errors.Is(err, ErrSoldOut):
		return queue.NoStock
	case errors.Is(err, ErrAlreadyOrdered):
		return queue.HasOrder
	case errors.Is(err, errIDCollision):
		return queue.IDTaken
	case permanent(err):
		return queue.Refused
	}
	return queue.Later
}

// Probe writes nothing, in a transaction: a read-only MySQL answers pings
// and reads, and only a write tells that it takes writes again.
func (w queueWriter) Probe(ctx context.Context) error {
	_, err := transact(ctx, w.db, func(tx *gorm.DB) error {
		return tx.Exec("UPDATE vouchers SET stock = stock WHERE id = 0").Error
	})
	return err
}
