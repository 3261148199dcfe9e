package live

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
	"seckill/internal/web"
)

// seckillRoute is the buy button's route, as cmd/server declares it.
const seckillRoute = "/seckill/:voucherId"

// buyButton is a router shaped like the server's buy button behind rec:
// authentication first (no Authorization header: 401), then the user's
// rate (header X-Too-Fast: 429, before any lookup), then the handler,
// which finds the voucher first, as order.Service.Seckill does: an ID not
// in vouchers is not_found; a voucher answers what its query's answer
// says.
func buyButton(rec *Recorder, vouchers ...int64) http.Handler {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gin.SetMode(gin.TestMode)
	exists := map[int64]bool{}
	for _, id := range vouchers {
		exists[id] = true
	}
	r := gin.New()
	r.Use(rec.Middleware(seckillRoute))
	authn := func(c *gin.Context) {
		if c.GetHeader("Authorization") == "" {
			web.Error(c, log, apperr.New(apperr.Unauthorized, "no token"))
		}
	}
	throttle := func(c *gin.Context) {
		if c.GetHeader("X-Too-Fast") != "" {
			web.Error(c, log, apperr.RetryAfter(apperr.New(apperr.Busy, "too fast"), time.Second))
		}
	}
	r.POST(seckillRoute, authn, throttle, func(c *gin.Context) {
		id, ok := web.ID(c, "voucherId")
		if !ok {
			return
		}
		var err error
		switch {
		case !exists[id]:
			err = apperr.New(apperr.NotFound, "no such voucher")
		case c.Query("answer") == "sold_out":
			err = apperr.New(apperr.SoldOut, "sold out")
		}
		if err != nil {
			web.Error(c, log, err)
			return
		}
		c.Status(http.StatusOK)
	})
	return r
}

// press sends one request to the buy button: with a token unless
// anonymous, over the user's rate if tooFast.
func press(h http.Handler, id int64, query string, anonymous, tooFast bool) {
	req := httptest.NewRequest(http.MethodPost, "/seckill/"+itoa(id)+query, nil)
	if !anonymous {
		req.Header.Set("Authorization", "Bearer x")
	}
	if tooFast {
		req.Header.Set("X-Too-Fast", "1")
	}
	h.ServeHTTP(httptest.NewRecorder(), req)
}

// A flood of requests to made-up IDs, as many as the Recorder counts
// vouchers, without a token, with one, and over the user's rate, counts
// nothing and writes nothing; a real voucher is counted after it, from
// its first answer that proves it exists, and requests without a token
// are never counted, not even for it.
func TestRecorderCountsOnlyVouchersThatExist(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	ctx := context.Background()
	real := testenv.ID()
	rec := NewRecorder(rdb, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := buyButton(rec, real)

	madeUp := testenv.ID()
	for i := range int64(maxVouchers) {
		press(h, madeUp+i, "", i%3 == 0, i%3 == 1)
	}
	if n := rec.n.Load(); n != 0 {
		t.Fatalf("%d made-up vouchers counted, want none", n)
	}
	sec := time.Now().Unix()
	t.Cleanup(func() { rdb.Del(ctx, secondKey(real, sec), totalKey(real)) })
	rec.flush(ctx, sec)
	if len(rec.pending) != 0 {
		t.Fatalf("%d batches sent for made-up vouchers, want none", len(rec.pending))
	}

	press(h, real, "", false, true) // busy before any lookup: not yet known
	press(h, real, "", true, false) // no token: never counted
	press(h, real, "", false, false)
	press(h, real, "?answer=sold_out", false, false)
	press(h, real, "", false, true) // busy, now that it is known
	press(h, real, "", true, false)
	rec.flush(ctx, sec)
	got := rdb.HGetAll(ctx, secondKey(real, sec)).Val()
	want := map[string]string{"ok": "1", "sold_out": "1", "busy": "1"}
	for outcome, n := range want {
		if got[outcome] != n {
			t.Errorf("%s: %q, want %s (all: %v)", outcome, got[outcome], n, got)
		}
	}
	if got["unauthorized"] != "" {
		t.Errorf("requests without a token counted: %v", got)
	}
}

// When Redis does not take a flush, its counts are sent again with the
// next one, under the second they belong to, and counted once: whether
// Redis refused the connection (nothing ran) or ran the script and lost
// its reply (add.lua's marker turns the second try away).
func TestRecorderSendsAgainWhatRedisMissed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fault     func(p *faultproxy.Proxy) <-chan struct{} // nil: nothing to wait for
		heal      func(p *faultproxy.Proxy)
		ranBefore bool // the failed flush's counts reached Redis
	}{
		{"refused", func(p *faultproxy.Proxy) <-chan struct{} { p.Cut(); return nil }, (*faultproxy.Proxy).Heal, false},
		{"reply lost", func(p *faultproxy.Proxy) <-chan struct{} { return p.DropReplyAfter(faultproxy.RedisScript(addLua)) },
			func(*faultproxy.Proxy) {}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := testenv.Redis(t, 0)
			ctx := context.Background()
			p := faultproxy.Start(t, direct.Options().Addr)
			// No retries of go-redis' own: the Recorder's are the ones
			// under test.
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: time.Second})
			t.Cleanup(func() { rdb.Close() })
			rec := NewRecorder(rdb, slog.New(slog.NewTextHandler(io.Discard, nil)))
			id := testenv.ID()
			sec := time.Now().Unix()
			t.Cleanup(func() { direct.Del(ctx, secondKey(id, sec), totalKey(id)) })
			h := buyButton(rec, id)
			for range 3 {
				press(h, id, "", false, false)
			}

			fired := tc.fault(p)
			rec.flush(ctx, sec)
			if fired != nil {
				select {
				case <-fired:
				case <-time.After(5 * time.Second):
					t.Fatal("the fault did not fire")
				}
			}
			if len(rec.pending) != 1 {
				t.Fatalf("%d batches pending after the failed flush, want 1", len(rec.pending))
			}
			before := direct.HGet(ctx, totalKey(id), "ok").Val()
			if want := map[bool]string{true: "3", false: ""}[tc.ranBefore]; before != want {
				t.Fatalf("after the failed flush Redis holds ok %q, want %q", before, want)
			}

			tc.heal(p)
			press(h, id, "", false, false) // the next second's
			rec.flush(ctx, sec+1)
			if len(rec.pending) != 0 {
				t.Errorf("%d batches still pending", len(rec.pending))
			}
			if got := direct.HGet(ctx, secondKey(id, sec), "ok").Val(); got != "3" {
				t.Errorf("second %d: ok %q, want 3", sec, got)
			}
			if got := direct.HGet(ctx, totalKey(id), "ok").Val(); got != "4" {
				t.Errorf("total: ok %q, want 4", got)
			}
			direct.Del(ctx, secondKey(id, sec+1), sentKey(id, rec.id, 1), sentKey(id, rec.id, 2))
		})
	}
}
