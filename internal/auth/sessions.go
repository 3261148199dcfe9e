package auth

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
)

// Logging out everywhere. A JWT cannot be taken back: whoever holds one
// is its user until it expires. So a user who ends their sessions (POST
// /auth/logout: a lost phone, a shared computer) writes one number to
// Redis, the second from which their tokens count; a token issued before
// it is void. Asking Redis that on every request, or on every token's
// first use, would cost the buy path a round trip it has never had. So
// the logout also goes into a stream, and each instance keeps the streams'
// last day in memory (logouts, below): at most once every Refresh, the
// first request that finds the memory older reads what the stream added
// since, in one command. Checking a token is then a map lookup. A logout
// reaches every instance within Refresh (plus the moment a request takes
// to come).

const (
	// MaxTTL is the longest a token may live (TOKEN_TTL). A stolen token
	// is worth something until it expires, and the second from which a
	// user's tokens count must be kept in Redis that long after a logout.
	MaxTTL = 24 * time.Hour

	// Refresh bounds how long after a logout everywhere a token issued
	// before it still passes: each instance reads the logouts made since
	// its last read at most this often, one command whatever the number
	// of tokens, and sooner than anyone who logs out on one device
	// reaches for another.
	Refresh = time.Second

	// staleAfter: an instance that could not read the logouts for this
	// long answers unavailable rather than let a voided token through.
	staleAfter = 5 * Refresh
)

var (
	//go:embed end_sessions.lua
	endSessionsSrc    string
	endSessionsScript = redis.NewScript(endSessionsSrc)
)

// sessionsKey is where the second from which user's tokens count is
// kept: one key per user who ever logged out everywhere, gone once every
// token it voids has expired. logoutsKey is the stream of logouts. The
// braces put both in one Redis Cluster slot: end_sessions.lua writes both.
func sessionsKey(user int64) string {
	return "login:{logouts}:user:" + strconv.FormatInt(user, 10)
}

const logoutsKey = "login:{logouts}"

// EndSessions voids every token of user issued until now, on every
// instance within Refresh. Tokens issued from then on work.
func (t *Tokens) EndSessions(ctx context.Context, user int64) error {
	if t.rdb == nil {
		return errors.New("end sessions: no Redis to keep them in")
	}
	err := endSessionsScript.Run(ctx, t.rdb, []string{sessionsKey(user), logoutsKey}, user, t.now().Unix(), int64(MaxTTL/time.Second)).Err()
	if err != nil {
		return apperr.Down(fmt.Errorf("end sessions of user %d: %w", user, err))
	}
	return nil
}

// voidBefore returns the second (Unix) before which user's tokens are
// void; 0 if they never logged out everywhere (or so long ago that every
// token then issued has expired). It asks Redis: for a login (Issue),
// which must not sign a token that a logout a moment ago on another
// instance voids.
func (t *Tokens) voidBefore(ctx context.Context, user int64) (int64, error) {
	n, err := t.rdb.Get(ctx, sessionsKey(user)).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, apperr.Down(fmt.Errorf("read sessions of user %d: %w", user, err))
	}
	return n, nil
}

// logouts is an instance's memory of the logouts of the last day: user ->
// the second from which their tokens count, as the stream of logouts
// (logoutsKey) says, read up to last.
type logouts struct {
	mu    sync.RWMutex
	from  map[int64]int64
	last  string // the stream entry read up to ("0": none yet)
	fresh int64  // Unix nanoseconds of the last read (0: never read)

	reading sync.Mutex // one read at a time
}

// voidBefore returns the second before which user's tokens are void (0:
// none), from memory, after reading the stream if the memory is older
// than Refresh. A read that fails is answered unavailable only once the
// memory is older than staleAfter: a moment of Redis trouble costs the
// requests nothing, a long one does not let a voided token through.
func (l *logouts) voidBefore(ctx context.Context, rdb redis.UniversalClient, user, now int64) (int64, error) {
	l.mu.RLock()
	fresh, from := l.fresh, l.from[user]
	l.mu.RUnlock()
	if now-fresh < int64(Refresh) {
		return from, nil
	}
	if err := l.read(ctx, rdb, now); err != nil {
		if now-fresh >= int64(staleAfter) {
			return 0, err
		}
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.from[user], nil
}

// read adds to memory what the stream added since the last read: by one
// request, while the others go on with the memory they have (or, if it is
// older than staleAfter, wait for this read).
func (l *logouts) read(ctx context.Context, rdb redis.UniversalClient, now int64) error {
	if !l.reading.TryLock() {
		l.mu.RLock()
		stale := now-l.fresh >= int64(staleAfter)
		l.mu.RUnlock()
		if !stale {
			return nil
		}
		l.reading.Lock()
	}
	defer l.reading.Unlock()
	l.mu.RLock()
	last, done := l.last, now-l.fresh < int64(Refresh)
	l.mu.RUnlock()
	if done { // another request read meanwhile
		return nil
	}
	if last == "" {
		last = "0"
	}
	add := map[int64]int64{}
	for {
		streams, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{logoutsKey, last}, Count: 1000, Block: -1}).Result()
		if errors.Is(err, redis.Nil) { // no stream (no logout in a day), or nothing new
			break
		}
		if err != nil {
			return apperr.Down(fmt.Errorf("read the logouts: %w", err))
		}
		entries := streams[0].Messages
		for _, e := range entries {
			last = e.ID
			u, _ := strconv.ParseInt(fmt.Sprint(e.Values["user"]), 10, 64)
			f, _ := strconv.ParseInt(fmt.Sprint(e.Values["from"]), 10, 64)
			add[u] = max(add[u], f)
		}
		if len(entries) < 1000 {
			break
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.from == nil {
		l.from = map[int64]int64{}
	}
	for u, f := range add {
		l.from[u] = max(l.from[u], f)
	}
	// Forget what no token can outlive: the memory stays a day's worth.
	oldest := time.Unix(0, now).Add(-MaxTTL).Unix()
	for u, f := range l.from {
		if f < oldest {
			delete(l.from, u)
		}
	}
	l.last, l.fresh = last, now
	return nil
}
