package lock

import (
	"context"
	"sync"
	"time"
)

// Local keeps locks in the memory of this process. It is here for teaching:
// it excludes goroutines of one process, but two instances of the service
// each have their own Local and hand the same lock out twice. Use it to see
// that failure (docs/locks.md, "Why not a sync.Mutex?"), or in a test that runs one instance.
type Local struct {
	mu     sync.Mutex
	locks  map[string]*localLock // by key
	fences map[string]int64      // by key
}

type localLock struct {
	token     string
	reentrant bool
	depth     int
	until     time.Time
	freed     chan struct{} // closed when the lock is released or expires
}

var _ Locker = (*Local)(nil)

// NewLocal returns an empty in-process backend.
func NewLocal() *Local {
	return &Local{locks: make(map[string]*localLock), fences: make(map[string]int64)}
}

// Obtain acquires the lock named key for ttl. See Locker.
func (l *Local) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	h := &localHolder{l: l, key: key, token: o.owner}
	if o.owner == "" {
		h.token = newToken()
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		start := time.Now()
		got, fence, freed, until := l.try(key, h.token, o.owner != "", o.fencing, start.Add(ttl))
		if got {
			return newLock(ctx, key, fence, start, ttl, h, o)
		}
		if !o.wait {
			return nil, ErrNotAcquired
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-freed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// try takes the lock if it is free. If not, it returns when the current
// holder's lock is freed or expires.
func (l *Local) try(key, token string, reentrant, fencing bool, until time.Time) (got bool, fence int64, freed <-chan struct{}, holderUntil time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.held(key)
	switch {
	case e == nil:
		e = &localLock{token: token, reentrant: reentrant, depth: 1, until: until, freed: make(chan struct{})}
		l.locks[key] = e
		if fencing || reentrant {
			l.fences[key]++ // as on Redis: entering again returns this token
		}
	case reentrant && e.reentrant && e.token == token:
		e.depth++
		e.lengthen(until)
	default:
		return false, 0, e.freed, e.until
	}
	if fencing {
		fence = l.fences[key]
	}
	return true, fence, nil, time.Time{}
}

// lengthen moves the expiry of a reentrant lock to until, if that is later.
// Every handle of the owner trusts the ttl it was given: entering again or
// renewing with a shorter ttl must not cut the lock short under another
// handle, or another owner could take it while that handle still believes
// it holds it (obtain.lua and extend.lua do the same on Redis).
func (e *localLock) lengthen(until time.Time) {
	if until.After(e.until) {
		e.until = until
	}
}

// held returns the unexpired lock on key, if any. Callers hold l.mu.
func (l *Local) held(key string) *localLock {
	e := l.locks[key]
	if e != nil && !time.Now().Before(e.until) {
		l.free(key, e)
		return nil
	}
	return e
}

func (l *Local) free(key string, e *localLock) {
	delete(l.locks, key)
	close(e.freed)
}

// localHolder is one acquisition on the in-process backend.
type localHolder struct {
	l     *Local
	key   string
	token string
}

func (h *localHolder) extend(_ context.Context, ttl time.Duration) error {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	e := h.l.held(h.key)
	if e == nil || e.token != h.token {
		return ErrNotHeld
	}
	until := time.Now().Add(ttl)
	if e.reentrant {
		e.lengthen(until)
		return nil
	}
	// A lock without an owner has one holder, who may shorten it too.
	e.until = until
	return nil
}

func (h *localHolder) release(_ context.Context) error {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	e := h.l.held(h.key)
	if e == nil || e.token != h.token {
		return ErrNotHeld
	}
	if e.depth--; e.depth == 0 {
		h.l.free(h.key, e)
	}
	return nil
}
