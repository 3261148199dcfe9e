package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// ObtainAll acquires the locks named keys from l, all of them or none:
// when one cannot be had, those already taken are released before it
// returns. It suits work that touches several resources at once, such as
// moving stock between two vouchers, which must not run beside other work
// on either of them. The result is one Lock: Release and Extend act on
// every member, and Done closes (and Context is cancelled) as soon as any
// member is lost. Its Key is the keys, sorted and joined by commas.
//
// Options are those of l.Obtain, given to each member, but WithFencing is
// not supported (ErrUnsupported): there would be one token per member. With
// Wait, ObtainAll waits until ctx is done, so the wait is bounded by ctx.
//
// Two clients taking overlapping sets could each hold what the other waits
// for, and wait forever: A holds x and waits for y, B holds y and waits
// for x. ObtainAll therefore takes the locks in one order, sorted by key,
// whatever order the caller gave: then whoever holds the greatest key
// taken so far can always go on, and no cycle of waits can form. (The
// keys usually live in different Redis Cluster slots, so no single script
// can take them all at once.)
//
// While it waits for a later lock, the earlier ones run down their ttl. If
// one of them expires meanwhile, ObtainAll releases all and starts over;
// give a ttl longer than the expected wait, or WithWatchdog, which renews
// the members it holds while it waits for the rest.
func ObtainAll(ctx context.Context, l Locker, keys []string, ttl time.Duration, opts ...Option) (Lock, error) {
	o := collect(opts)
	if o.fencing {
		return nil, fmt.Errorf("lock: obtain all of %q: fencing: %w", keys, ErrUnsupported)
	}
	if len(keys) == 0 {
		return nil, errors.New("lock: obtain all: no keys")
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(keys)))
	for {
		held, err := obtainInOrder(ctx, l, sorted, ttl, opts)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(held, func(lk Lock) bool { return !isOpen(lk.Done()) }) {
			return newMulti(ctx, sorted, held), nil
		}
		releaseAll(ctx, held)
		if !o.wait {
			return nil, ErrNotAcquired
		}
	}
}

// obtainInOrder takes the locks one after the other, or none.
func obtainInOrder(ctx context.Context, l Locker, keys []string, ttl time.Duration, opts []Option) ([]Lock, error) {
	held := make([]Lock, 0, len(keys))
	for _, key := range keys {
		lk, err := l.Obtain(ctx, key, ttl, opts...)
		if err != nil {
			releaseAll(ctx, held)
			return nil, err
		}
		held = append(held, lk)
	}
	return held, nil
}

// releaseAll gives back locks taken for an acquisition that failed. Errors
// are dropped: a lock that could not be released expires by its ttl.
func releaseAll(ctx context.Context, locks []Lock) {
	for _, lk := range slices.Backward(locks) {
		_ = lk.Release(ctx)
	}
}

// multi is the Lock ObtainAll returns.
type multi struct {
	key     string
	members []Lock
	done    chan struct{}
	ctx     context.Context
	cancel  context.CancelCauseFunc

	mu       sync.Mutex
	released bool // Release was called; guarded by mu
	lost     bool // a member was lost before Release; guarded by mu
}

func newMulti(ctx context.Context, keys []string, members []Lock) *multi {
	m := &multi{key: strings.Join(keys, ","), members: members, done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancelCause(ctx)
	for _, lk := range members {
		// Every member's Done closes, by Release or loss, so these end.
		go func() {
			<-lk.Done()
			m.end(context.Cause(lk.Context()), false)
		}()
	}
	return m
}

func (m *multi) Key() string              { return m.key }
func (m *multi) Fence() int64             { return 0 }
func (m *multi) Done() <-chan struct{}    { return m.done }
func (m *multi) Context() context.Context { return m.ctx }

// Extend extends every member. If one is found lost, the whole is.
func (m *multi) Extend(ctx context.Context, ttl time.Duration) error {
	for _, lk := range m.members {
		if err := lk.Extend(ctx, ttl); err != nil {
			return err // ErrNotHeld ends m through the member's Done
		}
	}
	return nil
}

// Release releases every member, and reports ErrNotHeld if any of them
// had been lost, as a lost lock does.
func (m *multi) Release(ctx context.Context) error {
	m.mu.Lock()
	if m.released {
		m.mu.Unlock()
		return ErrNotHeld
	}
	m.released = true
	m.mu.Unlock()

	var notHeld bool
	var errs []error
	for _, lk := range slices.Backward(m.members) {
		switch err := lk.Release(ctx); {
		case errors.Is(err, ErrNotHeld):
			notHeld = true
		case err != nil:
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	wasLost := m.lost
	m.mu.Unlock()
	m.end(context.Canceled, true)
	switch {
	case notHeld || wasLost:
		return ErrNotHeld
	case errs != nil:
		return errors.Join(errs...)
	}
	return nil
}

// end finishes m once: it cancels Context with cause, then closes Done. A
// member's end after Release is Release's doing, not a loss.
func (m *multi) end(cause error, byRelease bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !isOpen(m.done) || (m.released && !byRelease) {
		return
	}
	if !byRelease {
		m.lost = true
	}
	m.cancel(cause)
	close(m.done)
}

// isOpen reports whether ch is still open: for a lock's Done, whether the
// lock is still held.
func isOpen(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}
