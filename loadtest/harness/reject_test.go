// Package harness measures, in process and without Redis or a network, the
// CPU the server's reject path spends on top of the yardstick's: the
// middleware chain, the token check and the error envelope. loadtest/reject.sh
// measures the whole path over HTTP; these benchmarks say where the
// difference goes.
//
//	go test -run '^$' -bench . -benchmem -count 5 ./loadtest/harness/
package harness

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/auth"
	"seckill/internal/order"
	"seckill/internal/web"
)

var key = []byte("harness-only-secret-0123456789abcdef")

func token(b *testing.B, tokens *auth.Tokens) string {
	b.Helper()
	tok, err := tokens.Issue(b.Context(), auth.Identity{UserID: 271846193284534273, Role: auth.RoleUser})
	if err != nil {
		b.Fatal(err)
	}
	return tok
}

// BenchmarkVerify is the token check every authenticated request pays.
func BenchmarkVerify(b *testing.B) {
	tokens := auth.NewTokens(key, 2*time.Hour, nil, time.Now)
	tok := token(b, tokens)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tokens.Verify(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHMACFloor is the cryptographic floor of Verify: one
// HMAC-SHA256 over the token's signing input, compared in constant time.
func BenchmarkHMACFloor(b *testing.B) {
	tok := token(b, auth.NewTokens(key, 2*time.Hour, nil, time.Now))
	dot := strings.LastIndexByte(tok, '.')
	input := []byte(tok[:dot])
	sig, err := base64.RawURLEncoding.DecodeString(tok[dot+1:])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m := hmac.New(sha256.New, key)
		m.Write(input)
		if !hmac.Equal(m.Sum(nil), sig) {
			b.Fatal("bad signature")
		}
	}
}

// BenchmarkRejectChain runs one POST /seckill/7 through a gin engine into a
// handler that rejects at once, as both programs do after their one Redis
// call: "yardstick" is the yardstick's engine (no middleware, gin.H
// error), "server" has the server's middleware (Recover, ReadBody,
// Authenticate), path parsing and error envelope. The difference is what
// the server's reject path costs beyond one EVALSHA.
func BenchmarkRejectChain(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tokens := auth.NewTokens(key, 2*time.Hour, nil, time.Now)
	bearer := "Bearer " + token(b, tokens)

	yard := gin.New()
	yard.POST("/seckill/:voucherId", func(c *gin.Context) {
		_ = c.GetHeader("Authorization")
		c.JSON(http.StatusConflict, gin.H{"error": gin.H{"code": "sold_out", "message": "sold out"}})
	})

	srv := gin.New()
	srv.HandleMethodNotAllowed = true
	srv.Use(web.Recover(log), web.ReadBody(web.BodyTimeout, web.MaxBody))
	fail := func(c *gin.Context, err error) { web.Error(c, log, err) }
	srv.POST("/seckill/:voucherId", tokens.Authenticate(fail), func(c *gin.Context) {
		if _, ok := web.ID(c, "voucherId"); !ok {
			return
		}
		_ = auth.From(c).UserID
		web.Error(c, log, order.ErrAlreadyOrdered)
	})

	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"yardstick", yard}, {"server", srv}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/seckill/7", nil)
				req.Header.Set("Authorization", bearer)
				w := httptest.NewRecorder()
				tc.h.ServeHTTP(w, req)
				if w.Code != http.StatusConflict {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
