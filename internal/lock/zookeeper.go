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

// ZooKeeper keeps locks in ZooKeeper with its classic recipe: each
// acquisition creates an ephemeral sequential node under the lock's
// directory; the lock belongs to the node with the lowest sequence number,
// and a waiter watches the node just before its own, so a release (or the
// death of its session) wakes exactly the next waiter, without polling and
// without a herd. ZooKeeper is a replicated ensemble: a lock survives the
// loss of a minority of its servers.
//
// An ephemeral node lives as long as the session of the client that made
// it: if the holder's process dies or is cut off, the ensemble deletes its
// nodes when the session times out (the session timeout given to
// zk.Connect, which the server bounds to 2 to 20 of its ticks). The ttl
// given to Obtain is kept on the client, as with MySQL and etcd: when it
// runs out without renewal, the holder deletes its node.
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
// node, which only grows across the ensemble. It does not support
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

// create makes our node under dir. It is protected: if the reply is lost,
// the client finds its node by the GUID in its name instead of leaving an
// orphan in the queue. The directory is made only when missing (each
// create is a round trip and a write to the ensemble's log): the first time
// a key is used, and again after the ensemble removed it, empty, which may
// even happen between ensure and the create that follows.
func (z *ZooKeeper) create(dir string) (string, error) {
	for attempt := 1; ; attempt++ {
		path, err := z.conn.CreateProtectedEphemeralSequential(dir+"/lock-", nil, z.acl)
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
	// The zk client's calls take no context, and give up only when the
	// connection is found dead, two thirds of the session timeout later.
	// So the acquisition runs in a goroutine that Obtain stops waiting for
	// when ctx ends; a node it makes after that is deleted.
	a, err := orAbandon(ctx, func() (zkAcquired, error) { return z.acquire(ctx, key, o) },
		func(a zkAcquired) { _ = z.conn.Delete(a.path, -1) })
	if err != nil {
		if !errors.Is(err, ErrNotAcquired) && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	start := a.confirmed
	h := &zkHolder{conn: z.conn, path: a.path, session: a.session, timeout: z.session}
	h.keep(start.Add(ttl), promise(start, z.session), z.session/3, h.confirm, func() { _ = z.conn.Delete(a.path, -1) })
	lk, err := newLock(ctx, key, a.fence, start, ttl, h, o)
	if err != nil {
		return nil, err
	}
	h.attach(lk.(*handle))
	return lk, nil
}

// zkAcquired is what acquire took: the lock's node, the session that owns
// it, when the request that last confirmed the node was sent, and the
// fencing token.
type zkAcquired struct {
	path      string
	session   int64
	confirmed time.Time
	fence     int64
}

// acquire creates our node and, if it is not the lowest, gives up or
// waits until it is.
func (z *ZooKeeper) acquire(ctx context.Context, key string, o options) (zkAcquired, error) {
	dir := z.dir(key)
	sent := time.Now()
	path, err := z.create(dir)
	if err != nil {
		return zkAcquired{}, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	a := zkAcquired{path: path, session: z.conn.SessionID(), confirmed: sent}
	mine := path[strings.LastIndex(path, "/")+1:]
	giveUp := func(err error) (zkAcquired, error) {
		_ = z.conn.Delete(path, -1)
		return zkAcquired{}, err
	}
	for {
		children, _, err := z.conn.Children(dir)
		if err != nil {
			return giveUp(fmt.Errorf("lock: obtain %q: %w", key, err))
		}
		sort.Slice(children, func(i, j int) bool { return seq(children[i]) < seq(children[j]) })
		i := sort.Search(len(children), func(i int) bool { return seq(children[i]) >= seq(mine) })
		if i == len(children) || children[i] != mine {
			// Our node is gone: the session expired meanwhile.
			return zkAcquired{}, fmt.Errorf("lock: obtain %q: the session ended while waiting: %w", key, ErrNotAcquired)
		}
		if i == 0 {
			break // the lowest: ours
		}
		if !o.wait {
			return giveUp(ErrNotAcquired)
		}
		// Watch the node just before ours, not the holder's: each waiter
		// is woken by one deletion only.
		exists, _, ch, err := z.conn.ExistsW(dir + "/" + children[i-1])
		if err != nil {
			return giveUp(fmt.Errorf("lock: obtain %q: %w", key, err))
		}
		if !exists {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return giveUp(ctx.Err())
		}
	}
	if o.wait || o.fencing {
		// A waiter learned of the handover from the server it talks to,
		// perhaps a follower behind the leader, and its session was last
		// confirmed before it waited: it confirms its node now, and the
		// lock's time counts from before that. The answer holds the zxid
		// that created the node, the fencing token.
		sent := time.Now()
		ok, stat, err := zkHeld(z.conn, path)
		switch {
		case err != nil:
			return giveUp(fmt.Errorf("lock: obtain %q: confirm its node: %w", key, err))
		case !ok:
			return zkAcquired{}, fmt.Errorf("lock: obtain %q: the session ended while waiting: %w", key, ErrNotAcquired)
		}
		if o.wait {
			a.confirmed = sent
		}
		if o.fencing {
			a.fence = stat.Czxid
		}
	}
	return a, nil
}

// zkHolder is one lock held by one node.
type zkHolder struct {
	clientTTL // ends by deleting the node
	conn      *zk.Conn
	path      string
	session   int64         // the session that owns the node
	timeout   time.Duration // the session's
}

// confirm checks that the node still exists and returns how long the
// ensemble now keeps the session: its timeout, from before the request.
func (h *zkHolder) confirm(ctx context.Context) (time.Time, error) {
	if h.conn.SessionID() != h.session {
		// The session expired, and the client opened a new one: the
		// ensemble deleted the old one's nodes.
		return time.Time{}, ErrNotHeld
	}
	sent := time.Now()
	ok, err := orAbandon(ctx, func() (bool, error) {
		ok, _, err := zkHeld(h.conn, h.path)
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

func (h *zkHolder) release(ctx context.Context) error {
	if !h.released() {
		return ErrNotHeld
	}
	// Deleted here rather than by drop, to tell a node already gone.
	_, err := orAbandon(ctx, func() (struct{}, error) { return struct{}{}, h.conn.Delete(h.path, -1) }, nil)
	switch {
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired):
		return ErrNotHeld
	case err != nil:
		return err
	}
	return nil
}
