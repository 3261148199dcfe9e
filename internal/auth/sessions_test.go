package auth

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/testenv"
	"seckill/internal/web"
)

// These tests run several instances' auth side by side, each with Tokens
// of its own (so a cache of verified tokens of its own), on one MySQL
// database and one Redis, as instances behind a balancer share them. Their
// clock is the test's, moved by hand, so that the bounds (Refresh,
// adminFor) are crossed without waiting for them. Their Redis is database
// 1, this package's alone, flushed: the logouts' stream is one for every
// user, and other tests' databases number their users from 1 too.

// testClock is a clock moved by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// authInstance is one instance's auth: its Tokens and Service, and a
// router with GET /me (who the token names, and the role the instance
// grants), GET /admin (for admins) and POST /auth/logout.
type authInstance struct {
	svc    *Service
	router *gin.Engine
}

var sessionsTestKey = []byte("sessions-test-key-0123456789abcdef")

func newAuthInstance(db *gorm.DB, rdb redis.UniversalClient, clock *testClock, admins ...string) *authInstance {
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tokens := NewTokens(sessionsTestKey, time.Hour, rdb, clock.now)
	svc := NewService(db, rdb, tokens, admins, &recorder{}, guessLimits())
	fail := func(c *gin.Context, err error) { web.Error(c, log, err) }
	r := gin.New()
	authn := tokens.Authenticate(fail)
	me := func(c *gin.Context) { c.String(http.StatusOK, string(From(c).Role)) }
	r.GET("/me", authn, svc.CurrentRole(fail), me)
	r.GET("/admin", authn, svc.RequireAdmin(fail), me)
	r.POST("/auth/logout", authn, NewHandler(svc, false, log).Logout)
	return &authInstance{svc: svc, router: r}
}

// do sends method path with token and returns the status and body.
func (in *authInstance) do(method, path, token string) (int, string) {
	req := httptest.NewRequest(method, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	in.router.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// expect fails t unless GET path with token answers status.
func (in *authInstance) expect(t *testing.T, name, path, token string, status int) {
	t.Helper()
	if got, body := in.do(http.MethodGet, path, token); got != status {
		t.Errorf("%s: GET %s = %d %s, want %d", name, path, got, body, status)
	}
}

// logIn logs phone in through in's Service (a code, then the login) and
// returns the token and the user's ID.
func (in *authInstance) logIn(t *testing.T, phone string) (string, int64) {
	t.Helper()
	addr := testAddr(t, in.svc)
	code := mustSend(t, in.svc, phone, addr)
	token, u, err := in.svc.Login(context.Background(), phone, code, addr)
	if err != nil {
		t.Fatalf("login %s: %v", phone, err)
	}
	t.Cleanup(func() { in.svc.rdb.Del(context.Background(), sessionsKey(u.ID)) })
	return token, u.ID
}

// After POST /auth/logout, every token of the user issued until then is
// refused on every instance within Refresh: at once on an instance that
// never read the logouts, and at its next read on one that had. A
// login afterwards works at once (even in the very second of the logout),
// and other users' tokens are untouched.
func TestLogoutEverywhere(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	rdb := sessionsRedis(t)
	clock := &testClock{t: time.Now().Truncate(time.Second)}
	a, b := newAuthInstance(db, rdb, clock), newAuthInstance(db, rdb, clock)
	phone := testPhone(t, a.svc)
	old, user := a.logIn(t, phone)
	other, otherUser := a.logIn(t, testPhone(t, a.svc))
	for _, in := range []*authInstance{a, b} { // both verify and remember the token
		in.expect(t, "before the logout", "/me", old, http.StatusOK)
	}

	clock.add(time.Second)
	if got, body := a.do(http.MethodPost, "/auth/logout", old); got != http.StatusOK || body != `{"logged_out":true}` {
		t.Fatalf("POST /auth/logout = %d %s, want 200 {\"logged_out\":true}", got, body)
	}
	// An instance that never verified the token asks Redis at once.
	fresh := newAuthInstance(db, rdb, clock)
	fresh.expect(t, "old token on a fresh instance", "/me", old, http.StatusUnauthorized)
	// A login in the same second as the logout gets a token that works.
	now, _ := a.logIn(t, phone)
	for _, in := range []*authInstance{a, b, fresh} {
		in.expect(t, "new token", "/me", now, http.StatusOK)
	}

	// Refresh after their last read of the logouts (a second before the
	// logout), every instance has read again.
	clock.add(Refresh)
	for i, in := range []*authInstance{a, b, fresh} {
		in.expect(t, "old token after Refresh on instance "+string(rune('A'+i)), "/me", old, http.StatusUnauthorized)
		in.expect(t, "new token after Refresh", "/me", now, http.StatusOK)
		in.expect(t, "another user's token", "/me", other, http.StatusOK)
	}
	// The old token stays refused (remembered as void, no more Redis).
	a.expect(t, "old token again", "/me", old, http.StatusUnauthorized)

	// A second logout in the same second as the login after the first
	// voids that login's token too.
	if got, body := b.do(http.MethodPost, "/auth/logout", now); got != http.StatusOK {
		t.Fatalf("second POST /auth/logout = %d %s", got, body)
	}
	newAuthInstance(db, rdb, clock).expect(t, "token of the login between two logouts", "/me", now, http.StatusUnauthorized)
	after, _ := b.logIn(t, phone)
	newAuthInstance(db, rdb, clock).expect(t, "login after the second logout", "/me", after, http.StatusOK)

	// A token without iat (Issue always writes one) counts as issued at
	// the epoch: void once its user has logged out everywhere.
	bare, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": strconv.FormatInt(user, 10), "role": "user", "exp": clock.now().Add(time.Hour).Unix()}).SignedString(sessionsTestKey)
	if err != nil {
		t.Fatal(err)
	}
	newAuthInstance(db, rdb, clock).expect(t, "a token without iat after a logout", "/me", bare, http.StatusUnauthorized)
	otherBare, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": strconv.FormatInt(otherUser, 10), "role": "user", "exp": clock.now().Add(time.Hour).Unix()}).SignedString(sessionsTestKey)
	if err != nil {
		t.Fatal(err)
	}
	newAuthInstance(db, rdb, clock).expect(t, "a token without iat of a user who never logged out", "/me", otherBare, http.StatusOK)

	// Logging out needs a token.
	if got, _ := a.do(http.MethodPost, "/auth/logout", ""); got != http.StatusUnauthorized {
		t.Errorf("POST /auth/logout without a token = %d, want 401", got)
	}
}

// The second from which a user's tokens count lives in Redis as long as
// a token it voids could: past the longest token's life, counted from
// that second.
func TestEndSessionsKeyExpires(t *testing.T) {
	rdb := sessionsRedis(t)
	now := time.Now().Truncate(time.Second)
	tokens := NewTokens(sessionsTestKey, time.Hour, rdb, func() time.Time { return now })
	user := testenv.ID()
	t.Cleanup(func() { rdb.Del(context.Background(), sessionsKey(user)) })
	ctx := context.Background()
	for range 3 { // three logouts in one second
		if err := tokens.EndSessions(ctx, user); err != nil {
			t.Fatal(err)
		}
	}
	from, err := rdb.Get(ctx, sessionsKey(user)).Int64()
	if err != nil || from != now.Unix()+3 {
		t.Errorf("tokens count from %d (%v), want %d: each logout of the second moves it on by one", from, err, now.Unix()+3)
	}
	ttl, err := rdb.TTL(ctx, sessionsKey(user)).Result()
	if want := MaxTTL + 3*time.Second; err != nil || ttl > want || ttl < want-2*time.Second {
		t.Errorf("the key lives %s (%v), want about %s", ttl, err, want)
	}
}

// A Redis that does not answer says neither that a token is good nor
// that it is void: verifying, issuing and logging out are unavailable.
func TestVerifyWithoutRedis(t *testing.T) {
	now := time.Now()
	signer := NewTokens(sessionsTestKey, time.Hour, nil, func() time.Time { return now })
	token, err := signer.Issue(context.Background(), Identity{UserID: 42, Role: RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	down := NewTokens(sessionsTestKey, time.Hour, testenv.DownRedis(t), func() time.Time { return now })
	if id, err := down.Verify(context.Background(), token); !errors.Is(err, apperr.ErrUnavailable) || id != (Identity{}) {
		t.Errorf("Verify with Redis down = %+v, %v; want unavailable", id, err)
	}
	if _, err := down.Issue(context.Background(), Identity{UserID: 42, Role: RoleUser}); !errors.Is(err, apperr.ErrUnavailable) {
		t.Errorf("Issue with Redis down = %v; want unavailable", err)
	}
	if err := down.EndSessions(context.Background(), 42); !errors.Is(err, apperr.ErrUnavailable) {
		t.Errorf("EndSessions with Redis down = %v; want unavailable", err)
	}
}

// sessionsRedis is Redis database 1, this package's alone, flushed.
func sessionsRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := testenv.Redis(t, 1)
	if err := rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb
}

// Verifying tokens asks Redis nothing per token: a thousand users' tokens,
// each verified twice, cost one read of the logouts a Refresh, whoever
// they are; a logout made meanwhile is seen at the next read.
func TestVerifyReadsLogoutsOnceARefresh(t *testing.T) {
	rdb := sessionsRedis(t)
	clock := &testClock{t: time.Now().Truncate(time.Second)}
	tokens := NewTokens(sessionsTestKey, time.Hour, rdb, clock.now)
	ctx := context.Background()
	var issued []string
	for u := int64(1); u <= 1000; u++ {
		tok, err := tokens.Issue(ctx, Identity{UserID: u, Role: RoleUser})
		if err != nil {
			t.Fatal(err)
		}
		issued = append(issued, tok)
	}
	reads := func() int64 {
		stats, err := rdb.Do(ctx, "INFO", "commandstats").Text()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(stats) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_xread:calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	clock.add(time.Second) // a logout in a later second than the logins
	if err := tokens.EndSessions(ctx, 7); err != nil {
		t.Fatal(err)
	}
	before := reads()
	for range 2 {
		for i, tok := range issued {
			_, err := tokens.Verify(ctx, tok)
			if void := i == 6; (err != nil) != void {
				t.Fatalf("user %d: %v", i+1, err)
			}
		}
	}
	// Other tests may read streams of their own at the same time: a
	// handful more is theirs, not a read per token.
	if n := reads() - before; n > 5 {
		t.Errorf("%d stream reads for 2,000 verifications within one Refresh, want one", n)
	}
}
