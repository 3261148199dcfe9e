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

	"seckill/internal/admission"
	"seckill/internal/auth"
	"seckill/internal/live"
	"seckill/internal/metrics"
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

// BenchmarkSoldOutChain is the server's whole middleware chain for POST
// /seckill/{voucherId}, as cmd/server's routes.go builds it (metrics,
// live recorder, Recover, Harden, ReadBody twice around the in-flight
// cap, the token, the user's rate), ending in a handler that answers
// sold_out as order.Handler.Seckill does once the memory knows the
// voucher sold out (without the voucher's lookup: that needs the
// stores). The users take turns, as loadtest/reject.sh's do, so that the
// token cache and the rate's buckets are looked up cold-ish, not one
// entry hot in the cache. The figure to compare is before against after
// a change, on the same machine; the recorder does not write headers the
// way net/http does, so the load test remains the measure of the whole.
func BenchmarkSoldOutChain(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tokens := auth.NewTokens(key, 2*time.Hour, nil, time.Now)
	const users = 4096
	bearers := make([]string, users)
	for i := range bearers {
		tok, err := tokens.Issue(b.Context(), auth.Identity{UserID: 271846193284534273 + int64(i), Role: auth.RoleUser})
		if err != nil {
			b.Fatal(err)
		}
		bearers[i] = "Bearer " + tok
	}
	const route = "/seckill/:voucherId"
	m := metrics.New(log)
	rec := live.NewRecorder(nil, log)
	fail := func(c *gin.Context, err error) { web.Error(c, log, err) }
	inFlight := admission.NewCap(1024).Limit(fail, "/healthz", "/readyz", "/metrics")
	r := gin.New()
	r.RemoteIPHeaders = []string{"X-Forwarded-For"}
	if err := r.SetTrustedProxies(nil); err != nil {
		b.Fatal(err)
	}
	r.Use(web.ReuseKeys())
	r.Use(web.Observe(route, m.ObserveSeckill, rec.Observe), web.Recover(log),
		web.Harden(), web.ReadBody(web.BodyTimeout, web.SmallBody), live.PassStreams("/vouchers/:id/room/events", live.PassStreams("/live/:voucherId/events", inFlight)),
		web.ReadBody(web.BodyTimeout, web.MaxBody))
	throttle := admission.NewBuckets(1e9, 1<<20, time.Now).PerUser(fail) // never refuses: every answer is sold_out
	r.POST(route, tokens.Authenticate(fail), throttle, func(c *gin.Context) {
		if _, ok := web.ID(c, "voucherId"); !ok {
			return
		}
		_ = auth.From(c).UserID
		web.Error(c, log, order.ErrSoldOut)
	})
	// One request and one writer for all iterations, so that what is
	// counted is the chain's own cost, not httptest's.
	req := httptest.NewRequest(http.MethodPost, "/seckill/7", nil)
	w := &sink{h: http.Header{}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req.Header["Authorization"] = bearers[i%users : i%users+1]
		i++
		clear(w.h)
		w.code = 0
		r.ServeHTTP(w, req)
		if w.code != http.StatusConflict {
			b.Fatalf("status %d", w.code)
		}
	}
}

// BenchmarkConstantChain is BenchmarkSoldOutChain's yardstick: the
// constant gin 409 of loadtest/yardstick -constant (no middleware, gin.H
// through encoding/json), through the same writer.
func BenchmarkConstantChain(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/seckill/:voucherId", func(c *gin.Context) {
		c.JSON(http.StatusConflict, gin.H{"error": gin.H{"code": "sold_out", "message": "sold out"}})
	})
	req := httptest.NewRequest(http.MethodPost, "/seckill/7", nil)
	req.Header.Set("Authorization", "Bearer "+token(b, auth.NewTokens(key, 2*time.Hour, nil, time.Now)))
	w := &sink{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		w.code = 0
		r.ServeHTTP(w, req)
		if w.code != http.StatusConflict {
			b.Fatalf("status %d", w.code)
		}
	}
}

// sink is a ResponseWriter that keeps the status and drops the body.
type sink struct {
	h    http.Header
	code int
}

func (s *sink) Header() http.Header { return s.h }

func (s *sink) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}

func (s *sink) Write(p []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return len(p), nil
}
