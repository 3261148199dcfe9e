package auth_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"

	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/web"
)

// The fuzz targets of this file throw arbitrary strings at the two
// parsers a request's identity goes through: Verify (the token) and
// Authenticate (the Authorization header around it). Run one with
//
//	go test -run '^$' -fuzz '^FuzzVerify$' -fuzztime 30s ./internal/auth
//
// The fuzzer cannot compute an HMAC, so the only tokens that may pass are
// the ones signed below, and whatever the fuzzer makes of them that still
// carries their signed header and payload. signedTokens is that oracle.

// signedTokens are the tokens a fuzz target signed with testKey, by their
// signing input (header.payload), with the identity each was signed for.
type signedTokens map[string]auth.Identity

// fuzzTokens returns Tokens with testKey at issuedAt, the seeds (tokens it
// signed for three identities, and the classic forgeries and mangled
// forms of them) and the oracle.
func fuzzTokens(f *testing.F) (*auth.Tokens, []string, signedTokens) {
	f.Helper()
	tokens := tokensAt(testKey, issuedAt)
	signed := signedTokens{}
	var valid []string
	for _, id := range []auth.Identity{
		{UserID: 42, Role: auth.RoleUser},
		{UserID: 1, Role: auth.RoleAdmin},
		{UserID: 1<<63 - 1, Role: auth.RoleUser},
	} {
		tok, err := tokens.Issue(f.Context(), id)
		if err != nil {
			f.Fatal(err)
		}
		signed[tok[:strings.LastIndexByte(tok, '.')]] = id
		valid = append(valid, tok)
	}
	sign := func(method jwt.SigningMethod, key any, c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(method, c).SignedString(key)
		if err != nil {
			f.Fatalf("sign %s: %v", method.Alg(), err)
		}
		return s
	}
	admin := jwt.MapClaims{"sub": "1", "role": "admin", "iat": issuedAt.Unix(), "exp": issuedAt.Add(time.Hour).Unix()}
	good, parts := valid[0], strings.Split(valid[0], ".")
	expired, err := tokensAt(testKey, issuedAt.Add(-ttl-time.Second)).Issue(f.Context(), auth.Identity{UserID: 42, Role: auth.RoleUser})
	if err != nil {
		f.Fatal(err)
	}
	seeds := append(valid,
		// Forgeries: alg none, the signature stripped, another key,
		// another algorithm, an admin payload under a user's signature.
		sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, admin),
		parts[0]+"."+parts[1]+".",
		sign(jwt.SigningMethodHS256, []byte("another-key-0123456789abcdef0000"), admin),
		sign(jwt.SigningMethodHS512, testKey, admin),
		parts[0]+"."+strings.Split(valid[1], ".")[1]+"."+parts[2],
		// Signed by us, but expired.
		expired,
		// The same signature spelled differently: the decoder ignores the
		// unused low bits of the last character, and line breaks.
		respelled(good), good[:len(good)-4]+"\n"+good[len(good)-4:],
		// Truncated and mangled.
		good[:len(good)-1], good[:len(good)/2], parts[0]+"."+parts[1], parts[0], "", ".", "..",
		good+".", good+"=", strings.ToUpper(good), "a.b.c", "not-a-token",
	)
	return tokens, seeds, signed
}

// respelled returns token with the last character of its signature
// changed in a bit that the signature's 32 bytes do not use.
func respelled(token string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, token[len(token)-1])
	return token[:len(token)-1] + string(alphabet[i^1])
}

// check fails t unless the token Verify accepted as id is one the test
// signed: its header and payload are the signed ones, its signature is
// their HMAC under testKey (however the fuzzer re-spelled it), and id is
// the identity it was signed for.
func (s signedTokens) check(t *testing.T, token string, id auth.Identity) {
	t.Helper()
	dot := strings.LastIndexByte(token, '.')
	if dot < 0 {
		t.Fatalf("accepted %q, which has no signature, as %+v", token, id)
	}
	want, ok := s[token[:dot]]
	if !ok {
		t.Fatalf("accepted %q, which the test never signed, as %+v", token, id)
	}
	if id != want {
		t.Fatalf("accepted %q as %+v; it was signed for %+v", token, id, want)
	}
	sig, err := base64.RawURLEncoding.DecodeString(token[dot+1:])
	mac := hmac.New(sha256.New, testKey)
	mac.Write([]byte(token[:dot]))
	if err != nil || !hmac.Equal(sig, mac.Sum(nil)) {
		t.Fatalf("accepted %q, whose signature is not the HMAC of its header and payload", token)
	}
}

// FuzzVerify: for any string, Verify never panics, and either refuses it
// with ErrBadToken and no identity, or it is a token the test signed and
// Verify names the identity it was signed for. No forgery, and no
// mutation of a valid token that changes whom it names.
func FuzzVerify(f *testing.F) {
	tokens, seeds, signed := fuzzTokens(f)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		// Twice: the second answer may come from the cache of verified
		// tokens, and must be the same.
		for range 2 {
			id, err := tokens.Verify(t.Context(), token)
			if err != nil {
				if !errors.Is(err, auth.ErrBadToken) || id != (auth.Identity{}) {
					t.Fatalf("Verify(%q) = %+v, %v; want no identity and ErrBadToken", token, id, err)
				}
				continue
			}
			signed.check(t, token, id)
		}
	})
}

// FuzzAuthenticate sends any Authorization header through Authenticate,
// wired as cmd/server wires it (failures through web.Error). Never a
// panic; either 401 unauthorized in the contract's envelope, or the
// header is "Bearer " (in any case) and a token the test signed, and the
// handler sees the identity it was signed for.
func FuzzAuthenticate(f *testing.F) {
	tokens, seeds, signed := fuzzTokens(f)
	for _, s := range seeds {
		f.Add("Bearer " + s)
	}
	good := seeds[0]
	for _, h := range []string{
		"bearer " + good, "BEARER " + good, "Bearer  " + good, "Bearer\t" + good, "Bearer " + good + " ",
		good, "Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "", "Bearer " + good + ", Bearer " + good,
	} {
		f.Add(h)
	}
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fail := func(c *gin.Context, err error) { web.Error(c, log, err) }
	var seen auth.Identity
	r := gin.New()
	r.Use(web.Recover(log))
	r.GET("/me", tokens.Authenticate(fail), func(c *gin.Context) {
		seen = auth.From(c)
		c.Status(http.StatusNoContent)
	})

	f.Fuzz(func(t *testing.T, header string) {
		seen = auth.Identity{}
		req := httptest.NewRequest(http.MethodGet, "/me", nil)
		req.Header["Authorization"] = []string{header}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)

		switch rec.Code {
		case http.StatusNoContent:
			const prefix = "Bearer "
			if len(header) <= len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
				t.Fatalf("let %q through: it is not a bearer token", header)
			}
			signed.check(t, header[len(prefix):], seen)
		case http.StatusUnauthorized:
			var env struct {
				Error struct {
					Code    apperr.Code `json:"code"`
					Message string      `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code != apperr.Unauthorized || env.Error.Message == "" {
				t.Fatalf("401 %s is not the unauthorized envelope (%v)", rec.Body, err)
			}
			if seen != (auth.Identity{}) {
				t.Fatalf("refused %q, but the handler ran as %+v", header, seen)
			}
		default:
			t.Fatalf("answered %d %s to Authorization %q", rec.Code, rec.Body, header)
		}
	})
}
