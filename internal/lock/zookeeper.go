package lock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeper keeps locks in ZooKeeper. The lock is held by whoever created
// the lock's "owner" node, a fixed name under the lock's directory: a
// create succeeds exactly when the lock is free, so a try-once Obtain is
// refused only while somebody holds it. Waiters queue with ZooKeeper's
// classic recipe: each creates an ephemeral sequential node, and watches
// the node just before its own, so a release (or the death of a session)
// wakes exactly the next waiter, without polling and without a herd; the
// first in line watches the owner node and creates it when it goes.
// ZooKeeper is a replicated ensemble: a lock survives the loss of a
// minority of its servers.
//
// An ephemeral node lives as long as the session of the client that made
// it: if the holder's process dies or is cut off, the ensemble deletes its
// nodes when the session times out (the session timeout given to
// zk.Connect, which the server bounds to 2 to 20 of its ticks). The ttl
// given to Obtain is kept on the client, as with MySQL and etcd: when it
// runs out without renewal, the holder deletes its nodes.
//
// A node has no ttl of its own, so a node nobody knows about would block
// the key for as long as the session lives, which the connection's other
// locks keep alive. Every node therefore carries the acquisition's random
// token in its name, and a create, delete or release whose answer was lost
// (the connection closed, the leader died) is followed by a search for the
// token's nodes, again and again until the connection is back and they
// are removed, or their session has ended (see giveUp).
//
// So the ensemble keeps the session, not the ttl, and a holder trusts its
// lock until the earlier of its ttl and the session timeout counted from
// before the last request the ensemble answered about the lock. While in
// touch, a holder whose ttl outlasts that confirms its node every third of
// the session timeout; cut off, it stops trusting the lock (Done closes)
// before the ensemble can expire the session and hand the lock on. A
// confirmation is Sync, then Exists: Sync makes the server the client
// talks to catch up with the leader, so a follower that lags behind cannot
// report a node the ensemble has already deleted. A session that expired
// (the client then opens a new one) ends the lock at the next
// confirmation; a holder merely disconnected keeps it until its deadline,
// as the session lives on, and may reconnect to another server and renew
// in time. go-zookeeper does not tell what timeout the server agreed to,
// so the backend must be told it: see WithSessionTimeout.
//
// A lock's directory, one per key, is a container node (ZooKeeper 3.5 and
// later), which the ensemble deletes once its last child is gone: the
// order flow takes a lock per user, and persistent directories would leave
// one znode per buyer behind, forever.
//
// Fencing is supported: the token is the zxid that created the lock's
// owner and holder nodes, which only grows across the ensemble. It does not support
// WithOwner (ErrUnsupported). All locks of one ZooKeeper share its
// connection's session: if that session expires, all of them are lost.
type ZooKeeper struct {
	conn    *zk.Conn
	root    string
	acl     []zk.ACL
	session time.Duration
}

var _ Locker = (*ZooKeeper)(nil)

// defaultSession is the session timeout NewZooKeeper assumes. A server
// grants no less than two of its ticks, and ticks are 2 s by default, so
// this is below any session of an ensemble whose tick is 500 ms or more.
// Too low a bound costs a confirmation every third of it and ends locks
// in disconnects the session would have survived; too high a one lets a
// holder trust a lock the ensemble has already handed on.
const defaultSession = time.Second

// NewZooKeeper returns a backend taking locks on conn, under the znode
// /seckill/locks, assuming its session times out after a second or more;
// WithSessionTimeout tells it the real timeout.
func NewZooKeeper(conn *zk.Conn) *ZooKeeper {
	return &ZooKeeper{conn: conn, root: "/seckill/locks", acl: zk.WorldACL(zk.PermAll), session: defaultSession}
}

// WithSessionTimeout returns a copy of z for a connection whose session
// times out after timeout: the one given to zk.Connect, or the ensemble's
// maxSessionTimeout if that is lower (the server lowers it silently).
func (z *ZooKeeper) WithSessionTimeout(timeout time.Duration) *ZooKeeper {
	c := *z
	c.session = timeout
	return &c
}

// dir is the znode under which key's nodes are made. A key may hold any
// character; a znode name may not hold "/".
func (z *ZooKeeper) dir(key string) string { return z.root + "/" + url.PathEscape(key) }

// The nodes under a lock's directory, all ephemeral. The holder is told by
// two nodes made in one transaction: "owner", whose name is the same for
// every holder, so that its create succeeds exactly when the lock is free,
// and "holder-<token>", which names the holder, so that a Release, a
// confirmation or a cleanup can tell its own lock from a later holder's
// (a fixed name cannot: the next holder's owner node looks the same).
// Waiters queue as "q-<token>-<sequence>" nodes.
const (
	zkOwnerNode  = "owner"
	zkHolderNode = "holder-"
	zkQueueNode  = "q-"
)

// A try-once Obtain creates the owner node or is refused: it is refused
// only while a holder has the lock. (The recipe's queue alone cannot
// promise that: a try that is about to give up sits in the queue, and
// another try behind it is refused while nobody holds the lock.) Waiters
// keep the recipe's fair queue: each watches the node just before its own,
// and the first in line creates the owner node when it can, watching it
// meanwhile. A try-once Obtain may take a free lock ahead of the line,
// as it may on every backend.

// take creates the owner and holder nodes for token in one transaction.
// The directory is made only when missing (each create is a round trip and
// a write to the ensemble's log): the first time a key is used, and again
// after the ensemble removed it, empty, which may even happen between
// ensure and the create that follows.
func (z *ZooKeeper) take(dir, token string) error {
	for attempt := 1; ; attempt++ {
		_, err := z.conn.Multi(
			&zk.CreateRequest{Path: dir + "/" + zkOwnerNode, Data: []byte(token), Acl: z.acl, Flags: zk.FlagEphemeral},
			&zk.CreateRequest{Path: dir + "/" + zkHolderNode + token, Acl: z.acl, Flags: zk.FlagEphemeral},
		)
		if !errors.Is(err, zk.ErrNoNode) || attempt == 3 {
			return err
		}
		if err := z.ensure(dir); err != nil {
			return err
		}
	}
}

// queue makes a waiter's node under dir. Its name carries the token, so
// that if the reply is lost the client can still find and remove it
// ("protected", as Curator calls it).
func (z *ZooKeeper) queue(dir, token string) (string, error) {
	for attempt := 1; ; attempt++ {
		path, err := z.conn.Create(dir+"/"+zkQueueNode+token+"-", nil, zk.FlagEphemeral|zk.FlagSequence, z.acl)
		if !errors.Is(err, zk.ErrNoNode) || attempt == 3 {
			return path, err
		}
		if err := z.ensure(dir); err != nil {
			return "", err
		}
	}
}

// ensure makes dir, a container node, and the root above it, persistent
// nodes, where missing.
func (z *ZooKeeper) ensure(dir string) error {
	_, err := z.conn.CreateContainer(dir, nil, zk.FlagContainer, z.acl)
	if errors.Is(err, zk.ErrNoNode) { // the first lock on this ensemble
		at := ""
		for _, part := range strings.Split(strings.TrimPrefix(z.root, "/"), "/") {
			at += "/" + part
			if _, err := z.conn.Create(at, nil, 0, z.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return err
			}
		}
		_, err = z.conn.CreateContainer(dir, nil, zk.FlagContainer, z.acl)
	}
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// seq is the sequence number ZooKeeper appended to a node's name.
func seq(name string) string { return name[max(len(name)-10, 0):] }

// zkHeld reports whether the node at path exists in the ensemble: Sync
// first, so that the server answering Exists has caught up with the
// leader. A session that expired has lost its nodes.
func zkHeld(conn *zk.Conn, path string) (bool, *zk.Stat, error) {
	_, err := conn.Sync(path)
	if err == nil {
		var ok bool
		var stat *zk.Stat
		if ok, stat, err = conn.Exists(path); err == nil {
			return ok, stat, nil
		}
	}
	if errors.Is(err, zk.ErrSessionExpired) {
		return false, nil, nil
	}
	return false, nil, err
}

// Obtain acquires the lock named key for ttl. See Locker.
func (z *ZooKeeper) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	if o.owner != "" {
		return nil, fmt.Errorf("lock: obtain %q: reentrancy on ZooKeeper: %w", key, ErrUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir, token := z.dir(key), newToken()
	// The zk client's calls take no context, and give up only when the
	// connection is found dead, two thirds of the session timeout later.
	// So the acquisition runs in a goroutine that Obtain stops waiting for
	// when ctx ends; a lock it takes after that is given back.
	a, err := orAbandon(ctx, func() (zkAcquired, error) { return z.acquire(ctx, key, dir, token, o) },
		func(a zkAcquired) { z.remove(dir, token, a.session, true) })
	if err != nil {
		if !errors.Is(err, ErrNotAcquired) && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	start := a.confirmed
	h := &zkHolder{z: z, dir: dir, token: token, session: a.session, timeout: z.session}
	h.keep(start.Add(ttl), promise(start, z.session), z.session/3, h.confirm, func() {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		z.giveUp(ctx, dir, token, a.session, true)
	})
	lk, err := newLock(ctx, key, a.fence, start, ttl, h, o)
	if err != nil {
		return nil, err
	}
	h.attach(lk.(*handle))
	return lk, nil
}

// zkAcquired is what acquire took: the session that owns its nodes, when
// the request that took the lock was sent, and the fencing token.
type zkAcquired struct {
	session   int64
	confirmed time.Time
	fence     int64
}

// acquire takes the lock for token: at once, or by waiting in line.
// Whatever way it fails, it leaves nothing behind (see giveUp).
//
// The session its nodes belong to is read after a request: a connection
// has none until it is established, and keeps its ID while it reconnects.
func (z *ZooKeeper) acquire(ctx context.Context, key, dir, token string, o options) (zkAcquired, error) {
	fail := func(owner bool, err error) (zkAcquired, error) {
		z.giveUp(ctx, dir, token, z.conn.SessionID(), owner)
		return zkAcquired{}, err
	}
	if !o.wait {
		sent := time.Now()
		err := z.take(dir, token)
		switch {
		case err == nil:
			return z.took(key, dir, token, sent, o)
		case errors.Is(err, zk.ErrNodeExists):
			return zkAcquired{}, ErrNotAcquired // a holder has the lock
		}
		return fail(true, fmt.Errorf("lock: obtain %q: %w", key, err))
	}
	path, err := z.queue(dir, token)
	if err != nil {
		return fail(false, fmt.Errorf("lock: obtain %q: %w", key, err))
	}
	session := z.conn.SessionID()
	mine := path[strings.LastIndex(path, "/")+1:]
	for {
		children, _, err := z.conn.Children(dir)
		if err != nil {
			return fail(false, fmt.Errorf("lock: obtain %q: %w", key, err))
		}
		var line []string
		for _, c := range children {
			if strings.HasPrefix(c, zkQueueNode) {
				line = append(line, c)
			}
		}
		sort.Slice(line, func(i, j int) bool { return seq(line[i]) < seq(line[j]) })
		i := sort.Search(len(line), func(i int) bool { return seq(line[i]) >= seq(mine) })
		if i == len(line) || line[i] != mine {
			// Our node is gone: the session expired meanwhile.
			return zkAcquired{}, fmt.Errorf("lock: obtain %q: the session ended while waiting: %w", key, ErrNotAcquired)
		}
		// Watch the node just before ours, not the holder's: each waiter
		// is woken by one deletion only. The first in line watches the
		// owner node.
		watch := dir + "/" + zkOwnerNode
		if i > 0 {
			watch = dir + "/" + line[i-1]
		} else {
			sent := time.Now()
			err := z.take(dir, token)
			switch {
			case err == nil:
				// Out of the line: the next waiter is first now, and
				// watches the owner node.
				if err := z.conn.Delete(path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
					go z.remove(dir, token, session, false)
				}
				return z.took(key, dir, token, sent, o)
			case !errors.Is(err, zk.ErrNodeExists):
				return fail(true, fmt.Errorf("lock: obtain %q: %w", key, err))
			}
		}
		exists, _, ch, err := z.conn.ExistsW(watch)
		if err != nil {
			return fail(false, fmt.Errorf("lock: obtain %q: %w", key, err))
		}
		if !exists {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fail(false, ctx.Err())
		}
	}
}

// took completes an acquisition whose transaction, sent at sent, made the
// lock ours. The ensemble's answer to a write confirms the session, so the
// lock's time counts from then. With fencing, the token is the zxid that
// created the holder node, which only grows across the ensemble.
func (z *ZooKeeper) took(key, dir, token string, sent time.Time, o options) (zkAcquired, error) {
	a := zkAcquired{session: z.conn.SessionID(), confirmed: sent}
	if o.fencing {
		ok, stat, err := zkHeld(z.conn, dir+"/"+zkHolderNode+token)
		switch {
		case err != nil:
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			z.giveUp(ctx, dir, token, a.session, true)
			return zkAcquired{}, fmt.Errorf("lock: obtain %q: read its fencing token: %w", key, err)
		case !ok:
			return zkAcquired{}, fmt.Errorf("lock: obtain %q: the session ended: %w", key, ErrNotAcquired)
		}
		a.fence = stat.Czxid
	}
	return a, nil
}

// zkHolder is one lock held by one holder node.
type zkHolder struct {
	clientTTL // ends by deleting the nodes
	z         *ZooKeeper
	dir       string
	token     string
	session   int64         // the session that owns the nodes
	timeout   time.Duration // the session's
}

// confirm checks that the holder node still exists and returns how long
// the ensemble now keeps the session: its timeout, from before the request.
func (h *zkHolder) confirm(ctx context.Context) (time.Time, error) {
	if h.z.conn.SessionID() != h.session {
		// The session expired, and the client opened a new one: the
		// ensemble deleted the old one's nodes.
		return time.Time{}, ErrNotHeld
	}
	sent := time.Now()
	ok, err := orAbandon(ctx, func() (bool, error) {
		ok, _, err := zkHeld(h.z.conn, h.dir+"/"+zkHolderNode+h.token)
		return ok, err
	}, nil)
	switch {
	case err != nil:
		return time.Time{}, err
	case !ok:
		return time.Time{}, ErrNotHeld
	}
	return promise(sent, h.timeout), nil
}

func (h *zkHolder) extend(ctx context.Context, ttl time.Duration) error {
	if !h.live() {
		return ErrNotHeld
	}
	sent := time.Now()
	promised, err := h.confirm(ctx)
	return h.renew(sent, ttl, promised, err)
}

// release deletes the holder and owner nodes here rather than by drop, to
// tell a lock already gone. If the answer is lost, the nodes may be there
// still: giveUp looks for them until it has removed them.
func (h *zkHolder) release(ctx context.Context) error {
	if !h.released() {
		return ErrNotHeld
	}
	if h.z.conn.SessionID() != h.session {
		return ErrNotHeld // the session expired, and its nodes with it
	}
	_, err := orAbandon(ctx, func() (struct{}, error) { return struct{}{}, zkRelease(h.z.conn, h.dir, h.token) }, nil)
	switch {
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired):
		return ErrNotHeld
	case err != nil:
		h.z.giveUp(ctx, h.dir, h.token, h.session, true)
		return err
	}
	return nil
}
