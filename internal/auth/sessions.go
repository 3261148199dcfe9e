package auth

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
)

// Logging out everywhere. A JWT cannot be taken back: whoever holds one
// is its user until it expires. So a user who ends their sessions (POST
// /auth/logout: a lost phone, a shared computer) writes one number to
// Redis, the second from which their tokens count; a token issued before
// it is void. Checking that on every request would cost the buy path a
// round trip to Redis; instead each instance reads it when it first
// verifies a token, and again at most every Recheck while the token is
// used (the cache of verified tokens, token.go). Between two checks, a
// token voided meanwhile still passes: Recheck is how long a logout may
// take to reach every instance.

const (
	// MaxTTL is the longest a token may live (TOKEN_TTL). A stolen token
	// is worth something until it expires, and the second from which a
	// user's tokens count must be kept in Redis that long after a logout.
	MaxTTL = 24 * time.Hour

	// Recheck bounds how long after a logout everywhere a token issued
	// before it still passes on an instance that had verified it: at
	// most one GET per token and instance every 5 seconds, whatever the
	// token's requests, which a buyer pressing at SECKILL_RATE (10 a
	// second) sends some fifty of; and sooner than anyone who logs out
	// on one device reaches for another.
	Recheck = 5 * time.Second
)

var (
	//go:embed end_sessions.lua
	endSessionsSrc    string
	endSessionsScript = redis.NewScript(endSessionsSrc)
)

// sessionsKey is where the second from which user's tokens count is
// kept: one key per user who ever logged out everywhere, gone once every
// token it voids has expired.
func sessionsKey(user int64) string {
	return "login:user:" + strconv.FormatInt(user, 10) + ":sessions_from"
}

// EndSessions voids every token of user issued until now, on every
// instance within Recheck. Tokens issued from then on work.
func (t *Tokens) EndSessions(ctx context.Context, user int64) error {
	if t.rdb == nil {
		return errors.New("end sessions: no Redis to keep them in")
	}
	err := endSessionsScript.Run(ctx, t.rdb, []string{sessionsKey(user)}, t.now().Unix(), int64(MaxTTL/time.Second)).Err()
	if err != nil {
		return apperr.Down(fmt.Errorf("end sessions of user %d: %w", user, err))
	}
	return nil
}

// voidBefore returns the second (Unix) before which user's tokens are
// void; 0 if they never logged out everywhere (or so long ago that every
// token then issued has expired).
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
