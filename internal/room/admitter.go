package room

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"seckill/internal/apperr"
)

// Admitter admits the next numbers of every room whose sale is on: each
// instance runs one, a few times a second (AdmitEvery). They need not take
// turns: admit.lua decides from what Redis holds, so any number of
// Admitters together admit at the room's rate, and one alone does too.
type Admitter struct {
	store   *Store
	rooms   Lister
	find    Finder
	restock Restocker
	obs     Observer
	log     *slog.Logger
	now     func() time.Time
}

// Observer is told what the rooms do (package metrics); nil tells nobody.
type Observer interface {
	Joined()
	// Admitted: buyers admitted, each with how long they waited.
	Admitted(waits []time.Duration)
	// HoldsExpired: holds that ended without an order.
	HoldsExpired(n int)
}

// Lister lists the vouchers whose room may admit now or soon: every
// voucher with a room whose sale has not ended. MySQL's list, not one kept
// in Redis: a Redis that restarts empty must not leave a room that no
// Admitter knows of.
type Lister func(ctx context.Context) ([]int64, error)

// AdmitEvery is how often an Admitter admits: a buyer whose turn has come
// is admitted within it (the contract gives a second).
const AdmitEvery = 100 * time.Millisecond

// NewAdmitter returns an Admitter of the rooms in store's index.
func NewAdmitter(store *Store, rooms Lister, find Finder, restock Restocker, obs Observer, now func() time.Time, log *slog.Logger) *Admitter {
	return &Admitter{store: store, rooms: rooms, find: find, restock: restock, obs: obs, now: now, log: log}
}

// Run admits every `every` until ctx ends.
func (a *Admitter) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var rooms []int64
	var listed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The list changes when a voucher with a room is made: read it
		// once a second, not at every tick.
		if time.Since(listed) >= time.Second {
			if ids, err := a.rooms(ctx); err == nil {
				rooms, listed = ids, time.Now()
			} else if ctx.Err() == nil {
				a.log.WarnContext(ctx, "room: list the rooms", "err", err)
			}
		}
		for _, id := range rooms {
			if err := a.admit(ctx, id); err != nil && ctx.Err() == nil {
				a.log.WarnContext(ctx, "room: admit", "voucher", id, "err", err)
			}
		}
	}
}

// admit admits what room id allows now, in as many calls as it takes.
func (a *Admitter) admit(ctx context.Context, id int64) error {
	sale, err := a.find(ctx, id)
	if ae := (*apperr.Error)(nil); errors.As(err, &ae) && ae.Code == apperr.NotFound {
		return nil // another database's voucher, on a Redis that several share
	}
	if err != nil || sale == nil {
		return err
	}
	if now := a.now(); now.Before(sale.Begin.Add(-time.Second)) || !now.Before(sale.End.Add(time.Second)) {
		return nil // nothing to admit (admit.lua checks Redis' clock)
	}
	for range 50 { // a long line, a high rate: a few calls; then the next tick
		got, err := a.store.Admit(ctx, *sale)
		if errors.Is(err, ErrStockMissing) {
			if err := a.restock(ctx, id); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if a.obs != nil {
			if len(got.Waits) > 0 {
				a.obs.Admitted(got.Waits)
			}
			if got.Ended > 0 {
				a.obs.HoldsExpired(int(got.Ended))
			}
		}
		if got.Admitted < maxPerCall {
			return nil
		}
	}
	return nil
}
