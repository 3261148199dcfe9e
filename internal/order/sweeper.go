package order

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Sweep returns the stock of requests that died between taking a unit in
// Redis and writing their order (a SIGKILL, an OOM, a power cut), and
// corrects any drift between Redis' and MySQL's counts.
//
// For each expired hold it asks MySQL whether the order row exists: if it
// does, the process died after COMMIT and only the hold is closed; if not,
// the unit goes back on sale. Settle re-checks the deadline inside Redis,
// so a hold renewed meanwhile is left alone, and a unit is never returned
// twice, however many instances sweep at once.
func (s *Service) Sweep(ctx context.Context) error {
	ids, err := s.stocks.Vouchers(ctx)
	if err != nil {
		return err
	}
	// Today's order-ID sequence is started before the day's first order
	// needs it (a flood's first second then never waits on MySQL for it),
	// and tomorrow's today, while MySQL answers: seeding needs MySQL (see
	// idworker.Seed), and async mode must go on accepting orders past
	// midnight while MySQL is away. Where the sequence exists, this is one
	// EXISTS.
	for _, day := range []struct {
		at   time.Time
		name string
	}{{s.now(), "today's"}, {s.now().Add(24 * time.Hour), "tomorrow's"}} {
		if err := s.ids.Seed(ctx, orderIDPrefix, day.at); err != nil {
			s.log.WarnContext(ctx, "seed "+day.name+" order IDs", "err", err)
		}
	}
	// One voucher's trouble (a row lock that will not come, a malformed
	// key) must not stop the others' units from coming back.
	var errs []error
	for _, voucherID := range ids {
		if ctx.Err() != nil {
			break
		}
		if err := s.sweepVoucher(ctx, voucherID); err != nil {
			errs = append(errs, fmt.Errorf("voucher %d: %w", voucherID, err))
		}
	}
	return errors.Join(errs...)
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
	lapses, err := s.stocks.Expired(ctx, voucherID, v.Parts(), 500)
	if err != nil {
		return err
	}
	if len(lapses) > 0 {
		// A user may have two entries: a claim in their home bucket and
		// the hold of the unit taken in another.
		users := make([]int64, 0, len(lapses))
		for _, l := range lapses {
			if !slices.Contains(users, l.User) {
				users = append(users, l.User)
			}
		}
		have, err := s.ordersOf(ctx, voucherID, users)
		if err != nil {
			return err
		}
		// In async mode an order may be on its way: queued with a unit
		// of another bucket by a request that died before it closed the
		// claim at home. The claim's buyer is a buyer then.
		queued, err := s.mode.queuedOf(ctx, voucherID, v.Parts(), users)
		if err != nil {
			return err
		}
		for u, id := range queued {
			if _, known := have[u]; known && have[u] == 0 {
				have[u] = id
			}
		}
		for _, l := range lapses {
			id, known := have[l.User]
			if !known {
				continue // MySQL could not tell: next round
			}
			back, err := s.stocks.Settle(ctx, voucherID, v.Parts(), l, id)
			if err != nil {
				return err
			}
			if back {
				s.obs.Reclaimed()
				s.log.InfoContext(ctx, "reclaimed stock of an abandoned request", "voucher", voucherID, "user", l.User)
			}
		}
	}
	if s.now().After(v.EndTime.Add(time.Hour)) {
		// An hour after the sale: no request can still hold a unit (holds
		// expired long ago), so the voucher leaves the sweeper's list.
		if len(lapses) == 0 {
			return s.stocks.Forget(ctx, voucherID, v.Parts(), 24*time.Hour, queue.VoucherKeys(voucherID, v.Parts())...)
		}
		return nil
	}
	// A voucher whose stock keys Redis lost (a failover to a replica that
	// had not received them, a restart without persistence) is reloaded
	// here too, not only by the next request that finds them missing: a
	// sale whose buyers stopped pressing while Redis was away would
	// otherwise stay without its keys, and Redis' count unlike MySQL's,
	// until someone pressed again.
	if _, ok, err := s.stocks.Left(ctx, voucherID, v.Parts()); err != nil {
		return err
	} else if !ok {
		return s.reload(ctx, voucherID, v.Parts())
	}
	fixed, err := s.stocks.Reconcile(ctx, voucherID, v.Parts(), func(ctx context.Context) (int64, error) {
		// Orders on their way hold units MySQL does not show yet:
		// compare only when all of this voucher's are written.
		if quiet, err := s.mode.quiet(ctx, voucherID, v.Parts()); err != nil || !quiet {
			return 0, stock.ErrNotNow
		}
		// So do units MySQL took back (a cancel, a refund) that Redis
		// has not yet (lifecycle.go).
		left, returning, err := stockLeft(ctx, s.truth, voucherID)
		if err == nil && returning {
			return 0, stock.ErrNotNow
		}
		return left, err
	})
	if fixed {
		s.obs.DriftCorrected()
		s.log.InfoContext(ctx, "corrected Redis stock to MySQL's", "voucher", voucherID)
	}
	return err
}

// ordersOf asks MySQL, with the locking read of resolve, which of users
// hold an order of voucherID: the order's ID, 0 for none. If the batch
// cannot be read (one user's transaction is stuck open on a connection
// MySQL has not noticed is dead, and the lock wait times out), it asks user
// by user, and leaves out those it cannot tell about: one stuck order must
// not keep every other expired hold of the voucher from coming back.
func (s *Service) ordersOf(ctx context.Context, voucherID int64, users []int64) (map[int64]int64, error) {
	have, err := lockedOrders(ctx, s.truth, voucherID, users)
	if err == nil {
		known := make(map[int64]int64, len(users))
		for _, u := range users {
			known[u] = have[u] // 0: known to hold none
		}
		return known, nil
	}
	s.log.WarnContext(ctx, "sweep: look up expired holds one by one", "voucher", voucherID, "err", err)
	have = map[int64]int64{}
	for _, u := range users {
		one, err := lockedOrders(ctx, s.truth, voucherID, []int64{u})
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			continue
		}
		have[u] = one[u]
	}
	return have, nil
}

// RunSweeper sweeps every period until ctx is done. Every instance runs
// one; a lock taken once per round (never waited for) lets one of them do
// the round's work while the others skip it.
func (s *Service) RunSweeper(ctx context.Context, every time.Duration) {
	periodically(ctx, every, func() {
		// The lock is not released: it expires before the next tick, so
		// the other instances skip this round even if the sweep was quick,
		// and whoever comes first takes the next one.
		if _, err := s.locks.Obtain(ctx, "sweeper", every*9/10); err != nil {
			return // another instance sweeps this round, or Redis is down
		}
		if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "sweep", "err", err)
		}
	})
}

// periodically calls fn every period until ctx is done.
func periodically(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}
