package lock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// MySQL keeps locks in MySQL or MariaDB with GET_LOCK, for a service that
// has a database but no Redis. A named lock belongs to the session (the
// connection) that took it, and the server frees it when that session
// ends, so each lock holds a connection of its own from db's pool until
// it is released. A holder that crashes closes its connections, and its
// locks are free at once.
//
// A session lock has no ttl: it lives as long as the session. The ttl is
// kept on the client instead: when it runs out without renewal, the holder
// ends the lock's session, as Redis would expire the key. A holder paused
// past its ttl keeps the lock longer (nobody ends the session for it), and
// a holder cut off by the network keeps it until the server drops the
// session (wait_timeout, 8 hours by default): unlike a Redis key, the lock
// never expires on the server by itself.
//
// An error on the lock's connection ends its session (the connection is
// closed, not put back in the pool), and with it the lock: such a lock is
// reported lost (ErrNotHeld). It does not support WithOwner (the owner's
// handles would have to share one session) nor WithFencing
// (ErrUnsupported). Waiting polls, since a release is not announced.
type MySQL struct {
	db      *sql.DB
	maxPoll time.Duration
}

var _ Locker = (*MySQL)(nil)

// NewMySQL returns a backend taking locks on db. Each lock held, and each
// try, takes one of db's connections for as long: give it a *sql.DB of its
// own, sized for the locks held at once, not the pool the holders' own
// queries use, or thirty held locks leave those queries waiting for a
// connection that only their own release would free.
func NewMySQL(db *sql.DB) *MySQL {
	return &MySQL{db: db, maxPoll: 100 * time.Millisecond}
}

// mysqlName is the server's name for the lock called key. The server
// takes at most 64 characters, and MariaDB's manual says it compares lock
// names without regard to case ("Order:1" and "order:1" would be one lock;
// the MariaDB 10.11 of this project's tests tells them apart, so it depends
// on the server). A name is therefore kept readable only when it is short
// and has nothing a case could fold: lower-case ASCII letters, digits and
// ":_.-". Any other is replaced by its SHA-256 in hex, 64 characters,
// which has no ":" and so never equals a readable name.
func mysqlName(key string) string {
	name := "lock:" + key
	if len(name) <= 64 && strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789:_.-") == "" {
		return name
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Obtain acquires the lock named key for ttl. See Locker.
func (m *MySQL) Obtain(ctx context.Context, key string, ttl time.Duration, opts ...Option) (Lock, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	o := collect(opts)
	switch {
	case o.owner != "":
		return nil, fmt.Errorf("lock: obtain %q: reentrancy on MySQL: %w", key, ErrUnsupported)
	case o.fencing:
		return nil, fmt.Errorf("lock: obtain %q: fencing on MySQL: %w", key, ErrUnsupported)
	}
	name := mysqlName(key)
	var poll *time.Timer
	for {
		start := time.Now()
		h, err := m.try(ctx, name, ttl)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
		case h != nil:
			return newLock(ctx, key, 0, start, ttl, h, o)
		case !o.wait:
			return nil, ErrNotAcquired
		}
		d := m.maxPoll/2 + rand.N(m.maxPoll/2+1)
		if poll == nil {
			poll = time.NewTimer(d)
			defer poll.Stop()
		} else {
			poll.Reset(d)
		}
		select {
		case <-poll.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// try takes the lock once, on a connection of its own, which it keeps if
// it got the lock and puts back in the pool if not.
func (m *MySQL) try(ctx context.Context, name string, ttl time.Duration) (*mysqlHolder, error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
		// The reply may have been lost after the server granted the lock:
		// end the session, so a pooled connection never holds a lock.
		discard(conn)
		return nil, err
	}
	if got.Int64 != 1 {
		return nil, conn.Close()
	}
	h := &mysqlHolder{name: name, conn: conn, until: time.Now().Add(ttl)}
	h.mu.Lock()
	h.expiry = time.AfterFunc(ttl, h.expire)
	h.mu.Unlock()
	return h, nil
}

// discard closes conn for good instead of returning it to the pool: its
// session ends, and the server frees the locks it held.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// mysqlHolder is one lock held by one session.
type mysqlHolder struct {
	name string

	mu     sync.Mutex
	conn   *sql.Conn   // nil once the session is given back or ended; guarded by mu
	until  time.Time   // when the ttl runs out; guarded by mu
	expiry *time.Timer // fires at until; guarded by mu
}

// expire ends the lock's session when its ttl has run out without renewal.
// A renewal may have moved until while this waited for mu: then it waits on.
func (h *mysqlHolder) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Now().Before(h.until) {
		return
	}
	h.end()
}

// end closes the session for good; the caller holds mu.
func (h *mysqlHolder) end() {
	if h.conn != nil {
		discard(h.conn)
		h.conn = nil
	}
	h.expiry.Stop()
}

func (h *mysqlHolder) extend(ctx context.Context, ttl time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return ErrNotHeld
	}
	// The driver closes a connection whose query's context ends, and with
	// it the session and the lock: a renewal cut short by its caller (a
	// watchdog tick timing out, Release stopping the watchdog) must not
	// end what it meant to keep. It runs until the ttl would have run out
	// anyway, whatever ctx does.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Until(h.until))
	defer cancel()
	var mine sql.NullBool
	err := h.conn.QueryRowContext(qctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", h.name).Scan(&mine)
	if err != nil || !mine.Bool {
		h.end()
		return ErrNotHeld
	}
	h.until = time.Now().Add(ttl)
	h.expiry.Reset(ttl)
	return nil
}

func (h *mysqlHolder) release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return ErrNotHeld
	}
	h.expiry.Stop()
	var freed sql.NullInt64
	err := h.conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", h.name).Scan(&freed)
	if err != nil || freed.Int64 != 1 {
		h.end()
		return ErrNotHeld
	}
	// The session holds nothing now: it may serve others.
	_ = h.conn.Close()
	h.conn = nil
	return nil
}
