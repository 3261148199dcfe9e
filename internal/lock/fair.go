package lock

import (
	"context"
	"fmt"
	"time"
)

// Fair is a Locker whose locks go to waiters in the order they arrived.
// The plain lock lets whoever asks first after a release win: a waiter can
// lose every race to newcomers and wait far longer than its turn. A fair
// lock keeps a line, as Redisson's RFairLock does: the lock goes to the
// first in line, a newcomer gets it only when nobody waits, and a release
// wakes just the first in line.
//
// A waiter that dies must not hold up the line. Each try pushes the
// waiter's time in line three polls ahead; a waiter that stops trying for
// that long is removed by whoever looks next. A waiter that gives up (its
// ctx ends) leaves the line at once.
//
// Fair locks are apart from the plain locks of the same name. Everything
// else is as for [Redis.Obtain]: reentrancy (WithOwner; an owner entering
// again does not queue behind the others, who wait for it), fencing, the
// watchdog, Done and Context.
type Fair struct {
	r *Redis
}

var _ Locker = (*Fair)(nil)

// fairKeys names what Redis stores for the fair lock called key. The hash
// tag puts them all in one Redis Cluster slot, as the scripts need.
type fairKeys struct {
	lock   string // the lock, as for the plain lock: a token, or owner -> depth
	queue  string // list: waiting holders in order of arrival
	alive  string // sorted set: waiting holder -> end of its time in line (Redis clock, ms)
	fence  string // the fencing-token counter
	wakeup string // channel prefix: waiter h is woken on wakeup + h
}

func fairKeysFor(key string) fairKeys {
	base := "{fairlock:" + key + "}"
	return fairKeys{lock: base, queue: base + ":queue", alive: base + ":alive",
		fence: base + ":fence", wakeup: base + ":next:"}
}

// Fair returns the fair-lock backend on the same Redis.
func (r *Redis) Fair() *Fair {
	return &Fair{r: r}
}

// Obtain acquires the fair lock named key for ttl. See Locker. With Wait,
// the caller gets in line and is woken when its turn comes.
func (f *Fair) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	k := fairKeysFor(key)
	h := &fairHolder{
		redisHolder: redisHolder{rdb: f.r.rdb, keys: keys{lock: k.lock}, token: o.owner, reentrant: o.owner != ""},
		fk:          k,
	}
	if !h.reentrant {
		h.token = newToken()
	}
	// A waiter's time in line must outlast the gaps between its tries,
	// which the poll bounds (pollDelay: at most 9/8 of maxPoll).
	var patience int64
	if o.wait {
		patience = millis(3 * f.r.maxPoll)
	}
	var start time.Time
	var fence int64
	err := f.r.retry(ctx, "obtain fair lock", key, k.wakeup+h.token, o.wait,
		func(ctx context.Context) (bool, time.Duration, error) {
			start = time.Now()
			res, err := fairObtainScript.Run(ctx, f.r.rdb,
				[]string{k.lock, k.queue, k.alive, k.fence},
				h.token, millis(ttl), flag(h.reentrant), flag(o.fencing), patience, k.wakeup,
			).Int64Slice()
			switch {
			case err != nil:
				return false, 0, err
			case len(res) != 2:
				return false, 0, fmt.Errorf("obtain script returned %v", res)
			case res[0] == obtainAcquired || res[0] == obtainReentered:
				fence = res[1]
				return true, 0, nil
			case res[0] == obtainTaken:
				return false, time.Duration(res[1]) * time.Millisecond, nil
			}
			return false, 0, fmt.Errorf("obtain script returned code %d", res[0])
		})
	if err != nil {
		if o.wait {
			// Gave up: leave the line now, so the next one need not wait
			// for this place to time out. If this fails, it times out.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			_ = h.run(lctx, "leave")
			cancel()
		}
		return nil, err
	}
	return newLock(ctx, key, fence, start, ttl, h, o)
}

// fairHolder is one acquisition of a fair lock. The lock itself is stored
// as the plain lock is, so extending it is the plain lock's extend.lua;
// releasing it must wake the first in line, so that is a script of its own.
type fairHolder struct {
	redisHolder
	fk fairKeys
}

func (h *fairHolder) release(ctx context.Context) error {
	return h.run(ctx, "")
}

// run releases the lock, or with "leave" gives up the holder's place in line.
func (h *fairHolder) run(ctx context.Context, leave string) error {
	code, err := fairReleaseScript.Run(ctx, h.rdb, []string{h.fk.lock, h.fk.queue, h.fk.alive},
		h.token, h.fk.wakeup, leave).Int64()
	if code == releaseEntered {
		code = releaseReleased
	}
	return scriptOutcome("release", code, err, releaseNotHeld, releaseReleased)
}
