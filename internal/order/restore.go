package order

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"

	"seckill/internal/apperr"
	"seckill/internal/lock"
)

// Putting back what Redis lost: a voucher's stock keys (reload) and the
// day's order-ID sequence (seed, ids.go). A thousand requests may find
// either missing at once; they share one attempt per instance (alone), and
// a lock makes one instance ask MySQL while the others wait for it and then
// find the key there.

// restore puts back the voucher's stock keys that a script found missing
// (Redis was flushed or restarted). attempt counts the tries; two are
// allowed: more than that, and Redis is losing its keys faster than they
// are put back.
func (s *Service) restore(ctx context.Context, voucherID int64, buckets, attempt int) error {
	if attempt == maxRestores {
		return apperr.Down(fmt.Errorf("keys of voucher %d still missing after restoring them", voucherID))
	}
	return s.reload(ctx, voucherID, buckets)
}

const maxRestores = 2

// Restock puts back the stock keys of a voucher sold in async mode after
// Redis lost them: what a replayed dead letter needs to take its unit
// again (queue.Restocker).
func (s *Service) Restock(ctx context.Context, voucherID int64) error {
	v, err := s.vouchers.Find(ctx, voucherID)
	if err != nil {
		return err
	}
	return s.reload(ctx, voucherID, v.Parts())
}

// reload rebuilds a voucher's Redis keys from MySQL, counting the orders
// still on their way there (the mode's stockAt), unless another instance
// already did.
func (s *Service) reload(ctx context.Context, voucherID int64, buckets int) error {
	return s.alone(ctx, "reload:"+strconv.FormatInt(voucherID, 10), func(ctx context.Context) error {
		lk, err := s.locks.Obtain(ctx, "stock-reload:"+strconv.FormatInt(voucherID, 10), s.cfg.LockTTL, lock.Wait())
		if err != nil {
			return apperr.Down(fmt.Errorf("lock reload of voucher %d: %w", voucherID, err))
		}
		defer lk.Release(context.WithoutCancel(ctx))
		if _, ok, err := s.stocks.Left(ctx, voucherID, buckets); err != nil || ok {
			return apperr.Down(err) // nil if another instance reloaded it
		}
		snap, err := s.mode.stockAt(ctx, voucherID, buckets)
		if err != nil {
			return apperr.Down(err)
		}
		if _, err := s.stocks.Load(ctx, voucherID, buckets, snap.Left, snap.Buyers, snap.Returned, snap.Seen); err != nil {
			return apperr.Down(err)
		}
		s.log.InfoContext(ctx, "reloaded stock from MySQL", "voucher", voucherID, "stock", snap.Left, "buyers", len(snap.Buyers))
		return nil
	})
}

// alone runs fn once for all the callers that ask for key at the same
// time, and gives each the result. fn runs for WriteTimeout on a context
// of its own: the first caller leaving must not fail the others. A caller
// leaves when its own context ends, with that context's error.
func (s *Service) alone(ctx context.Context, key string, fn func(context.Context) error) error {
	ch := s.flights.DoChan(key, func() (any, error) { return nil, s.flight(ctx, fn) })
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return apperr.Down(ctx.Err())
	}
}

var errClosed = apperr.Down(errors.New("order service closed"))

// flight runs one attempt of alone. A panic in it becomes an error: it
// runs on singleflight's goroutine, where no handler's recovery reaches,
// and singleflight would re-raise it there and end the process.
func (s *Service) flight(ctx context.Context, fn func(context.Context) error) (err error) {
	s.flyMu.Lock()
	if s.closed {
		s.flyMu.Unlock()
		return errClosed
	}
	s.flying.Add(1)
	s.flyMu.Unlock()
	defer s.flying.Done()
	defer func() {
		if p := recover(); p != nil {
			s.log.ErrorContext(ctx, "panic in a seed or reload", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p) // not an apperr: answered as internal
		}
	}()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	if s.flightsDone != nil {
		defer context.AfterFunc(s.flightsDone, cancel)()
	}
	return fn(ctx)
}

// Close ends the service's own background attempts (seed, reload) and
// waits for them. Call it after the last request, before closing the
// clients the service was given.
func (s *Service) Close() {
	s.flyMu.Lock()
	s.closed = true
	s.flyMu.Unlock()
	if s.endFlights != nil {
		s.endFlights()
	}
	s.flying.Wait()
}
