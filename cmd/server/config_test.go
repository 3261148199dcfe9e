package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/auth"
)

// realEnv is the least environment of the real stack.
var realEnv = map[string]string{
	"MYSQL_DSN":              "root:@tcp(127.0.0.1:3306)/seckill",
	"REDIS_ADDR":             "127.0.0.1:6379",
	"JWT_SECRET":             "0123456789abcdef0123456789abcdef", // 32 bytes, the least accepted
	"PAYMENT_WEBHOOK_SECRET": "0123456789abcdef0123456789abcdef",
}

// withEnv is base with the pairs kv set (a copy).
func withEnv(base map[string]string, kv ...string) map[string]string {
	m := map[string]string{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestLoadConfig(t *testing.T) {
	real, with := realEnv, withEnv
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" for none
	}{
		{"embedded", map[string]string{}, ""},
		{"real stack", real, ""},
		{"no JWT_SECRET with MySQL and Redis", with(real, "JWT_SECRET", ""), "JWT_SECRET must be set"},
		{"short JWT_SECRET", with(real, "JWT_SECRET", "short"), "JWT_SECRET must be set"},
		{"JWT_SECRET of 31 bytes", with(real, "JWT_SECRET", "0123456789abcdef0123456789abcde"), "JWT_SECRET must be set (32 bytes or more, not counting spaces around it; it has 31)"},
		{"JWT_SECRET of blanks", with(real, "JWT_SECRET", "        short          \n         "), "it has 5)"},
		{"short JWT_SECRET in the demo", map[string]string{"JWT_SECRET": "short"}, ""},
		{"no PAYMENT_WEBHOOK_SECRET with MySQL and Redis", with(real, "PAYMENT_WEBHOOK_SECRET", ""), "PAYMENT_WEBHOOK_SECRET must be set"},
		{"PAYMENT_WEBHOOK_SECRET of 31 bytes", with(real, "PAYMENT_WEBHOOK_SECRET", "0123456789abcdef0123456789abcde"), "PAYMENT_WEBHOOK_SECRET must be set (32 bytes or more, not counting spaces around it; it has 31)"},
		{"PAYMENT_WEBHOOK_SECRET of blanks", with(real, "PAYMENT_WEBHOOK_SECRET", "   short   \n  "), "it has 5)"},
		{"no PAYMENT_WEBHOOK_SECRET in the demo", map[string]string{}, ""},
		{"only MYSQL_DSN", map[string]string{"MYSQL_DSN": real["MYSQL_DSN"], "JWT_SECRET": real["JWT_SECRET"]}, "set both MYSQL_DSN and REDIS_ADDR"},
		{"bad DSN", with(real, "MYSQL_DSN", "not a dsn"), "MYSQL_DSN is not a valid"},
		{"bad mode", with(real, "SECKILL_MODE", "fast"), "SECKILL_MODE"},
		{"bad lock backend", with(real, "LOCK_BACKEND", "zk"), "LOCK_BACKEND"},
		{"redlock without nodes", with(real, "LOCK_BACKEND", "redlock"), "REDLOCK_ADDRS"},
		{"bad number", with(real, "REDIS_DB", "x"), "REDIS_DB"},
		{"bad duration", with(real, "STOCK_HOLD", "soon"), "STOCK_HOLD"},
		{"hold too short", with(real, "STOCK_HOLD", "1s"), "STOCK_HOLD"},
		{"shortest hold", with(real, "STOCK_HOLD", "3s", "SWEEP_EVERY", "100ms"), ""},

		// A dead process's unit comes back at the first sweep after its
		// hold expires: both together must fit the contract's 30s.
		{"hold and sweep at 30s", with(real, "STOCK_HOLD", "25s", "SWEEP_EVERY", "5s"), ""},
		{"hold and sweep over 30s", with(real, "STOCK_HOLD", "25s", "SWEEP_EVERY", "6s"), "STOCK_HOLD (25s) + SWEEP_EVERY (6s) is 31s, over the 30s"},
		{"hold alone over 30s", with(real, "STOCK_HOLD", "31s"), "lower STOCK_HOLD or SWEEP_EVERY"},
		{"sweep too often", with(real, "SWEEP_EVERY", "50ms"), "SWEEP_EVERY must be at least 100ms (it is 50ms)"},
		{"claim too soon", with(real, "CLAIM_IDLE", "500ms"), "CLAIM_IDLE must be at least 1s (it is 500ms)"},
		{"shortest claim", with(real, "CLAIM_IDLE", "1s"), ""},

		// The buy button's rate and the instance's cap.
		{"rate off", with(real, "SECKILL_RATE", "0"), ""},
		{"fractional rate", with(real, "SECKILL_RATE", "0.5"), ""},
		{"negative rate", with(real, "SECKILL_RATE", "-1"), "SECKILL_RATE must be a number"},
		{"rate not a number", with(real, "SECKILL_RATE", "NaN"), "SECKILL_RATE must be a number"},
		{"burst of none", with(real, "SECKILL_BURST", "0"), "SECKILL_BURST"},
		{"cap off", with(real, "MAX_IN_FLIGHT", "0"), ""},
		{"negative cap", with(real, "MAX_IN_FLIGHT", "-1"), "MAX_IN_FLIGHT"},

		// A token's life is bounded: a stolen one works until it
		// expires, and a logout everywhere is remembered only that long.
		{"token TTL of a day", with(real, "TOKEN_TTL", "24h"), ""},
		{"token TTL over a day", with(real, "TOKEN_TTL", "24h0m1s"), "TOKEN_TTL must be at most 24h (it is 24h0m1s)"},
		{"token TTL of a year", with(real, "TOKEN_TTL", "8760h"), "TOKEN_TTL must be at most 24h (it is 8760h0m0s)"},
		{"token TTL of a year in the demo", map[string]string{"TOKEN_TTL": "8760h"}, "TOKEN_TTL must be at most 24h"},
		{"no token TTL", with(real, "TOKEN_TTL", "0"), "TOKEN_TTL must be a positive duration"},

		// Login code limits: 0 turns the sending limits off, and any
		// size is fine; the guess limits cannot be turned off.
		{"code limits off", with(real, "AUTH_CODE_INTERVAL", "0", "AUTH_CODES_PER_DAY", "0", "AUTH_CODES_PER_ADDR_PER_MIN", "0"), ""},
		{"code limits large", with(real, "AUTH_CODE_INTERVAL", "24h", "AUTH_CODES_PER_DAY", "1000000000", "AUTH_CODES_PER_ADDR_PER_MIN", "1000000000"), ""},
		{"code limits in the demo", map[string]string{"AUTH_CODE_INTERVAL": "0", "AUTH_CODES_PER_ADDR_PER_MIN": "0"}, ""},
		{"code interval under a second", with(real, "AUTH_CODE_INTERVAL", "500ms"), "AUTH_CODE_INTERVAL must be 0 (off) or a duration of at least 1s such as 1m0s"},
		{"negative code interval", with(real, "AUTH_CODE_INTERVAL", "-1m"), "AUTH_CODE_INTERVAL must be 0 (off)"},
		{"code interval not a duration", with(real, "AUTH_CODE_INTERVAL", "60"), "AUTH_CODE_INTERVAL must be 0 (off)"},
		{"negative codes per day", with(real, "AUTH_CODES_PER_DAY", "-1"), "AUTH_CODES_PER_DAY must be an integer from 0 (no limit) to 1000000000"},
		{"codes per address not a number", with(real, "AUTH_CODES_PER_ADDR_PER_MIN", "many"), "AUTH_CODES_PER_ADDR_PER_MIN must be an integer from 0 (no limit)"},
		{"codes per address too many", with(real, "AUTH_CODES_PER_ADDR_PER_MIN", "1000000001"), "AUTH_CODES_PER_ADDR_PER_MIN must be an integer from 0 (no limit)"},
		{"no free guesses", with(real, "AUTH_FREE_GUESSES", "0", "AUTH_FREE_GUESSES_PER_ADDR", "0"), ""},
		{"negative free guesses", with(real, "AUTH_FREE_GUESSES", "-1"), "AUTH_FREE_GUESSES must be an integer from 0 to 1000"},
		{"free guesses per address not a number", with(real, "AUTH_FREE_GUESSES_PER_ADDR", "ten"), "AUTH_FREE_GUESSES_PER_ADDR must be an integer from 0 to 100000"},
		{"no longest guess delay", with(real, "AUTH_MAX_GUESS_DELAY", "0"), "AUTH_MAX_GUESS_DELAY must be a positive duration"},
		{"longest guess delay under a second", with(real, "AUTH_MAX_GUESS_DELAY", "500ms"), "AUTH_MAX_GUESS_DELAY must be from 1s to 24h (it is 500ms)"},
		{"longest address delay over a day", with(real, "AUTH_MAX_ADDR_DELAY", "25h"), "AUTH_MAX_ADDR_DELAY must be from 1s to 24h (it is 25h0m0s)"},
		{"phone guesses past ASVS' 100 an hour", with(real, "AUTH_PHONE_GUESSES_PER_HOUR", "101"), "AUTH_PHONE_GUESSES_PER_HOUR must be an integer from 1 to 100"},
		{"no phone guesses", with(real, "AUTH_PHONE_GUESSES_PER_HOUR", "0"), "AUTH_PHONE_GUESSES_PER_HOUR must be an integer from 1 to 100"},
		{"no attack threshold", with(real, "AUTH_ATTACK_GUESSES_PER_MIN", "0"), "AUTH_ATTACK_GUESSES_PER_MIN must be an integer from 1 to 1000000000"},
		{"trust under a minute", with(real, "AUTH_TRUST_FOR", "30s"), "AUTH_TRUST_FOR must be at least 1m (it is 30s)"},
		{"the old lock's settings", with(real, "AUTH_LOCK_FOR", "15m"), "AUTH_LOCK_FOR is no longer read: a phone is not locked after wrong codes any more"},
		{"the old guesses per day", with(real, "AUTH_GUESSES_PER_DAY", "10"), "AUTH_GUESSES_PER_DAY is no longer read"},
		{"the old guesses per code", with(real, "AUTH_GUESSES_PER_CODE", "5"), "AUTH_GUESSES_PER_CODE is no longer read"},

		// METRICS_ADDR: a listen address of its own, or unset.
		{"metrics on a port of their own", with(real, "METRICS_ADDR", ":9090"), ""},
		{"metrics on a private address", with(real, "METRICS_ADDR", "10.0.0.5:9090"), ""},
		{"metrics address without a port", with(real, "METRICS_ADDR", "9090"), `METRICS_ADDR "9090" is not host:port`},
		{"metrics address with an empty port", with(real, "METRICS_ADDR", "10.0.0.5:"), `METRICS_ADDR "10.0.0.5:" is not host:port`},
		{"metrics on the main address", with(real, "HTTP_ADDR", ":8080", "METRICS_ADDR", ":8080"), "METRICS_ADDR must differ from HTTP_ADDR"},
		{"profiles on the metrics port", with(real, "METRICS_ADDR", ":9090", "PPROF", "true"), ""},
		{"profiles without a private port", with(real, "PPROF", "true"), "PPROF serves the profiles on METRICS_ADDR's private port"},
		{"a pipeline sender count out of range", with(real, "REDIS_PIPELINES", "65"), "REDIS_PIPELINES"},

		// TRUSTED_PROXIES: IPs and CIDRs, as gin takes them, but never
		// one that trusts every peer.
		{"trusted proxies", with(real, "TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.10 ,::1,2001:db8::/32"), ""},
		{"trusted proxy not an address", with(real, "TRUSTED_PROXIES", "10.0.0.1,proxy.local"), `TRUSTED_PROXIES: "proxy.local" is neither an IP address nor a CIDR`},
		{"trusted proxy with a bad prefix", with(real, "TRUSTED_PROXIES", "10.0.0.0/33"), `TRUSTED_PROXIES: "10.0.0.0/33" is neither`},
		{"trusted proxy with a zone", with(real, "TRUSTED_PROXIES", "fe80::1%eth0"), `TRUSTED_PROXIES: "fe80::1%eth0" is neither`},
		{"every IPv4 peer trusted", with(real, "TRUSTED_PROXIES", "0.0.0.0/0"), `TRUSTED_PROXIES: "0.0.0.0/0" trusts every peer`},
		{"every IPv6 peer trusted", with(real, "TRUSTED_PROXIES", "10.0.0.1,::/0"), `TRUSTED_PROXIES: "::/0" trusts every peer`},
		// Where Redis is: one node, Sentinel, or a Cluster (database 0).
		{"sentinel", with(real, "REDIS_ADDR", "", "REDIS_ADDRS", "10.0.0.1:26379,10.0.0.2:26379", "REDIS_MASTER_NAME", "m"), ""},
		{"one node in REDIS_ADDRS", with(real, "REDIS_ADDR", "", "REDIS_ADDRS", "10.0.0.1:6379"), ""},
		{"REDIS_ADDRS alone is the real stack", with(real, "REDIS_ADDR", "", "MYSQL_DSN", "", "REDIS_ADDRS", "10.0.0.1:6379"), "set both MYSQL_DSN and REDIS_ADDR (or REDIS_ADDRS)"},
		{"REDIS_ADDR and REDIS_ADDRS", with(real, "REDIS_ADDRS", "10.0.0.1:6379"), "not both"},
		{"a cluster", with(real, "REDIS_ADDR", "", "REDIS_ADDRS", "10.0.0.1:6379,10.0.0.2:6379"), ""},
		{"a cluster's database 1", with(real, "REDIS_ADDR", "", "REDIS_ADDRS", "10.0.0.1:6379,10.0.0.2:6379", "REDIS_DB", "1"), "a Redis Cluster has only database 0"},
		{"async on a cluster", with(real, "REDIS_ADDR", "", "REDIS_ADDRS", "10.0.0.1:6379,10.0.0.2:6379", "SECKILL_MODE", "async"), ""},
		{"a master name without sentinels", with(real, "REDIS_MASTER_NAME", "m"), "REDIS_MASTER_NAME needs REDIS_ADDRS"},
		{"a Redis address without a port", with(real, "REDIS_ADDR", "", "REDIS_ADDRS", "10.0.0.1", "REDIS_MASTER_NAME", "m"), `Redis address "10.0.0.1" is not host:port`},
		{"a Redis CA file that is not there", with(real, "REDIS_TLS", "true", "REDIS_TLS_CA", "/nonexistent/ca.pem"), "REDIS_TLS_CA: open /nonexistent/ca.pem"},
		{"a Redis CA file without a certificate", with(real, "REDIS_TLS", "true", "REDIS_TLS_CA", "config_test.go"), "REDIS_TLS_CA: no PEM certificate"},
		{"a sentinel password without Sentinel", with(real, "REDIS_SENTINEL_PASSWORD", "x"), "REDIS_SENTINEL_PASSWORD is for the sentinels"},
		{"every IPv4 peer trusted in two halves", with(real, "TRUSTED_PROXIES", "0.0.0.0/1,128.0.0.0/1"), `TRUSTED_PROXIES: "0.0.0.0/1" is wider than /8`},
		{"IPv4-mapped halves", with(real, "TRUSTED_PROXIES", "::ffff:128.0.0.0/97"), `TRUSTED_PROXIES: "::ffff:128.0.0.0/97" is wider than /8`},
		{"every IPv6 peer trusted in two halves", with(real, "TRUSTED_PROXIES", "8000::/1,::/1"), `TRUSTED_PROXIES: "8000::/1" is wider than /16`},
		{"a wide slice of global IPv6", with(real, "TRUSTED_PROXIES", "2000::/7"), `TRUSTED_PROXIES: "2000::/7" is wider than /16`},
		{"private ranges trusted", with(real, "TRUSTED_PROXIES", "10.0.0.0/8,172.16.0.0/12,fc00::/7"), ""},

		// The DSN's own timeouts: the write deadline (STOCK_HOLD/3, 5s)
		// plus either must stay under the hold (15s).
		{"DSN readTimeout kept", with(real, "MYSQL_DSN", real["MYSQL_DSN"]+"?readTimeout=9s"), ""},
		{"DSN readTimeout reaches the hold", with(real, "MYSQL_DSN", real["MYSQL_DSN"]+"?readTimeout=10s"),
			"MYSQL_DSN sets readTimeout=10s, which with the write deadline of 5s (STOCK_HOLD/3) reaches STOCK_HOLD (15s)"},
		{"DSN readTimeout of the old default", with(real, "MYSQL_DSN", real["MYSQL_DSN"]+"?readTimeout=30s"), "set readTimeout below 10s, or leave it out of the DSN"},
		{"DSN writeTimeout reaches the hold", with(real, "MYSQL_DSN", real["MYSQL_DSN"]+"?writeTimeout=1m"), "MYSQL_DSN sets writeTimeout=1m0s"},
		{"DSN readTimeout with a short hold", with(real, "STOCK_HOLD", "6s", "MYSQL_DSN", real["MYSQL_DSN"]+"?readTimeout=5s"), "set readTimeout below 4s"},
		{"invalid hold with a DSN readTimeout", with(real, "STOCK_HOLD", "soon", "MYSQL_DSN", real["MYSQL_DSN"]+"?readTimeout=1h"), "STOCK_HOLD must be a positive duration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(func(k string) string { return tc.env[k] })
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			}
		})
	}

	t.Run("defaults", func(t *testing.T) {
		c, err := loadConfig(func(k string) string { return real[k] })
		if err != nil {
			t.Fatal(err)
		}
		if c.DevCodes || len(c.AdminPhones) != 0 || c.Mode != "sync" || c.LockBackend != "redis" || c.HTTPAddr != ":8080" {
			t.Errorf("real-stack defaults: %+v", c)
		}
		if d, err := mysql.ParseDSN(c.MySQLDSN); err != nil || !d.ParseTime || d.Loc != time.UTC {
			t.Errorf("DSN not normalised to parseTime=true, loc=UTC: %s", c.MySQLDSN)
		}
		e, err := loadConfig(func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if !e.DevCodes || len(e.AdminPhones) != 1 || e.AdminPhones[0] != "13800000000" || len(e.JWTSecret) < 32 {
			t.Errorf("embedded defaults: %+v", e)
		}
		// The documented limits, and no proxy trusted, in both.
		for name, cfg := range map[string]config{"real stack": c, "embedded": e} {
			if cfg.SeckillRate != 10 || cfg.SeckillBurst != 20 || cfg.MaxInFlight != 4*cfg.RedisPoolSize {
				t.Errorf("%s: buy button %v/s burst %d, cap %d; want 10/s, 20, 4 × REDIS_POOL_SIZE", name, cfg.SeckillRate, cfg.SeckillBurst, cfg.MaxInFlight)
			}
			want := auth.DefaultLimits
			if name == "embedded" {
				want.CodesPerAddrPerMin = 0 // the demo is on loopback: a load test logs its users in from one address
			}
			if cfg.AuthLimits != want {
				t.Errorf("%s: login code limits %+v, want %+v", name, cfg.AuthLimits, want)
			}
			if cfg.TrustedProxies != nil {
				t.Errorf("%s: trusted proxies %q, want none", name, cfg.TrustedProxies)
			}
		}
		want := auth.Limits{CodeInterval: time.Minute, CodesPerDay: 10, CodesPerAddrPerMin: 20,
			FreeGuesses: 3, MaxGuessDelay: 15 * time.Minute, FreeGuessesPerAddr: 10, MaxAddrDelay: time.Hour,
			PhoneGuessesPerHour: 20, AttackGuessesPerMin: 1000, TrustFor: 30 * 24 * time.Hour}
		if auth.DefaultLimits != want {
			t.Errorf("auth.DefaultLimits = %+v, want the documented %+v", auth.DefaultLimits, want)
		}
	})

	t.Run("redis settings are read", func(t *testing.T) {
		c, err := loadConfig(func(k string) string {
			return with(real, "REDIS_ADDR", "", "REDIS_ADDRS", " 10.0.0.1:26379, 10.0.0.2:26379 ", "REDIS_MASTER_NAME", "m",
				"REDIS_USERNAME", "seckill", "REDIS_PASSWORD", "pw", "REDIS_SENTINEL_PASSWORD", "spw", "REDIS_TLS", "true")[k]
		})
		if err != nil {
			t.Fatal(err)
		}
		want := redisConfig{Addrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"}, MasterName: "m", Username: "seckill", Password: "pw", SentinelPassword: "spw", TLS: true}
		if !reflect.DeepEqual(c.Redis, want) {
			t.Errorf("redis %+v, want %+v", c.Redis, want)
		}
		if c, err := loadConfig(func(k string) string { return real[k] }); err != nil || !reflect.DeepEqual(c.Redis, redisConfig{Addrs: []string{"127.0.0.1:6379"}}) {
			t.Errorf("REDIS_ADDR alone: %+v, %v", c.Redis, err)
		}
	})

	t.Run("login code limits are read", func(t *testing.T) {
		c, err := loadConfig(func(k string) string {
			return with(real, "AUTH_CODE_INTERVAL", "90s", "AUTH_CODES_PER_DAY", "3", "AUTH_CODES_PER_ADDR_PER_MIN", "0",
				"AUTH_FREE_GUESSES", "5", "AUTH_MAX_GUESS_DELAY", "10m", "AUTH_FREE_GUESSES_PER_ADDR", "50",
				"AUTH_MAX_ADDR_DELAY", "2h", "AUTH_PHONE_GUESSES_PER_HOUR", "100", "AUTH_ATTACK_GUESSES_PER_MIN", "5000",
				"AUTH_TRUST_FOR", "168h",
				"TRUSTED_PROXIES", "10.1.0.0/16,10.2.0.1")[k]
		})
		if err != nil {
			t.Fatal(err)
		}
		want := auth.Limits{CodeInterval: 90 * time.Second, CodesPerDay: 3, CodesPerAddrPerMin: 0,
			FreeGuesses: 5, MaxGuessDelay: 10 * time.Minute, FreeGuessesPerAddr: 50, MaxAddrDelay: 2 * time.Hour,
			PhoneGuessesPerHour: 100, AttackGuessesPerMin: 5000, TrustFor: 7 * 24 * time.Hour}
		if c.AuthLimits != want {
			t.Errorf("limits %+v, want %+v", c.AuthLimits, want)
		}
		if strings.Join(c.TrustedProxies, " ") != "10.1.0.0/16 10.2.0.1" {
			t.Errorf("trusted proxies %q", c.TrustedProxies)
		}
	})

	// The DSN's read and write timeouts follow the hold unless the DSN
	// sets its own; the HTTP server's write timeout follows it too.
	t.Run("derived timeouts", func(t *testing.T) {
		tests := []struct {
			name                string
			env                 map[string]string
			read, write, dial   time.Duration
			writeDeadline, http time.Duration
		}{
			{"default hold", real, 5 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second, 55 * time.Second},
			{"hold of 6s", with(real, "STOCK_HOLD", "6s"), 2 * time.Second, 2 * time.Second, 5 * time.Second, 2 * time.Second, 28 * time.Second},
			{"shortest hold", with(real, "STOCK_HOLD", "3s"), time.Second, time.Second, 5 * time.Second, time.Second, 19 * time.Second},
			{"the DSN's own", with(real, "MYSQL_DSN", real["MYSQL_DSN"]+"?readTimeout=3s&writeTimeout=2s&timeout=1s"), 3 * time.Second, 2 * time.Second, time.Second, 5 * time.Second, 55 * time.Second},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				c, err := loadConfig(func(k string) string { return tc.env[k] })
				if err != nil {
					t.Fatal(err)
				}
				d, err := mysql.ParseDSN(c.MySQLDSN)
				if err != nil {
					t.Fatal(err)
				}
				if d.ReadTimeout != tc.read || d.WriteTimeout != tc.write || d.Timeout != tc.dial {
					t.Errorf("DSN readTimeout %s, writeTimeout %s, timeout %s; want %s, %s, %s", d.ReadTimeout, d.WriteTimeout, d.Timeout, tc.read, tc.write, tc.dial)
				}
				if got := c.WriteTimeout(); got != tc.writeDeadline {
					t.Errorf("WriteTimeout %s, want %s", got, tc.writeDeadline)
				}
				if got := c.HTTPWriteTimeout(); got != tc.http {
					t.Errorf("HTTPWriteTimeout %s, want %s", got, tc.http)
				}
				// What the defaults are for: a COMMIT sent at the write
				// deadline is answered, or given up on, inside the hold.
				if c.WriteTimeout()+d.ReadTimeout >= c.StockHold {
					t.Errorf("write deadline %s + readTimeout %s reaches the hold %s", c.WriteTimeout(), d.ReadTimeout, c.StockHold)
				}
			})
		}
	})
}

// The server runs its per-user lock on RedLock over three redis-server
// processes of the test's own, and sells exactly its stock.
func TestSaleWithRedLockBackend(t *testing.T) {
	st := newStack(t, 0)
	var addrs []string
	for range 3 {
		addr, _ := privateRedis(t)
		addrs = append(addrs, addr)
	}
	insts := startMany(t, st, 2, "LOCK_BACKEND", "redlock", "REDLOCK_ADDRS", strings.Join(addrs, ","))
	admin, _ := mustLogin(t, insts[0].Base, adminPhone)
	vid := openVoucher(t, insts[0].Base, admin, 20)
	users := loginMany(t, insts[0].Base, 60)
	var l ledger
	rush(&l, insts, users, vid, 2)
	onlyExpected(t, &l, "sold_out", "already_ordered")
	if won := l.wins(t); len(won) != 20 {
		t.Errorf("%d won, want 20", len(won))
	}
}
