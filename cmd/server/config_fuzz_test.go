package main

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
)

// FuzzLoadConfig gives loadConfig any value for the variables whose
// parsing is more than a lookup: durations, integers, a rate, a boolean,
// the trusted proxies, the DSN, the Redis address and the JWT secret. Run
// it with
//
//	go test -run '^$' -fuzz '^FuzzLoadConfig$' -fuzztime 30s ./cmd/server
//
// It never starts anything. It asserts that loadConfig never panics and
// either returns an error or a config that keeps what the code promises:
// see checkConfig.
func FuzzLoadConfig(f *testing.F) {
	type vars struct {
		hold, sweep, claim, redisDB, rate, devCodes, proxies, dsn, redisAddr, secret string
	}
	const (
		dsn    = "root:@tcp(127.0.0.1:3306)/seckill"
		secret = "0123456789abcdef0123456789abcdef"
	)
	for _, v := range []vars{
		{}, // the demo, all defaults
		{"15s", "5s", "5s", "0", "10", "false", "", dsn, "127.0.0.1:6379", secret},
		{"3s", "100ms", "1s", "1048576", "0", "1", "10.0.0.0/8, 192.168.1.10 ,::1,2001:db8::/32", dsn + "?readTimeout=900ms&timeout=1s", "redis:6379", secret},
		{"25s", "5s", "1m", "7", "0.5", "true", "::ffff:10.0.0.0/104", dsn + "?loc=Local&parseTime=false&innodb_lock_wait_timeout=3", "redis:6379", secret + "x"},
		{"25s", "6s", "5s", "0", "1e9", "TRUE", "0.0.0.0/0", dsn, "redis:6379", secret[:31]},
		{"2s", "50ms", "500ms", "-1", "-1", "yes", "10.0.0.0/33", "not a dsn", "", ""},
		{"1h", "0s", "0", "x", "NaN", "", "fe80::1%eth0,proxy.local", dsn + "?readTimeout=10s", "redis:6379", secret},
		{"soon", "-5s", "1.5h", "99999999999999999999", "+Inf", " true ", "::/0", "user:pass@unix(/tmp/mysql.sock)/db?charset=utf8mb4", "", secret},
		{"9223372036854775807ns", "1ns", "2562047h", "0x10", "0x1p3", "1", ",,,", "@/", "x", secret},
	} {
		f.Add(v.hold, v.sweep, v.claim, v.redisDB, v.rate, v.devCodes, v.proxies, v.dsn, v.redisAddr, v.secret)
	}
	gin.SetMode(gin.TestMode)

	f.Fuzz(func(t *testing.T, hold, sweep, claim, redisDB, rate, devCodes, proxies, dsn, redisAddr, secret string) {
		env := map[string]string{
			"STOCK_HOLD":      hold,
			"SWEEP_EVERY":     sweep,
			"CLAIM_IDLE":      claim,
			"REDIS_DB":        redisDB,
			"SECKILL_RATE":    rate,
			"AUTH_DEV_CODES":  devCodes,
			"TRUSTED_PROXIES": proxies,
			"MYSQL_DSN":       dsn,
			"REDIS_ADDR":      redisAddr,
			"JWT_SECRET":      secret,
			// The webhook's key is not fuzzed: without one, every real
			// stack's configuration would stop at it.
			"PAYMENT_WEBHOOK_SECRET": "fuzz-webhook-secret-0123456789abcdef",
		}
		c, err := loadConfig(func(name string) string { return env[name] })
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		checkConfig(t, c, env)
	})
}

// checkConfig fails t unless c, loaded from env without an error, keeps
// the promises of loadConfig.
func checkConfig(t *testing.T, c config, env map[string]string) {
	t.Helper()
	// The contract: stock taken by a process that died is sellable again
	// within 30s, at the first sweep after its hold (written so that no
	// sum can overflow).
	if c.StockHold < 3*time.Second || c.SweepEvery < 100*time.Millisecond ||
		c.StockHold > returnedWithin || c.SweepEvery > returnedWithin-c.StockHold {
		t.Fatalf("STOCK_HOLD %s and SWEEP_EVERY %s: want at least 3s and 100ms, adding up to 30s or less", c.StockHold, c.SweepEvery)
	}
	if c.ClaimIdle < time.Second {
		t.Fatalf("CLAIM_IDLE %s: want at least 1s", c.ClaimIdle)
	}
	for _, d := range []time.Duration{c.TokenTTL, c.ShutdownGrace, c.StartupWait, c.WriteTimeout(), c.MySQLTimeout(), c.HTTPWriteTimeout()} {
		if d <= 0 {
			t.Fatalf("a non-positive timeout %s in %+v", d, c)
		}
	}
	if c.RedisDB < 0 || c.RedisDB > 1<<20 {
		t.Fatalf("REDIS_DB %d", c.RedisDB)
	}
	if math.IsNaN(c.SeckillRate) || c.SeckillRate < 0 || c.SeckillRate > 1e9 {
		t.Fatalf("SECKILL_RATE %v", c.SeckillRate)
	}

	// The demo, or the real stack with a secret long enough for HS256,
	// and login codes in answers only when asked for.
	if c.embedded() {
		if len(c.JWTSecret) == 0 {
			t.Fatal("the demo signs tokens with an empty key")
		}
	} else {
		if c.MySQLDSN == "" || len(c.Redis.Addrs) != 1 || c.Redis.Addrs[0] != strings.TrimSpace(env["REDIS_ADDR"]) {
			t.Fatalf("MYSQL_DSN %q with Redis %q from REDIS_ADDR %q", c.MySQLDSN, c.Redis.Addrs, env["REDIS_ADDR"])
		}
		if len(c.JWTSecret) < minJWTSecret {
			t.Fatalf("a JWT secret of %d bytes outside the demo", len(c.JWTSecret))
		}
		if v := strings.TrimSpace(env["AUTH_DEV_CODES"]); c.DevCodes && v != "true" && v != "1" {
			t.Fatalf("AUTH_DEV_CODES %q turned dev codes on outside the demo", env["AUTH_DEV_CODES"])
		}
	}

	// The DSN the server opens: times as time.Time in UTC, timeouts set,
	// and a stalled COMMIT given up on before the hold expires.
	if c.MySQLDSN != "" {
		cfg, err := mysql.ParseDSN(c.MySQLDSN)
		if err != nil {
			t.Fatalf("normalised MYSQL_DSN %q does not parse: %v", c.MySQLDSN, err)
		}
		if !cfg.ParseTime || cfg.Loc != time.UTC || !cfg.InterpolateParams || cfg.Timeout <= 0 {
			t.Fatalf("normalised MYSQL_DSN %q: want parseTime, loc=UTC, interpolateParams and a timeout", c.MySQLDSN)
		}
		for _, d := range []time.Duration{cfg.ReadTimeout, cfg.WriteTimeout} {
			if d <= 0 || c.WriteTimeout()+d >= c.StockHold {
				t.Fatalf("normalised MYSQL_DSN %q: a timeout of %s with the write deadline %s reaches STOCK_HOLD %s", c.MySQLDSN, d, c.WriteTimeout(), c.StockHold)
			}
		}
	}

	// Trusted proxies: a list gin takes, none of which trusts every
	// peer, as gin matches peers (run would fail, or let any client
	// name its own address).
	if err := gin.New().SetTrustedProxies(c.TrustedProxies); err != nil {
		t.Fatalf("gin refuses TRUSTED_PROXIES %q: %v", c.TrustedProxies, err)
	}
	for _, p := range c.TrustedProxies {
		for _, ends := range [][2]string{
			{"0.0.0.0", "255.255.255.255"},
			{"::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		} {
			if trusts(t, p, ends[0]) && trusts(t, p, ends[1]) {
				t.Fatalf("TRUSTED_PROXIES entry %q trusts every peer from %s to %s", p, ends[0], ends[1])
			}
		}
	}
}

// trusts reports whether gin, told to trust proxy, takes the client's
// address from X-Forwarded-For when the peer is peer.
func trusts(t *testing.T, proxy, peer string) bool {
	t.Helper()
	r := gin.New()
	if err := r.SetTrustedProxies([]string{proxy}); err != nil {
		t.Fatalf("gin refuses %q: %v", proxy, err)
	}
	const forwarded = "198.51.100.99"
	var client string
	r.GET("/", func(c *gin.Context) { client = c.ClientIP() })
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "[" + peer + "]:1234"
	req.Header.Set("X-Forwarded-For", forwarded)
	r.ServeHTTP(httptest.NewRecorder(), req)
	return client == forwarded
}
