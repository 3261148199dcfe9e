package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Etcd keeps locks in etcd with the client's own recipe
// (go.etcd.io/etcd/client/v3/concurrency): each acquisition opens a session
// (a lease the client keeps alive) and puts a key under the lock's prefix
// bound to that lease; the lock belongs to the key with the lowest create
// revision, and a waiter watches the key just before its own, so a release
// wakes exactly the next waiter, without polling. etcd is a Raft cluster:
// a lock survives the loss of a minority of its members, and a new leader
// never forgets it (unlike a Redis replica that missed the last write).
//
// The lease is etcd's ttl, in whole seconds (and no shorter than the
// server's minimum, about 2 s by default): it frees the lock of a holder
// that died or was cut off. The ttl given to Obtain is kept on the client,
// as with MySQL: when it runs out without renewal, the holder revokes its
// lease at once. So a live holder's lock ends at its ttl, and a dead
// holder's when its lease expires, a second or two later.
//
// Fencing is supported: the token is the etcd revision at which the lock
// was granted, which only grows, so a later holder's token is always
// larger. It does not support WithOwner (ErrUnsupported).
type Etcd struct {
	cli    *clientv3.Client
	prefix string
}

var _ Locker = (*Etcd)(nil)

// NewEtcd returns a backend taking locks on cli, under keys beginning with
// "/seckill/locks/".
func NewEtcd(cli *clientv3.Client) *Etcd {
	return &Etcd{cli: cli, prefix: "/seckill/locks/"}
}

// leaseSeconds is the lease's time to live for a lock of ttl: whole
// seconds, at least one.
func leaseSeconds(ttl time.Duration) int {
	return max(int((ttl+time.Second-1)/time.Second), 1)
}

// Obtain acquires the lock named key for ttl. See Locker.
func (e *Etcd) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	if o.owner != "" {
		return nil, fmt.Errorf("lock: obtain %q: reentrancy on etcd: %w", key, ErrUnsupported)
	}
	start := time.Now()
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(leaseSeconds(ttl)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	m := concurrency.NewMutex(s, e.prefix+key)
	if o.wait {
		err = m.Lock(ctx)
	} else {
		err = m.TryLock(ctx)
	}
	if err != nil {
		// Revoking the lease deletes our key, if the request that made it
		// got through after all.
		closeSession(s)
		switch {
		case errors.Is(err, concurrency.ErrLocked):
			return nil, ErrNotAcquired
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	if o.wait {
		// The session kept the lease alive while this waited, so the
		// lock's time counts from now, when it was handed over, as long
		// as the session still lives.
		start = time.Now()
		select {
		case <-s.Done():
			closeSession(s)
			return nil, fmt.Errorf("lock: obtain %q: the session ended while waiting: %w", key, ErrNotAcquired)
		default:
		}
	}
	var fence int64
	if o.fencing {
		fence = m.Header().Revision
	}
	h := &etcdHolder{s: s, m: m}
	h.keep(start.Add(ttl), func() { closeSession(s) })
	return newLock(ctx, key, fence, start, ttl, h, o)
}

// closeSession revokes the session's lease, which deletes the keys bound
// to it, within releaseTimeout.
func closeSession(s *concurrency.Session) {
	s.Orphan() // stop keeping the lease alive
	if s.Client().Ctx().Err() != nil {
		return // the client was closed: the lease runs out on the server
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, _ = s.Client().Revoke(ctx, s.Lease())
}

// etcdHolder is one lock held through one session.
type etcdHolder struct {
	clientTTL // ends by revoking the session's lease
	s         *concurrency.Session
	m         *concurrency.Mutex
}

// held reports whether the lock's key still exists under this session's
// lease: it is gone if the lease expired, or somebody deleted it.
func (h *etcdHolder) held(ctx context.Context) (bool, error) {
	select {
	case <-h.s.Done():
		return false, nil // the lease is no longer kept alive
	default:
	}
	resp, err := h.s.Client().Get(ctx, h.m.Key())
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) == h.s.Lease(), nil
}

func (h *etcdHolder) extend(ctx context.Context, ttl time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return ErrNotHeld
	}
	ok, err := h.held(ctx)
	if err != nil {
		return err
	}
	if !ok {
		h.end()
		return ErrNotHeld
	}
	h.renewed(ttl)
	return nil
}

func (h *etcdHolder) release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return ErrNotHeld
	}
	ok, err := h.held(ctx)
	h.end() // revoking the lease deletes the key: the next waiter wakes
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotHeld
	}
	return nil
}
