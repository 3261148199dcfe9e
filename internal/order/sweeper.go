package order

import (
	"context"
	"errors"
	"time"

	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Sweep returns the stock of requests that died between taking a unit in
// Redis and writing their order (a SIGKILL, an OOM, a power cut), and
// corrects any drift between Redis' and MySQL's counts.
//
// For each expired hold it asks MySQL whether the order row exists: if it
// does, the process died after COMMIT and only the hold is closed; if not,
// the unit goes back on sale. Reclaim re-checks the deadline inside Redis,
// so a hold renewed meanwhile is left alone, and a unit is never returned
// twice, however many instances sweep at once.
func (s *Service) Sweep(ctx context.Context) error {
	ids, err := s.stocks.Vouchers(ctx)
	if err != nil {
		return err
	}
	for _, voucherID := range ids {
		if err := s.sweepVoucher(ctx, voucherID); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) sweepVoucher(ctx context.Context, voucherID int64) error {
	v, err := s.vouchers.Find(ctx, voucherID)
	if errors.Is(err, voucher.ErrNotFound) {
		// Not in this database: its keys belong to another deployment
		// sharing the Redis database (a mistake, but not ours to sweep).
		return nil
	} else if err != nil {
		return err
	}
	users, err := s.stocks.Expired(ctx, voucherID, 500)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		have, err := ordered(ctx, s.db, voucherID, users)
		if err != nil {
			return err
		}
		for _, u := range users {
			if have[u] {
				_, err = s.stocks.Confirm(ctx, voucherID, u)
			} else {
				var back bool
				back, err = s.stocks.Reclaim(ctx, voucherID, u)
				if back {
					s.log.InfoContext(ctx, "reclaimed stock of an abandoned request", "voucher", voucherID, "user", u)
				}
			}
			if err != nil {
				return err
			}
		}
	}
	if s.now().After(v.EndTime.Add(time.Hour)) {
		// An hour after the sale: no request can still hold a unit (holds
		// expired long ago), so the voucher leaves the sweeper's list.
		if len(users) == 0 {
			return s.stocks.Forget(ctx, voucherID)
		}
		return nil
	}
	fixed, err := s.stocks.Reconcile(ctx, voucherID, func(ctx context.Context) (int64, error) {
		if s.cfg.Async {
			// Orders still in the stream hold units MySQL does not show
			// yet: compare only when everything accepted is written.
			if q, err := s.QueueStats(ctx); err != nil || q.Lag > 0 || q.Pending > 0 {
				return 0, stock.ErrNotNow
			}
		}
		return stockLeft(ctx, s.db, voucherID)
	})
	if fixed {
		s.log.InfoContext(ctx, "corrected Redis stock to MySQL's", "voucher", voucherID)
	}
	return err
}

// RunSweeper sweeps every period until ctx is done. Every instance runs
// one; a lock taken once per round (never waited for) lets one of them do
// the round's work while the others skip it.
func (s *Service) RunSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The lock is not released: it expires before the next tick, so
		// the other instances skip this round even if the sweep was quick,
		// and whoever comes first takes the next one.
		if _, err := s.locks.Obtain(ctx, "sweeper", every*9/10); err != nil {
			continue // another instance sweeps this round, or Redis is down
		}
		if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "sweep", "err", err)
		}
	}
}
