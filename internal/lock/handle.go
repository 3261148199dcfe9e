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

	// watchdogStop and watchdogExited are nil without a watchdog.
	watchdogStop   context.CancelFunc
	watchdogExited chan struct{}

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
	var wctx context.Context
	if o.watchdog {
		// The watchdog outlives a cancelled Obtain ctx (it keeps its
		// values only): holding the lock ends with Release or maxHold.
		wctx, lk.watchdogStop = context.WithCancel(context.WithoutCancel(ctx))
		lk.watchdogExited = make(chan struct{})
	}
	// Under mu: checkExpiry may run before AfterFunc has even returned.
	lk.mu.Lock()
	lk.expiry = time.AfterFunc(time.Until(lk.until), lk.checkExpiry)
	lk.mu.Unlock()
	if wctx != nil {
		go lk.watch(wctx, start, ttl, o.maxHold)
	}
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
	if lk.watchdogStop != nil {
		lk.watchdogStop()
		<-lk.watchdogExited
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
	if lk.watchdogStop != nil {
		lk.watchdogStop()
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

// watch renews the lock every ttl/3: two renewals can fail in a row and the
// lock still lives. A failed request is not a loss (the next tick retries,
// and checkExpiry ends the lock if none succeeds in time); a renewal that
// finds the lock gone is.
func (lk *handle) watch(ctx context.Context, start time.Time, ttl, maxHold time.Duration) {
	defer close(lk.watchdogExited)
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		next := ttl
		if maxHold > 0 {
			// Renew no further than the cap; after that let it expire.
			left := maxHold - time.Since(start)
			if left < time.Millisecond {
				return
			}
			next = min(ttl, left)
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		err := lk.holder.extend(rctx, next)
		cancel()
		switch {
		case err == nil:
			lk.setUntil(sent.Add(next - drift(next)))
		case errors.Is(err, ErrNotHeld):
			lk.end(lk.errLost("was lost"), false)
			return
		}
	}
}
