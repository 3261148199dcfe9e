package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// holder is what a backend does for one acquisition; handle does the rest.
// Both methods compare the holder's token first, so they never touch a lock
// somebody else has taken since.
type holder interface {
	// extend makes the lock live at least ttl more: it sets the time to
	// live of a lock without an owner, and only ever lengthens that of a
	// reentrant lock, which other handles of the owner count on. It
	// returns ErrNotHeld if the lock is gone or belongs to somebody else.
	extend(ctx context.Context, ttl time.Duration) error
	// release frees the lock (or drops one level of a reentrant lock). It
	// returns ErrNotHeld if the lock is gone or belongs to somebody else.
	release(ctx context.Context) error
}

// releaseTimeout bounds Release, which ignores the caller's cancellation.
const releaseTimeout = 5 * time.Second

// handle is the Lock every backend returns. It keeps what the backends have
// in common: the local deadline, the watchdog, and Done and Context.
type handle struct {
	key    string
	fence  int64
	holder holder

	done   chan struct{}
	ctx    context.Context
	cancel context.CancelCauseFunc

	watchdog *watchdog // nil without one

	mu       sync.Mutex
	until    time.Time   // local deadline; guarded by mu
	expiry   *time.Timer // fires at until; guarded by mu
	released bool        // Release was called; guarded by mu
	lost     bool        // found lost before Release; guarded by mu
}

// newHandle starts the life of a lock acquired by a request that was sent
// at start. The deadline counts from start, a monotonic clock reading taken
// before the request, never from when Redis replied: the key may have been
// set at any moment in between, so only start is a safe lower bound.
func newHandle(ctx context.Context, key string, fence int64, start time.Time, ttl time.Duration, h holder, o options) *handle {
	lk := &handle{
		key:    key,
		fence:  fence,
		holder: h,
		done:   make(chan struct{}),
		until:  start.Add(ttl - drift(ttl)),
	}
	lk.ctx, lk.cancel = context.WithCancelCause(ctx)
	// Both timers are set under mu: checkExpiry, and a renewal through
	// setUntil or end, may run before AfterFunc has even returned, and
	// must find the handle whole. (This takes mu, then the watchdog's
	// own, the reverse of a renewal's order; no deadlock: nobody else
	// can hold the watchdog's before startWatchdog returns, and a
	// renewal that fires afterwards only waits here for mu.)
	lk.mu.Lock()
	lk.expiry = time.AfterFunc(time.Until(lk.until), lk.checkExpiry)
	if o.watchdog {
		lk.watchdog = startWatchdog(ctx, lk, start, ttl, o.maxHold)
	}
	lk.mu.Unlock()
	return lk
}

func (lk *handle) Key() string              { return lk.key }
func (lk *handle) Fence() int64             { return lk.fence }
func (lk *handle) Done() <-chan struct{}    { return lk.done }
func (lk *handle) Context() context.Context { return lk.ctx }
func (lk *handle) String() string           { return fmt.Sprintf("lock %q", lk.key) }
func (lk *handle) errLost(why string) error {
	return fmt.Errorf("lock: %q %s: %w", lk.key, why, ErrNotHeld)
}
func (lk *handle) errOp(op string, err error) error {
	return fmt.Errorf("lock: %s %q: %w", op, lk.key, err)
}

// Extend resets the time to live. A lock found gone is marked lost.
func (lk *handle) Extend(ctx context.Context, ttl time.Duration) error {
	if err := checkTTL(ttl); err != nil {
		return err
	}
	lk.mu.Lock()
	over := lk.released || lk.lost
	lk.mu.Unlock()
	if over {
		return ErrNotHeld
	}
	start := time.Now()
	switch err := lk.holder.extend(ctx, ttl); {
	case err == nil:
		lk.setUntil(start.Add(ttl - drift(ttl)))
		return nil
	case errors.Is(err, ErrNotHeld):
		lk.end(lk.errLost("was lost"), false)
		return ErrNotHeld
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return lk.errOp("extend", err)
	}
}

// Release frees the lock. The handle is finished afterwards whatever the
// server answered: if the request failed, the lock goes as its backend
// lets a lost holder's lock go (see Lock.Release: a Redis key expires by
// its ttl), which is safer than leaving a watchdog renewing a lock nobody
// will release.
func (lk *handle) Release(ctx context.Context) error {
	lk.mu.Lock()
	if lk.released {
		lk.mu.Unlock()
		return ErrNotHeld
	}
	lk.released = true
	wasLost := lk.lost
	lk.mu.Unlock()

	// Stop renewing before releasing, so no renewal can follow the release.
	if lk.watchdog != nil {
		lk.watchdog.halt()
	}
	// Release is cleanup: it must run after the work's context ended.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	err := lk.holder.release(rctx)
	lk.end(context.Canceled, true)

	switch {
	case wasLost || errors.Is(err, ErrNotHeld):
		return ErrNotHeld
	case err != nil:
		return lk.errOp("release", err)
	}
	return nil
}

// end finishes the handle once: it closes Done and cancels Context with
// cause. A lock that ends other than by Release is recorded as lost.
func (lk *handle) end(cause error, byRelease bool) {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	select {
	case <-lk.done:
		return
	default:
	}
	if !byRelease {
		lk.lost = true
	}
	lk.expiry.Stop()
	if lk.watchdog != nil {
		lk.watchdog.quit()
	}
	lk.cancel(cause) // first: whoever sees Done must find the cause set
	close(lk.done)
}

// setUntil moves the local deadline after a successful renewal.
func (lk *handle) setUntil(until time.Time) {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.released || lk.lost {
		return
	}
	lk.until = until
	lk.expiry.Reset(time.Until(until))
}

// checkExpiry runs when the local deadline passes. Unless a renewal moved
// the deadline meanwhile, the lock can no longer be trusted: another client
// may already hold it, so the holder is told to stop.
func (lk *handle) checkExpiry() {
	lk.mu.Lock()
	expired := !time.Now().Before(lk.until)
	lk.mu.Unlock()
	if expired {
		lk.end(lk.errLost("expired"), false)
	}
}

// A watchdog renews a lock every ttl/3: two renewals can fail in a row and
// the lock still lives. A failed request is not a loss (the next renewal
// retries, and checkExpiry ends the lock if none succeeds in time); a
// renewal that finds the lock gone is.
//
// It runs from a timer, not from a goroutine of its own that waits on a
// ticker: most locks are held for milliseconds and released long before
// their first renewal, and a timer that never fires costs no goroutine to
// start, park and wake again at Release (one sync order takes one such
// lock: BENCHMARKS.md, internal/lock).
type watchdog struct {
	lk           *handle
	ctx          context.Context    // ends with halt or quit: cuts a renewal in flight short
	stop         context.CancelFunc // ends ctx
	start        time.Time
	ttl, maxHold time.Duration

	mu    sync.Mutex  // held by a renewal while it runs: halt waits on it
	timer *time.Timer // the next renewal; guarded by mu
	due   time.Time   // when the timer was set to fire; guarded by mu
}

// startWatchdog arms the first renewal, ttl/3 from now. The watchdog
// outlives a cancelled Obtain ctx (it keeps its values only): holding the
// lock ends with Release, a loss or maxHold.
func startWatchdog(ctx context.Context, lk *handle, start time.Time, ttl, maxHold time.Duration) *watchdog {
	w := &watchdog{lk: lk, start: start, ttl: ttl, maxHold: maxHold}
	w.ctx, w.stop = context.WithCancel(context.WithoutCancel(ctx))
	// Under mu: renew may run before AfterFunc has even returned.
	w.mu.Lock()
	w.due = time.Now().Add(ttl / 3)
	w.timer = time.AfterFunc(ttl/3, w.renew)
	w.mu.Unlock()
	return w
}

// renew runs on the timer's goroutine: it extends the lock, then sets the
// timer again, for ttl/3 after this renewal was due (at once if that has
// passed already, as a ticker's waiting tick would).
func (w *watchdog) renew() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() != nil {
		return // halted or quit: no renewal may follow
	}
	next := w.ttl
	if w.maxHold > 0 {
		// Renew no further than the cap; after that let it expire.
		left := w.maxHold - time.Since(w.start)
		if left < time.Millisecond {
			return
		}
		next = min(w.ttl, left)
	}
	sent := time.Now()
	rctx, cancel := context.WithTimeout(w.ctx, w.ttl/3)
	err := w.lk.holder.extend(rctx, next)
	cancel()
	switch {
	case err == nil:
		w.lk.setUntil(sent.Add(next - drift(next)))
	case errors.Is(err, ErrNotHeld):
		w.lk.end(w.lk.errLost("was lost"), false)
		return
	}
	if w.ctx.Err() != nil {
		return // halted or quit while renewing: not again
	}
	w.due = later(w.due.Add(w.ttl/3), time.Now())
	w.timer.Reset(time.Until(w.due))
}

// halt stops the watchdog and waits for a renewal in flight, which it cuts
// short: once it returns, no renewal runs or will.
func (w *watchdog) halt() {
	w.stop()
	w.mu.Lock()
	w.timer.Stop()
	w.mu.Unlock()
}

// quit stops the watchdog without waiting: end calls it, from renew too,
// which holds mu. A renewal that fires later finds ctx ended and does
// nothing. (end runs under the handle's mu, under which newHandle set the
// timer: it reads timer safely without the watchdog's.)
func (w *watchdog) quit() {
	w.stop()
	w.timer.Stop()
}
