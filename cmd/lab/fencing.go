package main

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"seckill/internal/lock"
)

// Experiment 11: a stop-the-world pause longer than the ttl, even with a
// watchdog.
//
// Experiment 10's watchdog renews the lock from a goroutine of the holder's
// process. When the whole process stops (a long GC pause, a swapped-out
// page, a frozen VM), the watchdog stops with it. The holder checked that
// its lock was live, then froze; the lock expired and went to B, who did
// the work; then the holder wakes up and writes, as if it still held the
// lock. Nothing on the holder's side can close that gap: it can freeze
// after any check. The storage must refuse the write. With a fencing
// token, each acquisition carries a number larger than all before it, and
// the storage accepts a write only with a number larger than the last
// one it saw. The lab freezes the holder between its check and its write.
var pauseFencing = experiment{
	name:   "pause-fencing",
	title:  "stop-the-world pause past the ttl, watchdog or not",
	counts: "lost update",
	lesson: "a paused holder cannot know it lost the lock: the storage must check a fencing token",
	broken: func(ctx context.Context) (outcome, error) { return frozenHolder(ctx, storeSale) },
	fixed:  func(ctx context.Context) (outcome, error) { return frozenHolder(ctx, storeSaleFenced) },
}

// stockKey names the lock that makes selling a read-modify-write.
const stockKey = "stock:voucher:1"

// errStaleFence is the storage refusing a write from a holder whose token
// is older than one it has already seen.
var errStaleFence = errors.New("stale fencing token")

// storeFunc writes the stock a lock holder computed and the order it
// sold, as one transaction. fence is the holder's fencing token.
type storeFunc func(ctx context.Context, db *gorm.DB, user int64, stock int, fence int64) error

// sellLocked sells one unit to user by reading the stock and writing it
// back less one, trusting the lock to keep others out in between. The
// lock has a watchdog, and the writes run under its Context, so a lock
// found lost cancels them: all a holder can do on its own side.
func sellLocked(ctx context.Context, locks *lock.Redis, db *gorm.DB, user int64, store storeFunc, pause func()) error {
	lk, err := locks.Obtain(ctx, stockKey, lockTTL, lock.WithWatchdog(0), lock.WithFencing())
	if err != nil {
		return err
	}
	defer lk.Release(ctx)

	stock, err := stockLeft(lk.Context(), db)
	if err != nil {
		return err
	}
	if stock <= 0 {
		return errSoldOut
	}
	if err := lk.Context().Err(); err != nil {
		return err // the lock is lost: stop (it is not, yet)
	}

	pause() // the lab: the whole process freezes here, watchdog included

	return store(lk.Context(), db, user, stock-1, lk.Fence())
}

// frozenHolder lets A sell under the lock and freezes A before its write.
// While A is frozen, Redis' clock moves past A's ttl and B sells under
// the lock. Then A wakes and writes. Every sale the stock does not
// account for (orders beyond the units taken) is a violation.
func frozenHolder(ctx context.Context, store storeFunc) (outcome, error) {
	srv, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	db, closeDB, err := openDB(ctx, saleStock)
	if err != nil {
		return outcome{}, err
	}
	defer closeDB()
	clk := newHandClock(srv)
	locks := lock.NewRedis(rdb)

	// A's lane runs until its write: frozen, it still believes it holds
	// the lock, in both variants. Only the storage can tell, and the
	// picture shows what it told: A's write taken (red) or refused.
	const a, b = "A (token 1)", "B (token 2)"
	tl := newTimeline(handClockName, clk.now)
	tl.take(a)
	var errB error
	errA := sellLocked(ctx, locks, db, 1, store, func() {
		clk.forward(2 * lockTTL) // A is frozen; its lock expires
		tl.mark("A frozen; its lock expires")
		tl.lapsed(a)
		tl.take(b)
		errB = sellLocked(ctx, locks, db, 2, store, nothing)
		if errB == nil {
			tl.write(b, wrote, "stock 9")
		}
		tl.drop(b)
	})
	switch {
	case errors.Is(errA, errStaleFence):
		tl.write(a, fencedOff, "refused: token 1 < 2")
	case errA == nil:
		tl.write(a, staleWrite, "stock 9 again: B's sale lost")
	}
	tl.drop(a)
	tl.end()
	refused := 0
	if errors.Is(errA, errStaleFence) {
		refused, errA = 1, nil
	}
	if err := errors.Join(errA, errB); err != nil {
		return outcome{}, err
	}

	orders, err := countOrders(ctx, db, 0)
	if err != nil {
		return outcome{}, err
	}
	stock, err := stockLeft(ctx, db)
	if err != nil {
		return outcome{}, err
	}
	lost := orders - (saleStock - stock)
	summary := fmt.Sprintf("A's stale write refused: %s, stock %d", plural(orders, "order"), stock)
	if lost > 0 {
		summary = fmt.Sprintf("A's stale write accepted: %s, stock %d", plural(orders, "order"), stock)
	}
	return outcome{
		violations: lost,
		summary:    summary,
		measures:   map[string]int{"orders": orders, "stock": stock, "stale_writes_refused": refused},
		timeline:   tl,
	}, nil
}
