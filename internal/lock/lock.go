package lock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"
)

// The three outcomes a caller must tell apart. A Redis or network error is
// never one of them: it comes back wrapped, so that "somebody else has the
// lock" is never confused with "we could not ask".
var (
	// ErrNotAcquired means another holder has the lock: a try-once Obtain
	// found it taken, or Once found the key present. On Redis, MySQL,
	// etcd, ZooKeeper and Local a try-once Obtain is refused only while
	// some holder has the lock, and on Fair also while waiters are in
	// line (the first of them is taking it). On RedLock it may be refused
	// while nobody holds the lock: the votes split between contenders,
	// none of which won a majority (see RedLock).
	//
	// Obtain also wraps it, with the reason, when it took the lock too
	// late to use it, or lost it while waiting (etcd's lease ran out,
	// ZooKeeper's session ended); then it has given back whatever it took.
	ErrNotAcquired = errors.New("lock: not acquired")

	// ErrNotHeld means the caller no longer owns the lock it tries to
	// release or extend: it expired, or it expired and another holder took
	// it. It is also the cause (context.Cause) of a lost lock's Context.
	ErrNotHeld = errors.New("lock: not held")

	// ErrUnsupported means the backend cannot give the asked-for guarantee,
	// for example fencing tokens or reentrancy on RedLock.
	ErrUnsupported = errors.New("lock: not supported by this backend")
)

// Locker obtains locks. Redis, Fair, RedLock, MySQL, Etcd, ZooKeeper and
// Local implement it, so the service depends on this interface and
// cmd/server picks the backend.
type Locker interface {
	// Obtain acquires the lock named key for ttl. By default it tries once
	// and returns ErrNotAcquired if the lock is taken; with Wait it waits
	// until ctx is done and then returns ctx.Err() itself. An error of the
	// lock service ends a wait early (RedLock first rides out an outage
	// of up to a ttl).
	Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error)
}

// Lock is one acquisition of a lock. Its methods are safe to call from
// several goroutines.
type Lock interface {
	// Key returns the key given to Obtain.
	Key() string

	// Fence returns the fencing token of this acquisition: a number
	// strictly greater than that of every earlier acquisition of the same
	// key. It is 0 unless Obtain was given WithFencing.
	Fence() int64

	// Done is closed when the lock is released or lost: the watchdog or
	// Extend found it gone, or its validity ran out without renewal.
	Done() <-chan struct{}

	// Context is derived from the ctx given to Obtain and is cancelled when
	// the lock ends, just before Done is closed (so that whoever sees Done
	// finds the cause set). Run the protected work under it: if the lock
	// is lost, the work stops instead of going on unprotected. When the
	// lock was lost, context.Cause reports an error wrapping ErrNotHeld.
	Context() context.Context

	// Extend makes the lock live at least ttl more, if it is still held,
	// and moves this handle's deadline to ttl from now (on etcd and
	// ZooKeeper, no further than the lease or session the server
	// promises: see clientttl.go). A lock without an
	// owner gets exactly ttl, shorter or longer than before: it has one
	// holder. A reentrant lock (WithOwner) is only ever lengthened, since
	// the owner's other handles count on the ttl they were given.
	Extend(ctx context.Context, ttl time.Duration) error

	// Release gives the lock up. It returns ErrNotHeld if the lock had
	// already been released or lost. It runs even when ctx is cancelled,
	// because it is usually deferred past the end of the work's context;
	// it gives up after 5s. After Release the handle is finished whatever
	// the server answered. If the request failed, or its answer was lost,
	// the lock goes as its backend lets a lost holder's lock go: on Redis,
	// Fair and RedLock it expires by its ttl; MySQL closes the lock's
	// connection, and the server frees the lock when the session ends;
	// etcd's lease, no longer kept alive, runs out (it was revoked, if the
	// revoke got through); ZooKeeper, whose nodes have no ttl, looks for
	// them by their token until it has removed them or their session has
	// ended.
	Release(ctx context.Context) error
}

// Option changes how Obtain acquires and holds a lock.
type Option func(*options)

type options struct {
	wait     bool
	watchdog bool
	maxHold  time.Duration
	owner    string
	fencing  bool
}

func collect(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Wait makes Obtain wait for the lock until ctx is done, instead of trying
// once. On Redis the waiter sleeps until the holder announces its release,
// so it neither misses a release nor polls Redis in a loop.
func Wait() Option {
	return func(o *options) { o.wait = true }
}

// WithWatchdog renews the lock every ttl/3 for as long as it is held, so
// work that overruns its estimate stays protected. It stops on Release, and
// after maxHold has passed since the lock was obtained (0 means no cap):
// the cap keeps a forgotten or stuck holder from keeping the lock forever.
// If a renewal finds the lock gone, Done is closed and Context cancelled.
// Renewal goes on after the ctx given to Obtain ends: only Release, a loss,
// and maxHold stop it.
func WithWatchdog(maxHold time.Duration) Option {
	return func(o *options) { o.watchdog, o.maxHold = true, maxHold }
}

// WithOwner makes the lock reentrant for owner: Obtain by the same owner
// succeeds while the owner holds the lock, and the lock is freed when each
// of those acquisitions has been released. Go has no thread identity, so the
// caller names the owner; it must be unique to the holder (for example an
// instance ID plus a request ID), since two holders sharing an owner share
// the lock. An empty owner means no owner: the lock is not reentrant.
//
// Entering again, and renewing through any of the owner's handles, may
// lengthen the lock but never shortens it: each handle keeps the ttl it was
// promised. A handle still ends by its own deadline, so an inner handle
// obtained with a short ttl reports Done after that ttl (unless renewed)
// while the lock lives on for the outer ones.
func WithOwner(owner string) Option {
	return func(o *options) { o.owner = owner }
}

// WithFencing asks for a fencing token (see Lock.Fence). It costs one
// counter per key that never expires, so ask only where a writer checks it.
func WithFencing() Option {
	return func(o *options) { o.fencing = true }
}

// Do runs fn while holding the lock named key, then releases it. It tries
// once, so a second Do for the same key while the first runs gets
// ErrNotAcquired: the renewing one-shot lock, for work that must not run
// twice at the same time. A watchdog renews the lock while fn runs; opts may
// add Wait, or replace the watchdog with WithWatchdog(maxHold).
//
// fn gets the lock's Context. If the lock is lost while fn runs, that
// context is cancelled; if fn still returns nil, Do returns an error
// wrapping ErrNotHeld, because the work was not protected to its end. An
// error of the lock service while releasing is not reported: the work is
// done and was protected, and the lock goes as Lock.Release says.
func Do(ctx context.Context, l Locker, key string, ttl time.Duration, fn func(ctx context.Context) error, opts ...Option) error {
	opts = append([]Option{WithWatchdog(0)}, opts...)
	lk, err := l.Obtain(ctx, key, ttl, opts...)
	if err != nil {
		return err
	}
	err = fn(lk.Context())
	if rerr := lk.Release(ctx); err == nil && errors.Is(rerr, ErrNotHeld) {
		return fmt.Errorf("lock: %q was lost before the work finished: %w", key, rerr)
	}
	return err
}

// newToken returns the random value that marks the holder of a lock. It
// comes from crypto/rand: a guessable or repeating value would let one
// client release or extend a lock another client holds.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// drift is the safety margin taken off a lock's time to live when the
// holder computes how long it may trust the lock: clocks of the client and
// of Redis run at slightly different rates, and Redis expires keys with
// millisecond precision. The RedLock description uses the same 1% + 2ms.
func drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// minTTL keeps the ttl well above drift's 2ms and Redis' 1ms precision.
const minTTL = 10 * time.Millisecond

func checkTTL(ttl time.Duration) error {
	if ttl < minTTL {
		return fmt.Errorf("lock: ttl must be at least %v, got %v", minTTL, ttl)
	}
	return nil
}

// millis converts a positive duration to whole milliseconds for PX and
// PEXPIRE, rounding up so a short ttl never becomes 0 (PEXPIRE 0 deletes).
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
