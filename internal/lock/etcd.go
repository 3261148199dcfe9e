package lock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Etcd keeps locks in etcd. Each acquisition opens a session (a lease the
// client keeps alive); the lock is held by the session whose lease the
// lock's "owner" key is bound to, put only if absent, so a try-once Obtain
// is refused only while somebody holds the lock. Waiters queue with the
// client's own recipe (go.etcd.io/etcd/client/v3/concurrency): each puts a
// key bound to its lease, the lowest create revision first, and watches
// the key just before its own, so a release wakes exactly the next waiter,
// without polling. etcd is a Raft cluster: a lock survives the loss of a
// minority of its members, and a new leader never forgets it (unlike a
// Redis replica that missed the last write).
//
// The lease is what etcd keeps. It lasts whole seconds (no fewer than the
// server's minimum, about 2 s by default), the session refreshes it every
// third of that, and when it runs out etcd deletes the lock's keys and the
// next waiter has the lock: so it frees the lock of a holder that died or
// was cut off. The ttl given to Obtain and Extend is kept on the client,
// as with MySQL: when it runs out without renewal, the holder revokes its
// lease at once.
//
// Every key a call puts is bound to its lease, and a call that fails, or
// whose answer is lost (the connection closed, the leader died), revokes
// the lease, which deletes whatever the call put; if the revoke's answer
// is lost too, the lease, no longer kept alive, runs out on the server.
// So nothing a call leaves behind outlives its lease.
//
// A holder trusts its lock until the earlier of two times: its ttl, and
// the end of the lease as etcd last promised it, counted from before the
// request etcd answered (the grant, or a keepalive the holder sent itself).
// Extend cannot stretch a lease (etcd fixes its length at the grant), so
// a lock extended past its lease is kept by keepalives: while the holder
// is in touch, it confirms the lease every third of it and each answer
// moves the promise on; cut off, it stops trusting the lock (Done closes)
// before etcd can hand it on, whatever ttl it was extended to.
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

// base is the prefix of every key of the lock named key. A key may hold
// any character, "/" too: escaped, one lock's keys never fall under
// another's prefix.
func (e *Etcd) base(key string) string { return e.prefix + url.PathEscape(key) }

// The keys under a lock's base, all bound to their client's lease:
// "owner", which the holder puts only if it is absent, so that the put
// succeeds exactly when the lock is free, and the waiters' queue, the
// recipe's Mutex under "queue/".
//
// A try-once Obtain puts the owner key or is refused: it is refused only
// while a holder has the lock. (The recipe's TryLock cannot promise that:
// a try puts its key in the queue and gives up if an earlier key is there,
// which may be another try about to give up too, while nobody holds the
// lock.) Waiters keep the recipe's fair queue: each watches the key just
// before its own; the first in line puts the owner key when it can,
// watching it meanwhile, and stays in the queue until it releases, so the
// next in line wakes when the owner key goes with it. A try-once Obtain
// may take a free lock ahead of the line, as it may on every backend.
const (
	etcdOwner = "owner"
	etcdQueue = "queue"
)

// take puts the owner key, bound to s's lease, if nobody has.
func (e *Etcd) take(ctx context.Context, s *concurrency.Session, owner string) (*clientv3.TxnResponse, error) {
	return s.Client().Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(owner), "=", 0)).
		Then(clientv3.OpPut(owner, "", clientv3.WithLease(s.Lease()))).
		Commit()
}

// wait gets in line under base, and once first, takes the owner key as
// soon as it is free.
func (e *Etcd) wait(ctx context.Context, s *concurrency.Session, base string) (*clientv3.TxnResponse, error) {
	m := concurrency.NewMutex(s, base+"/"+etcdQueue)
	// The recipe's Lock, when its wait is cut short, deletes our key under
	// the client's own context, which has no deadline: against an etcd
	// that does not answer it would hold Obtain up for good. So it runs in
	// a goroutine that Obtain stops waiting for when ctx ends (the caller
	// then revokes the lease, which deletes the key).
	if _, err := orAbandon(ctx, func() (struct{}, error) { return struct{}{}, m.Lock(ctx) }, nil); err != nil {
		return nil, err
	}
	owner := base + "/" + etcdOwner
	for {
		took, err := e.take(ctx, s, owner)
		if err != nil || took.Succeeded {
			return took, err
		}
		// A try-once caller holds it: wait for its owner key to go. A
		// member cut off from the leader ends the watch, and we ask again.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		events := s.Client().Watch(wctx, owner, clientv3.WithRev(took.Header.Revision+1))
		for gone := false; !gone; {
			resp, ok := <-events
			if !ok || resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				gone = gone || ev.Type == clientv3.EventTypeDelete
			}
		}
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
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
	// The lease is granted under the caller's ctx: an etcd that does not
	// answer holds Obtain up no longer than the caller is willing to wait.
	// etcd may grant more than asked (its minimum), never less.
	start := time.Now()
	g, err := e.cli.Grant(ctx, int64(leaseSeconds(ttl)))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("lock: obtain %q: grant a lease: %w", key, err)
	}
	lease := time.Duration(g.TTL) * time.Second
	// The session keeps the lease alive for as long as the lock is held,
	// past the end of ctx. It fails only on a closed client; the lease,
	// bound to no key yet, then runs out on the server.
	s, err := concurrency.NewSession(e.cli, concurrency.WithLease(g.ID), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	base := e.base(key)
	owner := base + "/" + etcdOwner
	var took *clientv3.TxnResponse
	if o.wait {
		took, err = e.wait(ctx, s, base)
	} else {
		took, err = e.take(ctx, s, owner)
		if err == nil && !took.Succeeded {
			err = ErrNotAcquired // a holder has the lock
		}
	}
	if err != nil {
		// Revoking the lease deletes whatever this call put, if a request
		// whose answer was lost got through after all. If the revoke
		// fails too, the lease, no longer kept alive, runs out on the
		// server: nothing outlives it. A revoke may wait on an etcd that
		// does not answer, so a caller whose ctx ended does not wait.
		if ctx.Err() != nil {
			go closeSession(s)
			return nil, ctx.Err()
		}
		closeSession(s)
		if err == ErrNotAcquired {
			return nil, err
		}
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	h := &etcdHolder{s: s, owner: owner}
	promised := promise(start, lease)
	if o.wait {
		// The lock was handed over when the key before ours went; the
		// session last refreshed the lease up to a third of it before, so
		// neither the ttl nor the lease may count from the handover. A
		// keepalive confirms the lease, and both count from before it.
		start = time.Now()
		if promised, err = h.confirm(ctx); err != nil {
			go closeSession(s) // may wait on an etcd that does not answer
			switch {
			case errors.Is(err, ErrNotHeld):
				return nil, fmt.Errorf("lock: obtain %q: the lease ran out while waiting: %w", key, ErrNotAcquired)
			case ctx.Err() != nil:
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("lock: obtain %q: confirm the lease: %w", key, err)
		}
	}
	var fence int64
	if o.fencing {
		fence = took.Header.Revision // the revision that put the owner key
	}
	h.keep(start.Add(ttl), promised, lease/3, h.confirm, func() { closeSession(s) })
	lk, err := newLock(ctx, key, fence, start, ttl, h, o)
	if err != nil {
		return nil, err
	}
	h.attach(lk.(*handle))
	return lk, nil
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
	owner     string // the lock's owner key
}

// confirm refreshes the lease once and returns how long etcd now keeps it:
// the ttl the lease reports, from before the request. A lease etcd no
// longer knows is ErrNotHeld: it ran out, and took the lock's key along.
func (h *etcdHolder) confirm(ctx context.Context) (time.Time, error) {
	sent := time.Now()
	resp, err := h.s.Client().KeepAliveOnce(ctx, h.s.Lease())
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return time.Time{}, ErrNotHeld
	case err != nil:
		return time.Time{}, err
	case resp.TTL <= 0:
		return time.Time{}, ErrNotHeld
	}
	return promise(sent, time.Duration(resp.TTL)*time.Second), nil
}

// held reports whether the lock's owner key is still bound to this
// session's lease: it is gone if the lease expired, or somebody deleted it.
func (h *etcdHolder) held(ctx context.Context) (bool, error) {
	select {
	case <-h.s.Done():
		return false, nil // the lease is no longer kept alive
	default:
	}
	resp, err := h.s.Client().Get(ctx, h.owner)
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) == h.s.Lease(), nil
}

// extend refreshes the lease, then checks the key: a lease can outlive
// its key, which an operator may have deleted.
func (h *etcdHolder) extend(ctx context.Context, ttl time.Duration) error {
	if !h.live() {
		return ErrNotHeld
	}
	sent := time.Now()
	promised, err := h.confirm(ctx)
	if err == nil {
		var ok bool
		if ok, err = h.held(ctx); err == nil && !ok {
			err = ErrNotHeld
		}
	}
	return h.renew(sent, ttl, promised, err)
}

func (h *etcdHolder) release(ctx context.Context) error {
	if !h.live() {
		return ErrNotHeld
	}
	ok, err := h.held(ctx)
	if !h.released() {
		return ErrNotHeld // its deadline passed meanwhile, and ended it
	}
	closeSession(h.s) // revoking the lease deletes the key: the next waiter wakes
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotHeld
	}
	return nil
}
