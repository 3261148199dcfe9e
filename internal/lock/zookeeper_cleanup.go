package lock

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// This file is ZooKeeper's cleanup (see zookeeper.go): what a call that
// failed, or gave up, or whose answer was lost, leaves under a lock's
// directory is searched for by its token and removed, until it is gone or
// its session has ended.

// giveUp removes what token made under dir, for a call that failed or gave
// up: its place in the queue and, with owner, the lock itself if it got it.
// A request whose answer was lost (the connection closed, the leader died)
// may have been carried out, and an ephemeral node has no ttl: it would
// stay as long as the session, which the other locks of this connection
// keep alive, and block the key for good. So giveUp looks for the nodes by
// the token in their names, again and again, until it has removed them or
// they are gone with the session. It waits for that until ctx ends or a
// session timeout has passed, then goes on in the background, so that a
// caller is never held up for long by an ensemble that does not answer.
func (z *ZooKeeper) giveUp(ctx context.Context, dir, token string, session int64, owner bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		z.remove(dir, token, session, owner)
	}()
	t := time.NewTimer(z.session)
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// remove is giveUp's loop. It stops when the nodes are gone, when the
// session that made them has ended (the ensemble removed them), or when
// the connection was closed (which ends the session too).
func (z *ZooKeeper) remove(dir, token string, session int64, owner bool) {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if z.conn.SessionID() != session {
			return
		}
		err := z.removeOnce(dir, token, owner)
		if err == nil || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrClosing) || !z.pause(wait) {
			return
		}
	}
}

// pause waits for d, and reports false if the connection was closed
// meanwhile. A closed connection is "disconnected" for good; one being
// re-established is "connecting", and disconnected only for a moment.
func (z *ZooKeeper) pause(d time.Duration) bool {
	const look = 20 * time.Millisecond
	disconnected := 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(look) {
		if z.conn.State() != zk.StateDisconnected {
			disconnected = 0
		} else if disconnected++; disconnected == 5 {
			return false
		}
	}
	return true
}

// removeOnce deletes token's queue nodes and, with owner, its hold on the
// lock. Sync first: the server answering may have reconnected us after
// the create it must find, and lag behind it.
func (z *ZooKeeper) removeOnce(dir, token string, owner bool) error {
	if _, err := z.conn.Sync(dir); err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return nil // no directory: nothing was made
		}
		return err
	}
	children, _, err := z.conn.Children(dir)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, c := range children {
		mine := strings.HasPrefix(c, zkQueueNode+token+"-")
		if owner && c == zkHolderNode+token {
			err = zkRelease(z.conn, dir, token)
		} else if mine {
			err = z.conn.Delete(dir+"/"+c, -1)
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
	}
	return nil
}

// zkRelease deletes token's holder node and the owner node in one
// transaction, which fails, deleting neither, if the holder node is gone:
// then the owner node is some later holder's.
func zkRelease(conn *zk.Conn, dir, token string) error {
	_, err := conn.Multi(
		&zk.DeleteRequest{Path: dir + "/" + zkHolderNode + token, Version: -1},
		&zk.DeleteRequest{Path: dir + "/" + zkOwnerNode, Version: -1},
	)
	return err
}
