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
// It does not support WithOwner (a reentrant count cannot be kept
// consistently on independent servers) nor WithFencing (neither can a
// counter). Waiting polls, since a release is not announced.
type RedLock struct {
	rs      *redsync.Redsync
	maxPoll time.Duration
}

var _ Locker = (*RedLock)(nil)

// NewRedLock returns a backend using one independent server per client.
func NewRedLock(clients []redis.UniversalClient) *RedLock {
	pools := make([]redsyncredis.Pool, len(clients))
	for i, c := range clients {
		pools[i] = goredis.NewPool(c)
	}
	return &RedLock{rs: redsync.New(pools...), maxPoll: 100 * time.Millisecond}
}

// Obtain acquires the lock named key for ttl. See Locker.
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
	h := &redlockHolder{rs: rl.rs, name: keysFor(key).lock, token: newToken()}
	for {
		m := rl.rs.NewMutex(h.name,
			redsync.WithExpiry(ttl),
			redsync.WithTries(1),
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
		if err = sortRedsyncErr(err, ErrNotAcquired); err != ErrNotAcquired {
			return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
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

// sortRedsyncErr turns redsync's joined per-server errors into one of our
// outcomes. A majority saying "taken" is notOK; otherwise a server that
// could not be asked makes it a Redis error, since the majority may have
// been ours; servers that merely disagree are notOK.
func sortRedsyncErr(err error, notOK error) error {
	var taken *redsync.ErrTaken
	var unreachable *redsync.RedisError
	switch {
	case errors.As(err, &taken):
		return notOK
	case errors.As(err, &unreachable):
		return err
	}
	return notOK
}

// redlockHolder is one acquisition on RedLock.
type redlockHolder struct {
	rs    *redsync.Redsync
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
	return sortRedsyncErr(err, ErrNotHeld)
}

func (h *redlockHolder) release(ctx context.Context) error {
	// The expiry plays no part in a release.
	ok, err := h.mutex(time.Second).UnlockContext(ctx)
	if ok {
		return nil
	}
	return sortRedsyncErr(err, ErrNotHeld)
}
