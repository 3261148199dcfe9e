package auth_test

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"

	"seckill/internal/auth"
)

var (
	testKey = []byte("token-test-key-0123456789abcdef")
	// A fixed clock: tokens are issued and verified at this instant
	// unless a test says otherwise.
	issuedAt = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
)

const ttl = 2 * time.Hour

func tokensAt(key []byte, now time.Time) *auth.Tokens {
	return auth.NewTokens(key, ttl, nil, func() time.Time { return now })
}

// mint signs claims with method and key, as a forger with a JWT library
// would.
func mint(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatalf("mint %s token: %v", method.Alg(), err)
	}
	return s
}

// claimsFor are well-formed claims for user 42 with role, valid at issuedAt.
func claimsFor(role string) jwt.MapClaims {
	return jwt.MapClaims{
		"sub":  "42",
		"role": role,
		"iat":  issuedAt.Unix(),
		"exp":  issuedAt.Add(time.Hour).Unix(),
	}
}

func without(c jwt.MapClaims, name string) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		if k != name {
			out[k] = v
		}
	}
	return out
}

func with(c jwt.MapClaims, name string, v any) jwt.MapClaims {
	out := without(c, name)
	out[name] = v
	return out
}

// hmacWithHeader builds a token by hand: any header, HMAC-SHA256 with key.
// It is how the classic algorithm-confusion forgery is made (an RS256
// header over an HMAC keyed with what the server holds), which no JWT
// library will produce.
func hmacWithHeader(t *testing.T, header map[string]any, claims jwt.MapClaims, key []byte) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(header) + "." + enc(claims)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func TestIssueVerifyRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		id   auth.Identity
	}{
		{"user", auth.Identity{UserID: 42, Role: auth.RoleUser}},
		{"admin", auth.Identity{UserID: 1, Role: auth.RoleAdmin}},
		{"63-bit user ID", auth.Identity{UserID: 1<<63 - 1, Role: auth.RoleUser}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tokens := tokensAt(testKey, issuedAt)
			token, err := tokens.Issue(t.Context(), tt.id)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tokens.Verify(t.Context(), token)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if got != tt.id {
				t.Errorf("Verify = %+v, want %+v", got, tt.id)
			}
			// Another Tokens with the same key (another instance) agrees,
			// up to the last second of the token's life.
			if got, err := tokensAt(testKey, issuedAt.Add(ttl-time.Second)).Verify(t.Context(), token); err != nil || got != tt.id {
				t.Errorf("Verify on another instance just before expiry = %+v, %v", got, err)
			}
		})
	}
}

// TestIssuedTokenShape checks what the contract says a token is: HS256,
// sub the user ID as a string, role, exp two hours on by default.
func TestIssuedTokenShape(t *testing.T) {
	token, err := tokensAt(testKey, issuedAt).Issue(t.Context(), auth.Identity{UserID: 271846193284534273, Role: auth.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	var c jwt.MapClaims
	parsed, err := jwt.NewParser(jwt.WithTimeFunc(func() time.Time { return issuedAt })).ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return testKey, nil })
	if err != nil {
		t.Fatal(err)
	}
	if alg := parsed.Header["alg"]; alg != "HS256" {
		t.Errorf("alg = %v, want HS256", alg)
	}
	if c["sub"] != "271846193284534273" {
		t.Errorf("sub = %#v, want the user ID as a decimal string", c["sub"])
	}
	if c["role"] != "admin" {
		t.Errorf("role = %#v, want admin", c["role"])
	}
	exp, err := c.GetExpirationTime()
	if err != nil || exp == nil || !exp.Equal(issuedAt.Add(ttl)) {
		t.Errorf("exp = %v (%v), want %s", exp, err, issuedAt.Add(ttl))
	}
}

func TestVerifyRejects(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	good := mint(t, jwt.SigningMethodHS256, testKey, claimsFor("user"))
	parts := strings.Split(good, ".")
	// The payload of an admin token under the signature of a user token.
	adminPayload := strings.Split(mint(t, jwt.SigningMethodHS256, testKey, claimsFor("admin")), ".")[1]
	issuedEarlier, err := tokensAt(testKey, issuedAt.Add(-ttl-time.Second)).Issue(t.Context(), auth.Identity{UserID: 42, Role: auth.RoleUser})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		token string
	}{
		{"alg none", mint(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claimsFor("admin"))},
		{"alg none with the signature stripped", parts[0] + "." + parts[1] + "."},
		{"signed with another key", mint(t, jwt.SigningMethodHS256, []byte("another-key-0123456789abcdef0000"), claimsFor("user"))},
		{"HS384 with the same key", mint(t, jwt.SigningMethodHS384, testKey, claimsFor("user"))},
		{"HS512 with the same key", mint(t, jwt.SigningMethodHS512, testKey, claimsFor("user"))},
		{"RS256", mint(t, jwt.SigningMethodRS256, rsaKey, claimsFor("admin"))},
		{"RS256 header over an HMAC with the key", hmacWithHeader(t, map[string]any{"alg": "RS256", "typ": "JWT"}, claimsFor("admin"), testKey)},
		{"payload swapped under a valid signature", parts[0] + "." + adminPayload + "." + parts[2]},
		{"signature of another token", parts[0] + "." + parts[1] + "." + strings.Split(mint(t, jwt.SigningMethodHS256, testKey, claimsFor("admin")), ".")[2]},
		{"expired", issuedEarlier},
		{"expired a second ago", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "exp", issuedAt.Add(-time.Second).Unix()))},
		{"missing exp", mint(t, jwt.SigningMethodHS256, testKey, without(claimsFor("user"), "exp"))},
		{"exp not a number", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "exp", "tomorrow"))},
		// Dates of the wrong JSON type, which jwt.NumericDate takes: a
		// string that holds a number (probe I5), or null.
		{"exp a numeric string", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "exp", strconv.FormatInt(issuedAt.Add(time.Hour).Unix(), 10)))},
		{"iat a numeric string", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "iat", strconv.FormatInt(issuedAt.Unix(), 10)))},
		{"nbf a numeric string", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "nbf", strconv.FormatInt(issuedAt.Add(-time.Minute).Unix(), 10)))},
		{"iat null", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "iat", nil))},
		{"nbf null", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "nbf", nil))},
		{"exp as a boolean", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "exp", true))},
		// A claim's name in another case: encoding/json matches it to the
		// field, and the last of the two would win.
		{"EXP beside exp", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "EXP", strconv.FormatInt(issuedAt.Add(time.Hour).Unix(), 10)))},
		{"Sub instead of sub", mint(t, jwt.SigningMethodHS256, testKey, with(without(claimsFor("user"), "sub"), "Sub", "42"))},
		{"Role instead of role", mint(t, jwt.SigningMethodHS256, testKey, with(without(claimsFor("admin"), "role"), "Role", "admin"))},
		{"not valid yet", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "nbf", issuedAt.Add(time.Minute).Unix()))},
		{"missing sub", mint(t, jwt.SigningMethodHS256, testKey, without(claimsFor("user"), "sub"))},
		{"non-numeric sub", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "alice"))},
		{"sub zero", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "0"))},
		{"negative sub", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "-42"))},
		{"sub beyond 63 bits", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "9223372036854775808"))},
		{"sub as a JSON number", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", 42))},
		// A user ID is written one way only, as the server writes it.
		{"sub with a plus sign", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "+42"))},
		{"sub with a leading zero", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "042"))},
		{"sub with a space", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", "42 "))},
		{"sub spelled with escapes", hmacPayload(t, `{"sub":"\u0034\u0032","role":"user","iat":`+strconv.FormatInt(issuedAt.Unix(), 10)+`,"exp":`+strconv.FormatInt(issuedAt.Add(time.Hour).Unix(), 10)+`}`, testKey)},
		{"sub empty", mint(t, jwt.SigningMethodHS256, testKey, with(claimsFor("user"), "sub", ""))},
		{"missing role", mint(t, jwt.SigningMethodHS256, testKey, without(claimsFor("user"), "role"))},
		{"empty role", mint(t, jwt.SigningMethodHS256, testKey, claimsFor(""))},
		{"unknown role", mint(t, jwt.SigningMethodHS256, testKey, claimsFor("root"))},
		{"role in another case", mint(t, jwt.SigningMethodHS256, testKey, claimsFor("Admin"))},
		{"garbage", "not-a-token"},
		{"three garbage parts", "a.b.c"},
		{"bearer prefix left in", "Bearer " + good},
		// The same 32 signature bytes, spelled with the unused low bits of
		// the last base64 character set: lenient decoding would accept it.
		{"signature with stray bits", parts[0] + "." + parts[1] + "." + strayBits(parts[2])},
		{"empty", ""},
	}
	tokens := tokensAt(testKey, issuedAt)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := tokens.Verify(t.Context(), tt.token)
			if !errors.Is(err, auth.ErrBadToken) {
				t.Errorf("Verify = %+v, %v; want ErrBadToken", id, err)
			}
			if id != (auth.Identity{}) {
				t.Errorf("Verify returned identity %+v with its error", id)
			}
		})
	}

	// The control: the same construction with the right key, algorithm
	// and claims is accepted, so the cases above fail for their reason.
	t.Run("control", func(t *testing.T) {
		want := auth.Identity{UserID: 42, Role: auth.RoleUser}
		if id, err := tokens.Verify(t.Context(), good); err != nil || id != want {
			t.Errorf("Verify(good) = %+v, %v; want %+v", id, err, want)
		}
		if id, err := tokens.Verify(t.Context(), hmacWithHeader(t, map[string]any{"alg": "HS256", "typ": "JWT"}, claimsFor("user"), testKey)); err != nil || id != want {
			t.Errorf("Verify(hand-made HS256) = %+v, %v; want %+v", id, err, want)
		}
		raw := hmacPayload(t, `{"sub":"42","role":"user","iat":`+strconv.FormatInt(issuedAt.Unix(), 10)+`,"exp":`+strconv.FormatInt(issuedAt.Add(time.Hour).Unix(), 10)+`}`, testKey)
		if id, err := tokens.Verify(t.Context(), raw); err != nil || id != want {
			t.Errorf("Verify(hand-written payload) = %+v, %v; want %+v", id, err, want)
		}
		// A date with a fraction of a second is a JSON number too (RFC
		// 7519's NumericDate allows it), and a past nbf.
		frac := mint(t, jwt.SigningMethodHS256, testKey, with(with(claimsFor("user"), "exp", float64(issuedAt.Add(time.Hour).Unix())+0.5), "nbf", issuedAt.Add(-time.Minute).Unix()))
		if id, err := tokens.Verify(t.Context(), frac); err != nil || id != want {
			t.Errorf("Verify(fractional exp, past nbf) = %+v, %v; want %+v", id, err, want)
		}
	})
}

// TestBadTokenMessage checks that the error a client sees does not say
// which check failed.
func TestBadTokenMessage(t *testing.T) {
	_, expired := tokensAt(testKey, issuedAt.Add(3*ttl)).Verify(t.Context(), mint(t, jwt.SigningMethodHS256, testKey, claimsFor("user")))
	_, forged := tokensAt(testKey, issuedAt).Verify(t.Context(), mint(t, jwt.SigningMethodHS512, testKey, claimsFor("user")))
	if expired == nil || forged == nil || expired.Error() != forged.Error() {
		t.Errorf("expired token: %v; forged token: %v; want the same error", expired, forged)
	}
}

func TestAuthenticate(t *testing.T) {
	gin.SetMode(gin.TestMode)
	tokens := tokensAt(testKey, issuedAt)
	good, err := tokens.Issue(t.Context(), auth.Identity{UserID: 42, Role: auth.RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tokens.Issue(t.Context(), auth.Identity{UserID: 1, Role: auth.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	fail := func(c *gin.Context, err error) {
		status := http.StatusInternalServerError
		if errors.Is(err, auth.ErrBadToken) {
			status = http.StatusUnauthorized
		}
		c.AbortWithStatus(status)
	}
	r := gin.New()
	r.GET("/me", tokens.Authenticate(fail), func(c *gin.Context) {
		id := auth.From(c)
		c.String(http.StatusOK, "%d %s", id.UserID, id.Role)
	})

	tests := []struct {
		name   string
		path   string
		header string // Authorization; "-" for none
		status int
		body   string
	}{
		{"valid", "/me", "Bearer " + good, http.StatusOK, "42 user"},
		{"no header", "/me", "-", http.StatusUnauthorized, ""},
		{"empty header", "/me", "", http.StatusUnauthorized, ""},
		{"bearer without token", "/me", "Bearer ", http.StatusUnauthorized, ""},
		{"bearer garbage", "/me", "Bearer garbage", http.StatusUnauthorized, ""},
		{"token without scheme", "/me", good, http.StatusUnauthorized, ""},
		{"basic scheme", "/me", "Basic dXNlcjpwYXNz", http.StatusUnauthorized, ""},
		{"two spaces", "/me", "Bearer  " + good, http.StatusUnauthorized, ""},
		// The role as the token claims it; RequireAdmin checks it against
		// ADMIN_PHONES (TestAdminRoleEnds).
		{"admin", "/me", "Bearer " + admin, http.StatusOK, "1 admin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tt.path, nil)
			if tt.header != "-" {
				req.Header.Set("Authorization", tt.header)
			}
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, req)
			if rec.Code != tt.status {
				t.Errorf("status %d, want %d", rec.Code, tt.status)
			}
			if tt.body != "" && rec.Body.String() != tt.body {
				t.Errorf("body %q, want %q", rec.Body.String(), tt.body)
			}
		})
	}
}

// A verified token is remembered, but never past its expiry: the cache
// must not turn an expired token back into a valid one.
func TestVerifyCacheHonoursExpiry(t *testing.T) {
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	tokens := auth.NewTokens(testKey, time.Hour, nil, clock)
	tok, err := tokens.Issue(t.Context(), auth.Identity{UserID: 7, Role: auth.RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second call is answered from the cache
		if id, err := tokens.Verify(t.Context(), tok); err != nil || id.UserID != 7 {
			t.Fatalf("fresh token: %v %v", id, err)
		}
	}
	now = now.Add(time.Hour)
	if _, err := tokens.Verify(t.Context(), tok); !errors.Is(err, auth.ErrBadToken) {
		t.Fatalf("expired token answered from the cache: %v", err)
	}
	// And a forged token never enters it: a different signature is a
	// different string.
	forged := tok[:len(tok)-2] + "AA"
	if _, err := tokens.Verify(t.Context(), forged); !errors.Is(err, auth.ErrBadToken) {
		t.Fatalf("forged token: %v", err)
	}
}

// hmacPayload signs payload, raw JSON as written, under an HS256 header:
// for payloads no JSON encoder would write.
func hmacPayload(t *testing.T, payload string, key []byte) string {
	t.Helper()
	signing := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// strayBits respells a base64url HS256 signature (43 characters for 32
// bytes, the last character carrying 4 bits and 2 unused ones) with its
// lowest unused bit flipped: the same bytes to a lenient decoder.
func strayBits(sig string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, sig[len(sig)-1])
	return sig[:len(sig)-1] + string(alphabet[last^1])
}
