package lock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the native backend: one Redis server (or a Cluster, or a
// primary with replicas) holds each lock. An uncontended Obtain is one
// round trip (SET NX PX, or one script for fencing and reentrancy) and a
// Release is one more.
//
// A request whose answer is lost (the connection dropped, the server
// failed over) may have set the key, or left it in place: either way the
// key expires by its ttl, which every lock here has, so nothing outlives
// it.
type Redis struct {
	rdb     redis.UniversalClient
	waiters *waiters
	// maxPoll bounds how long a waiter sleeps without news before it
	// looks again. Releases wake waiters at once; the poll is for what
	// announces nothing: a holder's lock expiring, or a lost message.
	maxPoll time.Duration
}

var _ Locker = (*Redis)(nil)

// NewRedis returns a backend storing locks in rdb.
func NewRedis(rdb redis.UniversalClient) *Redis {
	return &Redis{rdb: rdb, waiters: newWaiters(rdb), maxPoll: time.Second}
}

// Obtain acquires the lock named key for ttl. See Locker.
func (r *Redis) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	rh := &redisHolder{rdb: r.rdb, keys: keysFor(key), token: o.owner, reentrant: o.owner != ""}
	if !rh.reentrant {
		rh.token = newToken()
	}

	var start time.Time
	var fence int64
	err := r.retry(ctx, "obtain", key, rh.keys.released, o.wait,
		func(ctx context.Context) (bool, time.Duration, error) {
			start = time.Now()
			// n is the fencing token if got, else the holder's remaining ms.
			got, n, err := rh.obtain(ctx, ttl, o.fencing, o.wait)
			if got {
				fence = n
			}
			return got, time.Duration(n) * time.Millisecond, err
		})
	if err != nil {
		return nil, err
	}
	return newLock(ctx, key, fence, start, ttl, rh, o)
}

// newLock wraps a fresh acquisition in a handle, unless the request took so
// long that the lock's validity ran out before it could be used.
func newLock(ctx context.Context, key string, fence int64, start time.Time, ttl time.Duration, h holder, o options) (Lock, error) {
	if time.Since(start) >= ttl-drift(ttl) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = h.release(rctx)
		return nil, fmt.Errorf("lock: obtain %q: acquired after its ttl had run out: %w", key, ErrNotAcquired)
	}
	return newHandle(ctx, key, fence, start, ttl, h, o), nil
}

// pollDelay says how long a waiter sleeps when no release wakes it. If the
// holder's lock expires sooner than maxPoll, the waiter looks right after
// that; a little jitter keeps many waiters from looking all at once.
// A holderTTL below zero means the key has no expiry (not one of ours).
func pollDelay(holderTTL, maxPoll time.Duration) time.Duration {
	if holderTTL >= 0 && holderTTL < maxPoll {
		return holderTTL + time.Millisecond + rand.N(holderTTL/8+time.Millisecond)
	}
	return maxPoll/2 + rand.N(maxPoll/2+1)
}

// Once takes a one-shot lock: it succeeds if key is free and returns
// ErrNotAcquired if not. The lock is never renewed nor released: it
// expires after ttl. This guards against duplicate submissions: the first
// request within ttl goes through, repeats fail at once. Once and Obtain
// share their keys, so a one-shot lock and a lock of the same name exclude
// each other.
func (r *Redis) Once(ctx context.Context, key string, ttl time.Duration) error {
	if err := checkTTL(ttl); err != nil {
		return err
	}
	ok, err := r.rdb.SetNX(ctx, keysFor(key).lock, newToken(), ttl).Result()
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return fmt.Errorf("lock: once %q: %w", key, err)
	case !ok:
		return ErrNotAcquired
	}
	return nil
}

// redisHolder is one acquisition on the native backend.
type redisHolder struct {
	rdb       redis.UniversalClient
	keys      keys
	token     string // random, or the owner of a reentrant lock
	reentrant bool
}

// obtain tries to take the lock once. n is the fencing token if got, and
// the holder's remaining milliseconds if not (when needTTL).
func (h *redisHolder) obtain(ctx context.Context, ttl time.Duration, fencing, needTTL bool) (got bool, n int64, err error) {
	if !h.reentrant && !fencing && !needTTL {
		// The hot path: one plain command.
		got, err := h.rdb.SetNX(ctx, h.keys.lock, h.token, ttl).Result()
		return got, 0, err
	}
	res, err := obtainScript.Run(ctx, h.rdb,
		[]string{h.keys.lock, h.keys.fence},
		h.token, millis(ttl), flag(h.reentrant), flag(fencing),
	).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("obtain script returned %v", res)
	}
	switch res[0] {
	case obtainAcquired, obtainReentered:
		return true, res[1], nil
	case obtainTaken:
		return false, res[1], nil
	}
	return false, 0, fmt.Errorf("obtain script returned code %d", res[0])
}

func (h *redisHolder) extend(ctx context.Context, ttl time.Duration) error {
	code, err := extendScript.Run(ctx, h.rdb, []string{h.keys.lock}, h.token, millis(ttl)).Int64()
	switch {
	case err != nil:
		return err
	case code == extendNotHeld:
		return ErrNotHeld
	case code != extendExtended:
		return fmt.Errorf("extend script returned code %d", code)
	}
	return nil
}

func (h *redisHolder) release(ctx context.Context) error {
	code, err := releaseScript.Run(ctx, h.rdb, []string{h.keys.lock}, h.token, h.keys.released).Int64()
	switch {
	case err != nil:
		return err
	case code == releaseNotHeld:
		return ErrNotHeld
	case code != releaseReleased && code != releaseEntered:
		return fmt.Errorf("release script returned code %d", code)
	}
	return nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
