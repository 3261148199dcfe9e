package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Semaphore lets up to size holders at once, or rather size permits: a
// holder may take several. Where a lock admits one request to a resource, a
// semaphore admits a few, for example at most 50 concurrent calls to a
// payment provider across every instance of the service.
//
// Each acquisition owns its permits, as a lock owns itself: it has a random
// token, only its holder can release or renew them, and it holds them for a
// lease. A holder that dies stops renewing, and its permits come back when
// the lease ends. A plain counter, or Redisson's RSemaphore, would keep them
// taken forever: every crash would shrink the semaphore by what the crashed
// holder had, until nobody got in. The acquisition is a [Lock]: Release
// gives the permits back, Extend and WithWatchdog renew the lease, and Done
// and Context tell the holder that its lease ended without renewal.
//
// Every client of one semaphore must give the same size: the size is not
// stored, so that a semaphore needs no setup. What Redis stores expires with
// the last lease.
type Semaphore struct {
	r    *Redis
	name string
	size int
	keys semaphoreKeys
}

// semaphoreKeys names what Redis stores for a semaphore. The hash tag puts
// both keys in one Redis Cluster slot, since every script touches both.
type semaphoreKeys struct {
	leases   string // sorted set: holder token -> end of its lease (Redis clock, ms)
	counts   string // hash: holder token -> permits held
	released string // pub/sub channel announcing each permit given back
}

func semaphoreKeysFor(name string) semaphoreKeys {
	base := "{semaphore:" + name + "}"
	return semaphoreKeys{leases: base, counts: base + ":counts", released: base + ":released"}
}

// Semaphore returns the semaphore called name, with size permits.
func (r *Redis) Semaphore(name string, size int) *Semaphore {
	return &Semaphore{r: r, name: name, size: size, keys: semaphoreKeysFor(name)}
}

// Acquire takes n permits for lease. By default it tries once and returns
// ErrNotAcquired if fewer than n are free; with Wait it waits until ctx is
// done, woken when permits are given back and, since a dead holder's
// permits come back silently, when the earliest lease ends. WithWatchdog
// renews the lease while the permits are held. WithOwner and WithFencing
// are not supported (ErrUnsupported).
//
// The returned Lock's Key is the semaphore's name. Its lease is counted
// from before the request, like a lock's ttl, and Done closes when it ends
// without renewal: from then on the permits may be someone else's.
func (s *Semaphore) Acquire(ctx context.Context, n int, lease time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(lease); err != nil {
		return nil, err
	}
	if n < 1 || n > s.size {
		return nil, fmt.Errorf("lock: acquire %d permits of semaphore %q of size %d: out of range", n, s.name, s.size)
	}
	o := collect(opts)
	if o.owner != "" || o.fencing {
		return nil, fmt.Errorf("lock: acquire semaphore %q: owner or fencing: %w", s.name, ErrUnsupported)
	}
	h := &semaphoreHolder{rdb: s.r.rdb, keys: s.keys, token: newToken()}
	var start time.Time
	err := s.r.retry(ctx, "acquire semaphore", s.name, s.keys.released, o.wait,
		func(ctx context.Context) (bool, time.Duration, error) {
			start = time.Now()
			res, err := semAcquireScript.Run(ctx, s.r.rdb,
				[]string{s.keys.leases, s.keys.counts},
				h.token, n, s.size, millis(lease),
			).Int64Slice()
			switch {
			case err != nil:
				return false, 0, err
			case len(res) != 2:
				return false, 0, fmt.Errorf("acquire script returned %v", res)
			case res[0] == obtainAcquired:
				return true, 0, nil
			case res[0] == obtainTaken:
				return false, time.Duration(res[1]) * time.Millisecond, nil
			}
			return false, 0, fmt.Errorf("acquire script returned code %d", res[0])
		})
	if err != nil {
		return nil, err
	}
	return newLock(ctx, s.name, 0, start, lease, h, o)
}

// semaphoreHolder is one acquisition of permits.
type semaphoreHolder struct {
	rdb   redis.UniversalClient
	keys  semaphoreKeys
	token string
}

func (h *semaphoreHolder) extend(ctx context.Context, lease time.Duration) error {
	code, err := semExtendScript.Run(ctx, h.rdb, []string{h.keys.leases, h.keys.counts}, h.token, millis(lease)).Int64()
	return scriptOutcome("extend", code, err, extendNotHeld, extendExtended)
}

func (h *semaphoreHolder) release(ctx context.Context) error {
	code, err := semReleaseScript.Run(ctx, h.rdb, []string{h.keys.leases, h.keys.counts}, h.token, h.keys.released).Int64()
	return scriptOutcome("release", code, err, releaseNotHeld, releaseReleased)
}

// scriptOutcome turns the answer of an extend or release script into what
// a holder returns: nil for ok, ErrNotHeld for notHeld, else an error.
func scriptOutcome(script string, code int64, err error, notHeld, ok int64) error {
	switch {
	case err != nil:
		return err
	case code == notHeld:
		return ErrNotHeld
	case code != ok:
		return fmt.Errorf("%s script returned code %d", script, code)
	}
	return nil
}
