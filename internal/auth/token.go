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
// Verifying a token needs no database or Redis: the HMAC proves that this
// server signed it, and exp bounds how long a stolen token is worth anything.
package auth

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"

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

// Tokens issues and verifies tokens. It is safe for concurrent use.
type Tokens struct {
	key    []byte
	ttl    time.Duration
	now    func() time.Time
	parser *jwt.Parser
	seen   tokenCache
}

// tokenCache remembers tokens already verified. A flash sale's users send
// the same token again and again, and parsing a JWT (base64, JSON, HMAC)
// costs more than everything else a rejected request does.
//
// The key is the SHA-256 of the whole token string, signature included, so
// a hit is the very token that was verified (finding another string with
// the same SHA-256 is beyond anyone); only its expiry is checked again.
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
	exp   int64 // Unix nanoseconds
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

// NewTokens returns Tokens signing with key; tokens live for ttl.
func NewTokens(key []byte, ttl time.Duration, now func() time.Time) *Tokens {
	return &Tokens{
		key: key,
		ttl: ttl,
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

// Issue signs a token for id.
func (t *Tokens) Issue(id Identity) (string, error) {
	now := t.now()
	c := claims{
		Role: id.Role,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   strconv.FormatInt(id.UserID, 10),
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(t.ttl)),
		},
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.key)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

// Verify checks a token's signature, algorithm and expiry and returns who
// it names.
func (t *Tokens) Verify(token string) (Identity, error) {
	sum := digest(token)
	if v, ok := t.seen.load(sum); ok {
		if t.now().UnixNano() >= v.exp {
			return Identity{}, ErrBadToken
		}
		return v.identity(), nil
	}
	var c claims
	_, err := t.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil })
	if err != nil {
		return Identity{}, ErrBadToken
	}
	id, err := strconv.ParseInt(c.Subject, 10, 64)
	if err != nil || id <= 0 || (c.Role != RoleUser && c.Role != RoleAdmin) {
		return Identity{}, ErrBadToken
	}
	who := Identity{UserID: id, Role: c.Role}
	if c.NotBefore == nil { // a token not valid yet must be parsed again later
		t.seen.store(sum, verifiedToken{user: id, admin: c.Role == RoleAdmin, exp: c.ExpiresAt.Time.UnixNano()})
	}
	return who, nil
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
		h := c.GetHeader("Authorization")
		const prefix = "Bearer " // the scheme is case-insensitive (RFC 9110)
		if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
			fail(c, ErrBadToken)
			return
		}
		id, err := t.Verify(h[len(prefix):])
		if err != nil {
			fail(c, err)
			return
		}
		c.Set(identityKey, id)
		c.Next()
	}
}

// RequireAdmin is middleware, after Authenticate, that lets only admins on.
func RequireAdmin(fail func(*gin.Context, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		if From(c).Role != RoleAdmin {
			fail(c, ErrForbidden)
			return
		}
		c.Next()
	}
}

// From returns the identity Authenticate recorded.
func From(c *gin.Context) Identity {
	v, _ := c.Get(identityKey)
	id, _ := v.(Identity)
	return id
}
