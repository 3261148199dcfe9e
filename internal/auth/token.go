// Package auth logs users in with a phone number and a one-time code, and
// proves who they are on every later request with a signed token.
//
// The flow: POST /auth/code stores a random 6-digit code in Redis for five
// minutes and hands it to a Sender (an SMS gateway's place); POST
// /auth/login checks it (once: a used code is deleted), creates the user
// on first login, and returns an HS256 JWT whose sub is the user ID and
// whose role is user or admin. Limits (limits.go) bound the codes sent per
// phone and per client address, and make a client address that guesses
// wrong wait, so that neither the SMS bill nor a guesser's chances grow
// without end, and no stranger can lock the phone's owner out.
// Verifying a token needs no database: the HMAC proves that this server
// signed it, and exp bounds how long a stolen token is worth anything
// (TOKEN_TTL, at most MaxTTL). Two things end a token sooner, each off
// the buy path's cost: a user who logs out everywhere voids every token
// of theirs issued until then (sessions.go: a stream of logouts in Redis,
// which each instance reads into memory at most every Refresh), and an
// admin token is admin only while its user's phone is
// in ADMIN_PHONES (roles.go: read again on the admin routes).
package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
)

// Role is what a user may do.
type Role string

// The roles a token can carry.
const (
	RoleUser  Role = "user"
	RoleAdmin Role = "admin"
)

// Identity is who a request comes from.
type Identity struct {
	UserID int64
	Role   Role
}

var (
	// ErrBadToken covers every token we will not honour; the message does
	// not say which check failed, so it gives a forger nothing.
	ErrBadToken  = apperr.New(apperr.Unauthorized, "missing, malformed, expired or badly signed token")
	ErrWrongCode = apperr.New(apperr.Unauthorized, "wrong or expired login code")
	ErrForbidden = apperr.New(apperr.Forbidden, "this endpoint is for admins")
)

type claims struct {
	Role Role `json:"role"`
	jwt.RegisteredClaims
}

// errClaimType is why a payload of the wrong shape is refused (the client
// only ever sees ErrBadToken).
var errClaimType = errors.New("a claim of the wrong JSON type or spelling")

// UnmarshalJSON decodes a token's payload, first refusing what
// encoding/json and jwt.NumericDate would take in a shape no token of
// ours has: a date written as a JSON string ("exp": "1764000000" is a
// date to NumericDate, which decodes a json.Number, and a json.Number
// takes a string that holds a number), a date that is null, a sub that
// is not a string of decimal digits, and a claim's name in another case
// ("EXP", "Sub": encoding/json matches field names whatever their case).
// Only a holder of the key can sign such a payload, so none of it is a
// forgery; but a check that takes one spelling only is the one that can
// be read and trusted.
func (c *claims) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	for k, v := range raw {
		for _, name := range [...]string{"exp", "iat", "nbf", "sub", "role"} {
			if k != name && strings.EqualFold(k, name) {
				return errClaimType
			}
		}
		switch k {
		case "exp", "iat", "nbf":
			if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
				return errClaimType
			}
		case "sub":
			// The user ID as FormatInt writes it: digits only, no sign,
			// no leading zero, no escapes.
			if len(v) < 3 || v[0] != '"' || v[1] < '1' || v[1] > '9' || v[len(v)-1] != '"' ||
				bytes.ContainsFunc(v[2:len(v)-1], func(r rune) bool { return r < '0' || r > '9' }) {
				return errClaimType
			}
		}
	}
	type plain claims // the same fields without this method: no recursion
	return json.Unmarshal(b, (*plain)(c))
}

// Tokens issues and verifies tokens. It is safe for concurrent use.
type Tokens struct {
	key    []byte
	ttl    time.Duration
	rdb    redis.UniversalClient // the users' sessions (sessions.go); nil: none end early
	now    func() time.Time
	parser *jwt.Parser
	seen   tokenCache
	// logouts is this instance's memory of the users who logged out
	// everywhere (sessions.go).
	logouts logouts
}

// tokenCache remembers tokens already verified. A flash sale's users send
// the same token again and again, and parsing a JWT (base64, JSON, HMAC)
// costs more than everything else a rejected request does.
//
// The key is the SHA-256 of the whole token string, signature included, so
// a hit is the very token that was verified (finding another string with
// the same SHA-256 is beyond anyone); only its expiry is checked again,
// and whether its user ended their sessions since (from memory).
// Keys are 32-byte arrays and entries numbers, so the maps hold no
// pointer and the garbage collector never scans a sale's hundreds of
// thousands of them (as it had to, in a sync.Map of token strings: about
// a tenth of the sold-out path's time went to that scan).
type tokenCache struct {
	shards [64]tokenShard
}

type tokenShard struct {
	mu sync.RWMutex
	m  map[[sha256.Size]byte]verifiedToken
}

type verifiedToken struct {
	user  int64
	admin bool
	exp   int64 // Unix nanoseconds; 0: a token void for good (its user logged out everywhere since)
	iat   int64 // Unix seconds
}

// maxSeenTokens bounds the cache: a shard past its share starts again
// empty.
const maxSeenTokens = 1 << 18

func (c *tokenCache) shard(sum [sha256.Size]byte) *tokenShard {
	return &c.shards[int(sum[0])%len(c.shards)]
}

func (c *tokenCache) load(sig [sha256.Size]byte) (verifiedToken, bool) {
	sh := c.shard(sig)
	sh.mu.RLock()
	v, ok := sh.m[sig]
	sh.mu.RUnlock()
	return v, ok
}

func (c *tokenCache) store(sig [sha256.Size]byte, v verifiedToken) {
	sh := c.shard(sig)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil || len(sh.m) >= maxSeenTokens/len(c.shards) {
		sh.m = map[[sha256.Size]byte]verifiedToken{}
	}
	sh.m[sig] = v
}

// NewTokens returns Tokens signing with key; tokens live for ttl (at most
// MaxTTL: cmd/server refuses a longer TOKEN_TTL). rdb holds the users'
// sessions (sessions.go); nil, for tests and benchmarks that have no
// Redis, makes tokens that no logout ends: never in a server.
func NewTokens(key []byte, ttl time.Duration, rdb redis.UniversalClient, now func() time.Time) *Tokens {
	return &Tokens{
		key: key,
		ttl: ttl,
		rdb: rdb,
		now: now,
		// Pinning the method is what stops the classic attacks: a token
		// with alg "none", or one "signed" with RS256 using our HMAC key
		// as if it were a public key.
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithExpirationRequired(),
			jwt.WithTimeFunc(now),
			// One spelling per signature: lenient base64 would accept
			// a few (padding, stray bits), each a distinct string to the
			// cache of verified tokens.
			jwt.WithStrictDecoding(),
		),
	}
}

// Issue signs a token for id. Its iat is now, or, right after the user
// logged out everywhere, the second from which their tokens count again
// (sessions.go): a login in the very second of a logout would otherwise
// get a token that the logout voids.
func (t *Tokens) Issue(ctx context.Context, id Identity) (string, error) {
	now := t.now()
	iat := now.Truncate(time.Second) // a JWT's dates are whole seconds
	if t.rdb != nil {
		void, err := t.voidBefore(ctx, id.UserID)
		if err != nil {
			return "", err
		}
		if void > iat.Unix() {
			iat = time.Unix(void, 0)
		}
	}
	c := claims{
		Role: id.Role,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   strconv.FormatInt(id.UserID, 10),
			IssuedAt:  jwt.NewNumericDate(iat),
			ExpiresAt: jwt.NewNumericDate(now.Add(t.ttl)),
		},
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.key)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

// Verify checks a token's signature, algorithm, claims and expiry, and
// that its user has not logged out everywhere since it was issued, and
// returns who it names. A token already verified is answered from memory,
// and whether its user logged out since from this instance's memory of
// the logouts, which Redis brings up to date at most every Refresh; a
// memory Redis could not refresh for long is answered as unavailable,
// never as a good token.
func (t *Tokens) Verify(ctx context.Context, token string) (Identity, error) {
	sum := digest(token)
	now := t.now().UnixNano()
	if v, ok := t.seen.load(sum); ok {
		if now >= v.exp {
			return Identity{}, ErrBadToken
		}
		return t.unlessVoided(ctx, sum, v, now)
	}
	var c claims
	_, err := t.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil })
	if err != nil {
		return Identity{}, ErrBadToken
	}
	// Digits only (UnmarshalJSON), and within 63 bits.
	id, err := strconv.ParseInt(c.Subject, 10, 64)
	if err != nil || id <= 0 || (c.Role != RoleUser && c.Role != RoleAdmin) {
		return Identity{}, ErrBadToken
	}
	v := verifiedToken{user: id, admin: c.Role == RoleAdmin, exp: c.ExpiresAt.Time.UnixNano()}
	if c.IssuedAt != nil { // every token Issue signs has one; one without is void after any logout
		v.iat = c.IssuedAt.Time.Unix()
	}
	if c.NotBefore == nil { // a token not valid yet must be parsed again later
		t.seen.store(sum, v)
	}
	return t.unlessVoided(ctx, sum, v, now)
}

// unlessVoided returns v's identity unless its user logged out everywhere
// after it was issued, as this instance's memory of the logouts has it
// (sessions.go: a map lookup, and at most once every Refresh a read of
// what the logouts' stream added). A token found void is remembered so,
// for good: the second from which a user's tokens count only moves on.
func (t *Tokens) unlessVoided(ctx context.Context, sum [sha256.Size]byte, v verifiedToken, now int64) (Identity, error) {
	if t.rdb != nil {
		void, err := t.logouts.voidBefore(ctx, t.rdb, v.user, now)
		if err != nil {
			return Identity{}, err
		}
		if v.iat < void {
			v.exp = 0
			t.seen.store(sum, v)
			return Identity{}, ErrBadToken
		}
	}
	return v.identity(), nil
}

// digest is the SHA-256 of token, hashed from a copy on the stack: a
// token's []byte would go to the heap on every request.
func digest(token string) [sha256.Size]byte {
	var buf [512]byte
	if len(token) > len(buf) {
		return sha256.Sum256([]byte(token))
	}
	return sha256.Sum256(buf[:copy(buf[:], token)])
}

func (v verifiedToken) identity() Identity {
	if v.admin {
		return Identity{UserID: v.user, Role: RoleAdmin}
	}
	return Identity{UserID: v.user, Role: RoleUser}
}

const identityKey = "auth.identity"

// Authenticate is middleware that lets only requests with a valid bearer
// token through, and records who sent them for From.
func (t *Tokens) Authenticate(fail func(*gin.Context, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		// Header["Authorization"], the name as net/http stores it, is
		// c.GetHeader("Authorization") without canonicalising the name
		// again on every request.
		var h string
		if v := c.Request.Header["Authorization"]; len(v) > 0 {
			h = v[0]
		}
		const prefix = "Bearer " // the scheme is case-insensitive (RFC 9110)
		if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
			fail(c, ErrBadToken)
			return
		}
		id, err := t.Verify(c.Request.Context(), h[len(prefix):])
		if err != nil {
			fail(c, err)
			return
		}
		c.Set(identityKey, id)
		c.Next()
	}
}

// From returns the identity Authenticate recorded (and RequireAdmin or
// CurrentRole may have corrected: roles.go).
func From(c *gin.Context) Identity {
	v, _ := c.Get(identityKey)
	id, _ := v.(Identity)
	return id
}
