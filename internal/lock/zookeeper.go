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
// Fencing is supported: the token is the zxid that created the lock's
// node, which only grows across the ensemble. It does not support
// WithOwner (ErrUnsupported). All locks of one ZooKeeper share its
// connection's session: if that session expires, all of them are lost.
type ZooKeeper struct {
	conn *zk.Conn
	root string
	acl  []zk.ACL
}

var _ Locker = (*ZooKeeper)(nil)

// NewZooKeeper returns a backend taking locks on conn, under the znode
// /seckill/locks.
func NewZooKeeper(conn *zk.Conn) *ZooKeeper {
	return &ZooKeeper{conn: conn, root: "/seckill/locks", acl: zk.WorldACL(zk.PermAll)}
}

// dir is the znode under which key's nodes are made. A key may hold any
// character; a znode name may not hold "/".
func (z *ZooKeeper) dir(key string) string { return z.root + "/" + url.PathEscape(key) }

// ensure creates path and its parents, as persistent nodes.
func (z *ZooKeeper) ensure(path string) error {
	at := ""
	for _, part := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		at += "/" + part
		if _, err := z.conn.Create(at, nil, 0, z.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// seq is the sequence number ZooKeeper appended to a node's name.
func seq(name string) string { return name[max(len(name)-10, 0):] }

// Obtain acquires the lock named key for ttl. See Locker.
func (z *ZooKeeper) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	if o.owner != "" {
		return nil, fmt.Errorf("lock: obtain %q: reentrancy on ZooKeeper: %w", key, ErrUnsupported)
	}
	// The zk client's calls take no context: a caller already gone is
	// told so here, and a waiter below.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := time.Now()
	dir := z.dir(key)
	// Protected: if the reply is lost, the client finds its node by the
	// GUID in its name instead of leaving an orphan in the queue. The
	// lock's directory is made the first time only: each create is a
	// round trip and a write to the ensemble's log.
	path, err := z.conn.CreateProtectedEphemeralSequential(dir+"/lock-", nil, z.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if err = z.ensure(dir); err == nil {
			path, err = z.conn.CreateProtectedEphemeralSequential(dir+"/lock-", nil, z.acl)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	}
	mine := path[strings.LastIndex(path, "/")+1:]
	giveUp := func(err error) (Lock, error) {
		_ = z.conn.Delete(path, -1)
		return nil, err
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
			return nil, fmt.Errorf("lock: obtain %q: the session ended while waiting: %w", key, ErrNotAcquired)
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
	if o.wait {
		// The session kept our node while this waited: the lock's time
		// counts from now, when it was handed over.
		start = time.Now()
	}
	var fence int64
	if o.fencing {
		_, stat, err := z.conn.Exists(path)
		if err != nil || stat == nil {
			return giveUp(fmt.Errorf("lock: obtain %q: read its zxid: %w", key, err))
		}
		fence = stat.Czxid
	}
	h := &zkHolder{conn: z.conn, path: path}
	h.keep(start.Add(ttl), func() { _ = z.conn.Delete(path, -1) })
	return newLock(ctx, key, fence, start, ttl, h, o)
}

// zkHolder is one lock held by one node.
type zkHolder struct {
	clientTTL // ends by deleting the node
	conn      *zk.Conn
	path      string
}

// held reports whether the node still exists: it is gone if the session
// expired or somebody deleted it.
func (h *zkHolder) held() (bool, error) {
	exists, _, err := h.conn.Exists(h.path)
	return exists, err
}

func (h *zkHolder) extend(_ context.Context, ttl time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return ErrNotHeld
	}
	ok, err := h.held()
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

func (h *zkHolder) release(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return ErrNotHeld
	}
	h.ended = true // deleted here, to tell a node already gone
	h.expiry.Stop()
	switch err := h.conn.Delete(h.path, -1); {
	case errors.Is(err, zk.ErrNoNode):
		return ErrNotHeld
	case err != nil:
		return err
	}
	return nil
}
