package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// RWLock is a read-write lock: many readers at once, or one writer. Use it
// where reads are many and may run side by side, but a write must run
// alone and no read may see it half done: for example reloading a
// voucher's stock into Redis (write) while orders read it.
//
// A waiting writer is not starved by a stream of readers: once a writer
// waits, new readers wait behind it, the current ones finish, and the
// writer goes. The price is the other way round: a steady stream of
// writers, each waiting before the last is done, keeps readers out for as
// long as it lasts. Use it where writes are rare, as a reload is. Each hold is reentrant for its owner (WithOwner), as the
// lock is: an owner may read or write again while it holds, and the
// writer may also read. A reader cannot become the writer: two readers
// trying would wait for each other forever; release the read lock first.
//
// Every reader has its own lease, so a reader that dies drops out when its
// lease ends while the others go on renewing; the writer has a ttl like a
// lock's. Each acquisition is a [Lock].
type RWLock struct {
	r    *Redis
	name string
	keys rwKeys
}

// rwKeys names what Redis stores for a read-write lock. The hash tag puts
// them all in one Redis Cluster slot, since every script touches several.
type rwKeys struct {
	writer   string // hash: the writing owner -> depth
	readers  string // sorted set: reading owner -> end of its lease (Redis clock, ms)
	depths   string // hash: reading owner -> depth
	intents  string // sorted set: waiting writer -> end of its intent (Redis clock, ms)
	released string // pub/sub channel announcing that somebody may get in
}

func rwKeysFor(name string) rwKeys {
	base := "{rwlock:" + name + "}"
	return rwKeys{
		writer:   base + ":writer",
		readers:  base + ":readers",
		depths:   base + ":depths",
		intents:  base + ":intents",
		released: base + ":released",
	}
}

func (k rwKeys) list() []string { return []string{k.writer, k.readers, k.depths, k.intents} }

// RWLock returns the read-write lock called name. It shares nothing with
// the lock of the same name that Obtain takes.
func (r *Redis) RWLock(name string) *RWLock {
	return &RWLock{r: r, name: name, keys: rwKeysFor(name)}
}

// ObtainRead takes the lock for reading, for ttl. It is refused while
// another owner writes or a writer waits. Options are those of Obtain, but
// WithFencing is not supported (ErrUnsupported).
func (l *RWLock) ObtainRead(ctx context.Context, ttl time.Duration, opts ...Option) (Lock, error) {
	return l.obtain(ctx, rwRead, ttl, opts)
}

// ObtainWrite takes the lock for writing, for ttl. It is refused while
// anybody else reads or writes. Waiting (Wait), it keeps new readers out
// until it gets the lock or gives up. Options are those of Obtain, but
// WithFencing is not supported (ErrUnsupported).
func (l *RWLock) ObtainWrite(ctx context.Context, ttl time.Duration, opts ...Option) (Lock, error) {
	return l.obtain(ctx, rwWrite, ttl, opts)
}

const (
	rwRead   = "read"
	rwWrite  = "write"
	rwIntent = "intent"
)

func (l *RWLock) obtain(ctx context.Context, mode string, ttl time.Duration, opts []Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	if o.fencing {
		return nil, fmt.Errorf("lock: obtain %s lock %q: fencing: %w", mode, l.name, ErrUnsupported)
	}
	h := &rwHolder{rdb: l.r.rdb, keys: l.keys, mode: mode, owner: o.owner, reentrant: o.owner != ""}
	if !h.reentrant {
		h.owner = newToken()
	}
	// A waiting writer's intent must outlive the gaps between its tries,
	// which the poll bounds (pollDelay: at most 9/8 of maxPoll), or readers
	// would slip in between. If the writer dies, readers wait this long.
	var intent int64
	if o.wait && mode == rwWrite {
		intent = millis(3 * l.r.maxPoll)
	}
	var start time.Time
	err := l.r.retry(ctx, "obtain "+mode+" lock", l.name, l.keys.released, o.wait,
		func(ctx context.Context) (bool, time.Duration, error) {
			start = time.Now()
			res, err := rwObtainScript.Run(ctx, l.r.rdb, l.keys.list(),
				h.owner, mode, millis(ttl), flag(h.reentrant), intent,
			).Int64Slice()
			switch {
			case err != nil:
				return false, 0, err
			case len(res) != 2:
				return false, 0, fmt.Errorf("obtain script returned %v", res)
			case res[0] == obtainAcquired || res[0] == obtainReentered:
				return true, 0, nil
			case res[0] == obtainTaken:
				return false, time.Duration(res[1]) * time.Millisecond, nil
			}
			return false, 0, fmt.Errorf("obtain script returned code %d", res[0])
		})
	if err != nil {
		if intent > 0 {
			// Gave up: let the readers in now rather than when the intent
			// ends. If this fails, the intent ends by itself.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			_ = h.run(wctx, rwIntent)
			cancel()
		}
		return nil, err
	}
	return newLock(ctx, l.name, 0, start, ttl, h, o)
}

// rwHolder is one acquisition of a read-write lock.
type rwHolder struct {
	rdb       redis.UniversalClient
	keys      rwKeys
	mode      string // rwRead or rwWrite
	owner     string // WithOwner's, or a random token
	reentrant bool
}

func (h *rwHolder) extend(ctx context.Context, ttl time.Duration) error {
	code, err := rwExtendScript.Run(ctx, h.rdb, h.keys.list()[:3], h.owner, h.mode, millis(ttl), flag(h.reentrant)).Int64()
	return scriptOutcome("extend", code, err, extendNotHeld, extendExtended)
}

func (h *rwHolder) release(ctx context.Context) error {
	return h.run(ctx, h.mode)
}

// run gives up one level of the hold of mode, or the writer's intent.
func (h *rwHolder) run(ctx context.Context, mode string) error {
	code, err := rwReleaseScript.Run(ctx, h.rdb, h.keys.list(), h.owner, mode, h.keys.released).Int64()
	if code == releaseEntered {
		code = releaseReleased
	}
	return scriptOutcome("release", code, err, releaseNotHeld, releaseReleased)
}
