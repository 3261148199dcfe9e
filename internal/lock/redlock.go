package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// RedLock spreads each lock over N independent Redis servers (not replicas
// of one another) with go-redsync: a lock is held when a majority, N/2+1,
// granted it within its validity, and is released on all of them. It
// survives the loss of a minority of servers, which a single Redis and its
// failover cannot promise; see the package documentation for its limits.
//
// A try-once Obtain may be refused while nobody holds the lock: when
// contenders ask at once, the votes split between contenders, none wins a
// majority, and each gives back what it won and reports ErrNotAcquired.
// The servers have no single place where "free" could be decided, so this
// cannot be helped; a waiter simply tries again.
//
// It does not support WithOwner (a reentrant count cannot be kept
// consistently on independent servers) nor WithFencing (neither can a
// counter). Waiting polls, since a release is not announced, and rides out
// a short spell when no majority answers (see Obtain).
type RedLock struct {
	rs      *redsync.Redsync
	n       int // servers
	maxPoll time.Duration
}

var _ Locker = (*RedLock)(nil)

// NewRedLock returns a backend using one independent server per client.
//
// Give the clients ContextTimeoutEnabled: in Obtain each server has a share
// of the ttl to answer an attempt (see serverTimeout), passed as a context
// deadline (Extend and Release wait for every server until their ctx ends), and without that option a go-redis client honours the deadline
// while dialling and waiting for a pooled connection but not while it
// reads: a stalled server would hold every attempt for the client's
// ReadTimeout (3 s by default). MaxRetries -1 is right too: a server that
// did not answer in time counts as a no.
func NewRedLock(clients []redis.UniversalClient) *RedLock {
	pools := make([]redsyncredis.Pool, len(clients))
	for i, c := range clients {
		pools[i] = goredis.NewPool(c)
	}
	return &RedLock{rs: redsync.New(pools...), n: len(pools), maxPoll: 100 * time.Millisecond}
}

// Obtain acquires the lock named key for ttl. See Locker. When so many
// servers fail to answer that no majority is possible, Obtain returns
// their errors (not ErrNotAcquired). With Wait it first keeps trying for as
// long as the ttl and at least redlockOutageTries attempts: a server that
// answered late once is usually back by the next poll.
func (rl *RedLock) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	switch {
	case o.owner != "":
		return nil, fmt.Errorf("lock: obtain %q: reentrancy on RedLock: %w", key, ErrUnsupported)
	case o.fencing:
		return nil, fmt.Errorf("lock: obtain %q: fencing on RedLock: %w", key, ErrUnsupported)
	}
	h := &redlockHolder{rs: rl.rs, n: rl.n, name: keysFor(key).lock, token: newToken()}
	// Attempts in a row that could not reach a majority, since when.
	outages, outageSince := 0, time.Time{}
	for {
		m := rl.rs.NewMutex(h.name,
			redsync.WithExpiry(ttl),
			redsync.WithTries(1),
			redsync.WithTimeoutFactor(serverTimeout(ttl)),
			redsync.WithGenValueFunc(func() (string, error) { return h.token, nil }),
		)
		start := time.Now()
		err := m.TryLockContext(ctx)
		if err == nil {
			return newLock(ctx, key, 0, start, ttl, h, o)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err = sortRedsyncErr(err, rl.n, ErrNotAcquired); err != ErrNotAcquired {
			// Too many servers failed to answer. A waiter rides out a
			// blip (a server that answered later than its share of the
			// ttl, a connection being redialled), as redsync's own
			// retries would; an outage that lasts is reported.
			if outages == 0 {
				outageSince = start
			}
			outages++
			if !o.wait || outages >= redlockOutageTries && time.Since(outageSince) >= ttl {
				return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
			}
		} else {
			outages = 0
		}
		if !o.wait {
			return nil, ErrNotAcquired
		}
		d := min(ttl, rl.maxPoll)
		t := time.NewTimer(d/2 + rand.N(d/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// serverTimeout is the share of the ttl each server has to answer an
// attempt: redsync's 5%, but at least 100 ms (a 500 ms lock would give a
// server 25 ms, which a loaded machine misses without anything being
// wrong) and at most half the ttl. A slow answer cannot make a lock unsafe:
// the lock's validity is counted from the start of the attempt.
func serverTimeout(ttl time.Duration) float64 {
	return min(max(0.05, float64(100*time.Millisecond)/float64(ttl)), 0.5)
}

// redlockOutageTries is the fewest attempts in a row a waiter makes while
// a majority of the servers cannot be reached before it gives up with the
// Redis error.
const redlockOutageTries = 3

// sortRedsyncErr turns redsync's joined per-server errors into one of our
// outcomes. If so many of the n servers could not be asked that the rest
// cannot form a majority, the lock service itself is down: that is a Redis
// error. Otherwise the servers that answered said no (the lock is taken, or
// the votes split between contenders), which is notOK.
func sortRedsyncErr(err error, n int, notOK error) error {
	if n-unreachable(err) < quorum(n) {
		return err
	}
	return notOK
}

// unreachable counts the servers err says could not be asked. redsync
// joins its per-server errors one at a time, so the joins nest.
func unreachable(err error) int {
	switch err := err.(type) {
	case *redsync.RedisError:
		return 1
	case interface{ Unwrap() []error }:
		sum := 0
		for _, e := range err.Unwrap() {
			sum += unreachable(e)
		}
		return sum
	}
	return 0
}

func quorum(n int) int { return n/2 + 1 }

// redlockHolder is one acquisition on RedLock.
type redlockHolder struct {
	rs    *redsync.Redsync
	n     int
	name  string
	token string
}

func (h *redlockHolder) mutex(ttl time.Duration) *redsync.Mutex {
	return h.rs.NewMutex(h.name, redsync.WithExpiry(ttl), redsync.WithValue(h.token))
}

func (h *redlockHolder) extend(ctx context.Context, ttl time.Duration) error {
	ok, err := h.mutex(ttl).ExtendContext(ctx)
	switch {
	case ok:
		return nil
	case errors.Is(err, redsync.ErrExtendFailed):
		return err // a majority renewed, but too slowly to count on
	}
	return sortRedsyncErr(err, h.n, ErrNotHeld)
}

func (h *redlockHolder) release(ctx context.Context) error {
	// The expiry plays no part in a release.
	ok, err := h.mutex(time.Second).UnlockContext(ctx)
	if ok {
		return nil
	}
	return sortRedsyncErr(err, h.n, ErrNotHeld)
}
