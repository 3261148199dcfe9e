package main

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/auth"
	"seckill/internal/order"
	"seckill/internal/payment"
	"seckill/internal/tracing"
	"seckill/internal/web"
)

// config is everything run reads from the environment. Only cmd/server
// reads the environment; packages get plain values.
type config struct {
	HTTPAddr    string
	MetricsAddr string         // GET /metrics alone, unauthenticated; "": on HTTPAddr, for admins
	Pprof       bool           // PPROF: Go's profiles at /debug/pprof/ on MetricsAddr
	Tracing     tracing.Config // OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME
	MySQLDSN    string         // normalised: parseTime=true, loc=UTC
	// MySQLNodes are more nodes of the DSN's cluster (MYSQL_NODES), in the
	// order to fall back on them when the DSN's node is down or not
	// Synced (package dbnodes); empty: the DSN's node alone.
	MySQLNodes  []string
	RedisDB     int
	Redis       redisConfig // REDIS_ADDR or REDIS_ADDRS, and how to reach them
	JWTSecret   []byte
	AdminPhones []string
	DevCodes    bool
	LiveCrowd   bool // LIVE_CROWD: admins may start a simulated crowd from /live
	// PaymentSecret is the key the payment provider signs its webhook
	// calls with (PAYMENT_WEBHOOK_SECRET); PaymentFake puts the fake
	// provider (payment.Fake) behind POST /orders/{id}/pay.
	PaymentSecret []byte
	PaymentFake   bool
	Mode          string // sync or async
	LockBackend   string // redis, redlock or local
	RedLockAddrs  []string
	MySQLMaxConns int
	RedisPoolSize int
	// RedisPipelines is how many senders share concurrent requests'
	// commands out in pipelines (package autopipe); 0: each command alone.
	RedisPipelines int
	// Writers is how many group-commit loops write sync mode's orders.
	Writers       int
	TokenTTL      time.Duration
	StockHold     time.Duration
	SweepEvery    time.Duration
	ShutdownGrace time.Duration
	StartupWait   time.Duration
	Consumer      string        // async mode: this instance's consumer name
	ClaimIdle     time.Duration // async mode: idle time before another consumer's entries are claimed
	Batch         int           // async mode: entries written per transaction
	MaxDeliveries int64         // async mode: deliveries after which an entry MySQL keeps refusing is dead-lettered
	AuthLimits    auth.Limits   // login codes: how often sent, how often guessed
	// TrustedProxies are the IPs and CIDRs whose X-Forwarded-For names
	// the client's address; empty: none, the address is the peer's.
	TrustedProxies []string
	// The buy button's per-user token bucket: SeckillRate requests a
	// second, SeckillBurst at once (0 rate: off); and the requests one
	// instance works on at once, beyond which it answers 429 at once.
	SeckillRate  float64
	SeckillBurst int
	MaxInFlight  int
	// BodyTimeout is how long a request's body may take to arrive
	// (HTTP_BODY_TIMEOUT; web.ReadBody), before it may take a slot.
	BodyTimeout time.Duration
	// MaxConnsPerAddr caps the connections one client address holds
	// open (0: no cap); the trusted proxies are not capped.
	MaxConnsPerAddr int
	// DevSettings names the development settings that are on
	// (AUTH_DEV_CODES, LIVE_CROWD, PAYMENT_FAKE), for the warning logged
	// at start; DevOnNetwork (ALLOW_DEV_SETTINGS_ON_NETWORK) lets them
	// listen beyond loopback. LoopbackFrom is HTTP_ADDR as given when
	// devVars moved it onto loopback ("" if it did not).
	DevSettings  []string
	DevOnNetwork bool
	LoopbackFrom string
}

// embedded reports whether to run the single-instance demo: no MySQL and
// no Redis configured.
func (c config) embedded() bool { return c.MySQLDSN == "" && len(c.Redis.Addrs) == 0 }

// redisConfig says how to reach Redis: one node (REDIS_ADDR, or one
// address in REDIS_ADDRS), a Sentinel-watched master (REDIS_ADDRS lists
// the sentinels, REDIS_MASTER_NAME names the master) or a Redis Cluster
// (REDIS_ADDRS lists several of its nodes), with optional ACL credentials
// and TLS.
type redisConfig struct {
	Addrs            []string
	MasterName       string
	Cluster          bool
	Username         string
	Password         string
	SentinelPassword string // the sentinels' own, if they ask for one
	TLS              bool
	// RootCAs verifies Redis' certificate when REDIS_TLS_CA names a PEM
	// file (a private CA); nil: the system's roots.
	RootCAs *x509.CertPool
}

// loadConfig reads the configuration from getenv, area after area, and
// reports every mistake it finds at once, joined into one error. Each area
// checks its own settings, those that depend on one another included
// (METRICS_ADDR and HTTP_ADDR, STOCK_HOLD and SWEEP_EVERY, REDIS_DB on a
// Cluster); what one area decides for another comes after both.
func loadConfig(getenv func(string) string) (config, error) {
	v := &vars{getenv: getenv}
	var c config
	httpVars(&c, v)
	mysqlVars(&c, v)
	redisVars(&c, v)
	lockVars(&c, v)
	saleVars(&c, v)
	asyncVars(&c, v) // after httpVars: the consumer's default name ends in HTTP_ADDR's port
	loginVars(&c, v)
	admissionVars(&c, v) // after redisVars: MAX_IN_FLIGHT follows REDIS_POOL_SIZE

	// The demo or the real stack: MYSQL_DSN and Redis decide the login
	// settings' defaults, and whether JWT_SECRET must be set.
	stackVars(&c, v)
	devVars(&c, v) // after stackVars (the defaults) and httpVars (the address)
	// The DSN last: its timeouts are derived from STOCK_HOLD, and checked
	// against it only when STOCK_HOLD itself is valid.
	if c.MySQLDSN != "" {
		hold := c.StockHold
		if hold < 3*time.Second {
			hold = 0
		}
		dsn, err := normaliseDSN(c.MySQLDSN, hold)
		v.add(err)
		c.MySQLDSN = dsn
		if len(c.MySQLNodes) > 0 {
			// A socket names one server on this machine: there is nothing
			// to fall back on.
			if cfg, err := mysql.ParseDSN(dsn); err == nil && cfg.Net != "tcp" {
				v.errorf("MYSQL_NODES needs a MYSQL_DSN over tcp(host:port), not %s(%s)", cfg.Net, cfg.Addr)
			}
		}
	} else if len(c.MySQLNodes) > 0 {
		v.add(errors.New("MYSQL_NODES lists more nodes of MYSQL_DSN's cluster: set MYSQL_DSN too"))
	}
	return c, errors.Join(v.errs...)
}

const (
	// readTimeout is the server's bound on reading a request (run.go).
	readTimeout = 10 * time.Second
	// minJWTSecret is the shortest JWT_SECRET accepted outside the demo.
	minJWTSecret = 32
	// returnedWithin is the contract's bound on how long stock taken by a
	// request that died stays unsellable.
	returnedWithin = 30 * time.Second
	// maxLimit bounds the login code limits that 0 turns off.
	maxLimit = 1_000_000_000
)

// httpVars reads where the server listens, and where it shows how it is
// doing: metrics, Go's profiles and traces.
func httpVars(c *config, v *vars) {
	c.HTTPAddr = v.str("HTTP_ADDR", ":8080")
	c.BodyTimeout = v.dur("HTTP_BODY_TIMEOUT", web.BodyTimeout)
	// At most the server's ReadTimeout (run.go), which ReadBody's deadline
	// replaces while it reads.
	if b := c.BodyTimeout; b > 0 && (b < 100*time.Millisecond || b > readTimeout) {
		v.errorf("HTTP_BODY_TIMEOUT must be from 100ms to %s (it is %s): a body that has not arrived by then is refused", readTimeout, b)
	}
	c.Tracing = tracing.Config{Endpoint: v.str("OTEL_EXPORTER_OTLP_ENDPOINT", ""), Service: v.str("OTEL_SERVICE_NAME", "seckill")}
	if c.Tracing.Endpoint != "" {
		v.add(tracing.CheckEndpoint(c.Tracing.Endpoint))
	}
	c.MetricsAddr = v.str("METRICS_ADDR", "")
	if c.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(c.MetricsAddr); err != nil || port == "" {
			v.errorf("METRICS_ADDR %q is not host:port (or :port)", c.MetricsAddr)
		} else if c.MetricsAddr == c.HTTPAddr {
			v.errorf("METRICS_ADDR must differ from HTTP_ADDR (both are %q): unset it to serve /metrics on HTTP_ADDR, for admins", c.MetricsAddr)
		}
	}
	c.Pprof = v.bool("PPROF", false)
	if c.Pprof && c.MetricsAddr == "" {
		v.add(errors.New("PPROF serves the profiles on METRICS_ADDR's private port: set METRICS_ADDR too"))
	}
}

// mysqlVars reads where MySQL is and how many connections an instance
// opens to it. loadConfig normalises the DSN last, once STOCK_HOLD is
// known.
func mysqlVars(c *config, v *vars) {
	c.MySQLDSN = v.str("MYSQL_DSN", "")
	c.MySQLNodes = v.list("MYSQL_NODES", "")
	for _, a := range c.MySQLNodes {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			v.errorf("MYSQL_NODES: %q is not host:port", a)
		}
	}
	// Three instances at 30 connections each leave 60 of MariaDB's default
	// 151 for tools, migrations and tests.
	c.MySQLMaxConns = v.int("MYSQL_MAX_OPEN_CONNS", 30, 1, 1000)
}

// redisVars reads where Redis is (redisWhere), which of its databases the
// server uses, and how many connections and pipelines an instance has.
func redisVars(c *config, v *vars) {
	c.RedisDB = v.int("REDIS_DB", 0, 0, 1<<20)
	c.Redis = redisWhere(v)
	c.RedisPoolSize = v.int("REDIS_POOL_SIZE", 64, 1, 10000)
	c.RedisPipelines = v.int("REDIS_PIPELINES", 4, 0, 64)
	if c.Redis.Cluster && c.RedisDB != 0 {
		v.errorf("REDIS_DB=%d, but a Redis Cluster has only database 0", c.RedisDB)
	}
}

// redisWhere reads where Redis is. REDIS_ADDR is one node; REDIS_ADDRS is
// one node, the sentinels when REDIS_MASTER_NAME is set, or else, when it
// lists several, nodes of a Redis Cluster (any of them: the client learns
// the rest from them).
func redisWhere(v *vars) redisConfig {
	addr := v.str("REDIS_ADDR", "")
	r := redisConfig{
		Addrs:            v.list("REDIS_ADDRS", ""),
		MasterName:       v.str("REDIS_MASTER_NAME", ""),
		Username:         v.str("REDIS_USERNAME", ""),
		Password:         v.str("REDIS_PASSWORD", ""),
		SentinelPassword: v.str("REDIS_SENTINEL_PASSWORD", ""),
		TLS:              v.bool("REDIS_TLS", false),
	}
	if ca := v.str("REDIS_TLS_CA", ""); ca != "" {
		pem, err := os.ReadFile(ca)
		r.RootCAs = x509.NewCertPool()
		switch {
		case err != nil:
			v.errorf("REDIS_TLS_CA: %w", err)
		case !r.RootCAs.AppendCertsFromPEM(pem):
			v.errorf("REDIS_TLS_CA: no PEM certificate in %s", ca)
		case !r.TLS:
			v.add(errors.New("REDIS_TLS_CA is set but REDIS_TLS is not: set REDIS_TLS=true to talk TLS to Redis"))
		}
	}
	switch {
	case addr != "" && len(r.Addrs) > 0:
		v.add(errors.New("set REDIS_ADDR (one node) or REDIS_ADDRS (a node, or Sentinel's sentinels with REDIS_MASTER_NAME), not both"))
	case addr != "":
		r.Addrs = []string{addr}
	}
	for _, a := range r.Addrs {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			v.errorf("Redis address %q is not host:port", a)
		}
	}
	switch {
	case r.MasterName != "" && (addr != "" || len(r.Addrs) == 0):
		v.add(errors.New("REDIS_MASTER_NAME needs REDIS_ADDRS to list the sentinels"))
	case r.MasterName == "" && len(r.Addrs) > 1:
		r.Cluster = true
	}
	if r.SentinelPassword != "" && r.MasterName == "" {
		v.add(errors.New("REDIS_SENTINEL_PASSWORD is for the sentinels of REDIS_MASTER_NAME, which is not set"))
	}
	return r
}

// lockVars reads which per-user lock the buy path takes: a key in Redis
// (redis), RedLock over the nodes REDLOCK_ADDRS lists (redlock), or one
// that excludes requests within this process only (local, for teaching).
func lockVars(c *config, v *vars) {
	c.LockBackend = v.str("LOCK_BACKEND", "redis")
	switch c.LockBackend {
	case "redis", "local":
	case "redlock":
		c.RedLockAddrs = v.list("REDLOCK_ADDRS", "")
		if len(c.RedLockAddrs) < 3 {
			v.add(errors.New("LOCK_BACKEND=redlock needs REDLOCK_ADDRS with at least 3 independent Redis nodes (host:port,...)"))
		}
	default:
		v.errorf("LOCK_BACKEND must be redis, redlock or local, not %q", c.LockBackend)
	}
}

// saleVars reads how the sale runs and its timings: how long a unit taken
// in Redis waits for its order row, how often the sweeper gives back the
// units that waited in vain, and how long the server waits for MySQL and
// Redis at start and for requests in flight at shutdown.
func saleVars(c *config, v *vars) {
	c.StockHold = v.dur("STOCK_HOLD", 15*time.Second)
	c.SweepEvery = v.dur("SWEEP_EVERY", 5*time.Second)
	c.ShutdownGrace = v.dur("SHUTDOWN_GRACE", 20*time.Second)
	c.StartupWait = v.dur("STARTUP_WAIT", 30*time.Second)
	c.Writers = v.int("GROUP_COMMIT_WRITERS", order.DefaultWriters, 1, 64)
	c.Mode = v.str("SECKILL_MODE", "sync")
	if c.Mode != "sync" && c.Mode != "async" {
		v.errorf("SECKILL_MODE must be sync or async, not %q", c.Mode)
	}
	if c.StockHold < 3*time.Second {
		v.errorf("STOCK_HOLD must be at least 3s (it is %s)", c.StockHold)
	}
	// A sweep takes the sweeper's lock in Redis and reads MySQL: sweeping
	// more often than this only loads them, and returns no unit sooner
	// than its hold allows.
	if c.SweepEvery > 0 && c.SweepEvery < 100*time.Millisecond {
		v.errorf("SWEEP_EVERY must be at least 100ms (it is %s)", c.SweepEvery)
	}
	// The contract: stock taken by a request whose process dies before it
	// answers is sellable again within 30 seconds. Nobody gives that unit
	// back but the sweeper, at its first sweep after the hold expired: up
	// to STOCK_HOLD + SWEEP_EVERY after it was taken. (Compared as a
	// difference: two durations of 150 years each add up past the largest
	// Duration, to a negative sum that would pass.)
	if c.StockHold > 0 && c.SweepEvery > 0 && c.StockHold > returnedWithin-c.SweepEvery {
		total := c.StockHold + c.SweepEvery
		if total < 0 { // wrapped round
			total = math.MaxInt64
		}
		v.errorf("STOCK_HOLD (%s) + SWEEP_EVERY (%s) is %s, over the %s within which the contract promises that stock taken by a process that died is sellable again (the sweeper returns it at its first sweep after the hold expires); lower STOCK_HOLD or SWEEP_EVERY so that they add up to %s or less",
			c.StockHold, c.SweepEvery, total, returnedWithin, returnedWithin)
	}
}

// asyncVars reads how an instance in async mode consumes the orders'
// stream: its name in the consumer group, how many entries it writes at
// once, and when it claims another consumer's entries or gives up on one.
func asyncVars(c *config, v *vars) {
	c.ClaimIdle = v.dur("CLAIM_IDLE", 5*time.Second)
	c.Batch = v.int("ASYNC_BATCH", 500, 1, 10000)
	c.MaxDeliveries = int64(v.int("ASYNC_MAX_DELIVERIES", 5, 1, 1000))
	c.Consumer = v.str("CONSUMER_NAME", defaultConsumer(c.HTTPAddr))
	// A consumer gives itself CLAIM_IDLE/2 to write a batch, and MySQL
	// needs some of that even when healthy. Shorter, and the entries of a
	// live consumer still writing them are claimed by another: delivered
	// again, counted towards ASYNC_MAX_DELIVERIES, written twice over. (A
	// COMMIT that stalls past CLAIM_IDLE/2, up to the read timeout, can
	// still see its entries claimed: writing an entry twice is a no-op, so
	// this bound is about wasted work, not about correctness.)
	if c.ClaimIdle > 0 && c.ClaimIdle < time.Second {
		v.errorf("CLAIM_IDLE must be at least 1s (it is %s): a consumer's batch may take CLAIM_IDLE/2, and the entries of a live consumer must not be claimed while it writes them", c.ClaimIdle)
	}
}

// loginVars reads how long a token lasts and the login codes' limits.
// What differs between the demo and the real stack is read by stackVars.
func loginVars(c *config, v *vars) {
	c.TokenTTL = v.dur("TOKEN_TTL", 2*time.Hour)
	// A stolen token is worth something until it expires, and a logout
	// everywhere is kept in Redis for as long as a token can live.
	if c.TokenTTL > auth.MaxTTL {
		v.errorf("TOKEN_TTL must be at most %gh (it is %s): a stolen token works until it expires, and a logout everywhere is remembered only that long", auth.MaxTTL.Hours(), c.TokenTTL)
	}
	// Login codes. The limits that only cost SMS and Redis can be turned
	// off with 0 (tests and load tests log thousands of users in from one
	// address); the guess limits cannot: without them a 6-digit code is
	// guessed in a day.
	lim := auth.DefaultLimits
	if c.embedded() {
		// The demo listens on loopback only (devVars), where every client
		// is this machine's: a load test's users are all logged in from
		// one address (README, "Load it").
		lim.CodesPerAddrPerMin = 0
	}
	c.AuthLimits = auth.Limits{
		CodeInterval:       v.offOrSeconds("AUTH_CODE_INTERVAL", lim.CodeInterval),
		CodesPerDay:        v.limit("AUTH_CODES_PER_DAY", lim.CodesPerDay),
		CodesPerAddrPerMin: v.limit("AUTH_CODES_PER_ADDR_PER_MIN", lim.CodesPerAddrPerMin),
		FreeGuesses:        v.int("AUTH_FREE_GUESSES", lim.FreeGuesses, 0, 1000),
		MaxGuessDelay:      v.dur("AUTH_MAX_GUESS_DELAY", lim.MaxGuessDelay),
		FreeGuessesPerAddr: v.int("AUTH_FREE_GUESSES_PER_ADDR", lim.FreeGuessesPerAddr, 0, 100_000),
		MaxAddrDelay:       v.dur("AUTH_MAX_ADDR_DELAY", lim.MaxAddrDelay),
		// OWASP ASVS 2.2.1: no more than 100 failed attempts an hour on
		// one account.
		PhoneGuessesPerHour: v.int("AUTH_PHONE_GUESSES_PER_HOUR", lim.PhoneGuessesPerHour, 1, 100),
		AttackGuessesPerMin: v.int("AUTH_ATTACK_GUESSES_PER_MIN", lim.AttackGuessesPerMin, 1, maxLimit),
		TrustFor:            v.dur("AUTH_TRUST_FOR", lim.TrustFor),
	}
	// The waits start at a second and double: a longest wait under a
	// second could not be told in Retry-After's whole seconds, and one
	// over a day would be the lock these waits replace.
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"AUTH_MAX_GUESS_DELAY", c.AuthLimits.MaxGuessDelay}, {"AUTH_MAX_ADDR_DELAY", c.AuthLimits.MaxAddrDelay}} {
		if d.d > 0 && (d.d < time.Second || d.d > 24*time.Hour) {
			v.errorf("%s must be from 1s to 24h (it is %s)", d.name, d.d)
		}
	}
	if t := c.AuthLimits.TrustFor; t > 0 && t < time.Minute {
		v.errorf("AUTH_TRUST_FOR must be at least 1m (it is %s): a login from an address trusts it for that long", t)
	}
	// The phone's lock is gone (a stranger could lock the owner out):
	// a server still given its settings says so rather than ignore them.
	for _, old := range []string{"AUTH_GUESSES_PER_CODE", "AUTH_GUESSES_PER_DAY", "AUTH_LOCK_FOR"} {
		if v.getenv(old) != "" {
			v.errorf("%s is no longer read: a phone is not locked after wrong codes any more; the client address that guesses waits instead (AUTH_FREE_GUESSES, AUTH_MAX_GUESS_DELAY, AUTH_FREE_GUESSES_PER_ADDR, AUTH_MAX_ADDR_DELAY, AUTH_PHONE_GUESSES_PER_HOUR; see the README)", old)
		}
	}
}

// admissionVars reads what lets a request in: the buy button's per-user
// rate, how many requests one instance works on at once, and which
// proxies may name a client's address.
func admissionVars(c *config, v *vars) {
	c.SeckillRate = v.rate("SECKILL_RATE", 10)
	c.SeckillBurst = v.int("SECKILL_BURST", 20, 1, 1_000_000)
	// By default four requests per Redis connection: a request holds one
	// only for its round trips, and beyond a few per connection they wait
	// for one (go-redis' pool timeout) instead of working.
	c.MaxInFlight = v.int("MAX_IN_FLIGHT", 4*c.RedisPoolSize, 0, 1_000_000)
	c.TrustedProxies = v.list("TRUSTED_PROXIES", "")
	for _, p := range c.TrustedProxies {
		v.add(checkProxy(p))
	}
	// Far more than a browser opens (six) or a load test needs from one
	// machine, far less than the process' open files.
	c.MaxConnsPerAddr = v.int("MAX_CONNS_PER_ADDR", 1024, 0, 1_000_000)
}

// devVars keeps the development settings off the network. Each hands a
// client what it should have earned: AUTH_DEV_CODES any phone's login
// code (the admin's too, so admin), LIVE_CROWD tokens of made-up users
// and a crowd that buys, PAYMENT_FAKE a paid order without payment. On
// loopback only the machine's own users reach them; on a network
// address, everyone who reaches the port does. So with any of them on:
//
//   - HTTP_ADDR without a host (":8080", the default) listens on
//     127.0.0.1 only, and run says so;
//   - HTTP_ADDR with a host that is not loopback is refused at start;
//
// unless ALLOW_DEV_SETTINGS_ON_NETWORK=true says that every client that
// can reach the address is trusted (the compose file's private network,
// behind its proxy published on 127.0.0.1).
func devVars(c *config, v *vars) {
	for _, s := range []struct {
		name string
		on   bool
	}{{"AUTH_DEV_CODES", c.DevCodes}, {"LIVE_CROWD", c.LiveCrowd}, {"PAYMENT_FAKE", c.PaymentFake}} {
		if s.on {
			c.DevSettings = append(c.DevSettings, s.name)
		}
	}
	c.DevOnNetwork = v.bool("ALLOW_DEV_SETTINGS_ON_NETWORK", false)
	if len(c.DevSettings) == 0 || c.DevOnNetwork {
		return
	}
	host, port, err := net.SplitHostPort(c.HTTPAddr)
	switch {
	case err != nil:
		v.errorf("HTTP_ADDR %q is not host:port (or :port)", c.HTTPAddr)
	case host == "":
		c.LoopbackFrom = c.HTTPAddr
		c.HTTPAddr = net.JoinHostPort("127.0.0.1", port)
	case !loopback(host):
		v.errorf("%s on HTTP_ADDR %q, which is not loopback: anyone who reaches it could use them (AUTH_DEV_CODES answers the admin's login code). Turn them off, listen on 127.0.0.1, or set ALLOW_DEV_SETTINGS_ON_NETWORK=true if every client that reaches %s is yours",
			strings.Join(c.DevSettings, ", "), c.HTTPAddr, c.HTTPAddr)
	}
}

// loopback reports whether host names this machine's loopback only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// stackVars reads what differs between the embedded demo (neither
// MYSQL_DSN nor Redis set) and the real stack (both set): who logs in as
// admin, whether login codes are answered, the live page's crowd, and the
// key tokens are signed with. One of MYSQL_DSN and Redis without the
// other is refused.
func stackVars(c *config, v *vars) {
	switch {
	case c.embedded():
		c.AdminPhones = v.list("ADMIN_PHONES", "13800000000")
		c.DevCodes = v.bool("AUTH_DEV_CODES", true)
		c.LiveCrowd = v.bool("LIVE_CROWD", true)
		c.PaymentFake = v.bool("PAYMENT_FAKE", true)
		c.JWTSecret = []byte(v.getenv("JWT_SECRET"))
		if len(c.JWTSecret) == 0 {
			c.JWTSecret = make([]byte, 32)
			rand.Read(c.JWTSecret)
		}
		c.PaymentSecret = []byte(v.getenv("PAYMENT_WEBHOOK_SECRET"))
		if len(c.PaymentSecret) == 0 {
			c.PaymentSecret = make([]byte, 32)
			rand.Read(c.PaymentSecret)
		}
	case c.MySQLDSN == "" || len(c.Redis.Addrs) == 0:
		v.add(errors.New("set both MYSQL_DSN and REDIS_ADDR (or REDIS_ADDRS) for the real stack, or neither for the embedded demo"))
	default:
		c.AdminPhones = v.list("ADMIN_PHONES", "")
		c.DevCodes = v.bool("AUTH_DEV_CODES", false)
		c.LiveCrowd = v.bool("LIVE_CROWD", false)
		c.PaymentFake = v.bool("PAYMENT_FAKE", false)
		c.JWTSecret = []byte(v.getenv("JWT_SECRET"))
		// HS256 signs with HMAC-SHA256, whose key must be at least as long
		// as the hash's 32 bytes (RFC 7518, section 3.2): a shorter one is
		// guessed sooner, and anyone who guesses it mints admin tokens.
		// Spaces around it are not counted: 32 blanks are no secret.
		if n := len(bytes.TrimSpace(c.JWTSecret)); n < minJWTSecret {
			v.errorf("JWT_SECRET must be set (%d bytes or more, not counting spaces around it; it has %d) outside the demo (MYSQL_DSN and REDIS_ADDR or REDIS_ADDRS set); for example: export JWT_SECRET=$(openssl rand -hex 32)", minJWTSecret, n)
		}
		// The webhook's key: whoever holds it can declare any order paid.
		c.PaymentSecret = []byte(v.getenv("PAYMENT_WEBHOOK_SECRET"))
		if n := len(bytes.TrimSpace(c.PaymentSecret)); n < payment.MinSecret {
			v.errorf("PAYMENT_WEBHOOK_SECRET must be set (%d bytes or more, not counting spaces around it; it has %d) outside the demo: the payment provider signs its webhook calls with it; for example: export PAYMENT_WEBHOOK_SECRET=$(openssl rand -hex 32)", payment.MinSecret, n)
		}
	}
}

// checkProxy checks one entry of TRUSTED_PROXIES: an IP address or a CIDR,
// as gin's SetTrustedProxies takes them, and not one that covers every
// address or a wide part of them: trusting every peer's X-Forwarded-For lets each client name its
// own address, which is gin's default and the hole this setting closes.
func checkProxy(p string) error {
	if strings.Contains(p, "/") {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			return fmt.Errorf("TRUSTED_PROXIES: %q is neither an IP address nor a CIDR such as 10.0.0.0/8", p)
		}
		// gin (net.IPNet) matches an IPv4 peer against an IPv4-mapped
		// prefix as against the IPv4 prefix of its last 32 bits: to it,
		// ::ffff:0:0/96 is 0.0.0.0/0.
		bits := prefix.Bits()
		if prefix.Addr().Is4In6() && bits >= 96 {
			bits -= 96
		}
		if bits == 0 {
			return fmt.Errorf("TRUSTED_PROXIES: %q trusts every peer, so that any client could name its own address; list your proxies' addresses", p)
		}
		// Wider networks are refused too: no tier of proxies is that big,
		// and two of them (0.0.0.0/1 and 128.0.0.0/1) trust every peer as
		// surely as one /0. In IPv6 a /16 is already vast; only the private
		// range fc00::/7 may be named whole.
		v4 := prefix.Addr().Unmap().Is4()
		private := netip.MustParsePrefix("fc00::/7")
		switch {
		case v4 && bits < 8:
			return fmt.Errorf("TRUSTED_PROXIES: %q is wider than /8: a few such entries trust every peer; list your proxies' addresses", p)
		case !v4 && bits < 16 && !(bits >= 7 && private.Contains(prefix.Addr())):
			return fmt.Errorf("TRUSTED_PROXIES: %q is wider than /16 (only fc00::/7, the private range, may be wider): a few such entries trust every peer; list your proxies' addresses", p)
		}
		return nil
	}
	if a, err := netip.ParseAddr(p); err != nil || a.Zone() != "" {
		return fmt.Errorf("TRUSTED_PROXIES: %q is neither an IP address nor a CIDR such as 10.0.0.0/8", p)
	}
	return nil
}

// WriteTimeout bounds a request's work between taking stock and sending
// the order's COMMIT: a third of the hold, so that with the wait for the
// COMMIT's answer (readTimeout, see normaliseDSN) a hold never expires
// under a request that is still writing.
func (c config) WriteTimeout() time.Duration { return c.StockHold / 3 }

// MySQLTimeout is the DSN's readTimeout and writeTimeout unless the DSN
// sets its own: a third of the hold, like WriteTimeout. See normaliseDSN.
func (c config) MySQLTimeout() time.Duration { return c.StockHold / 3 }

// HTTPWriteTimeout is the http.Server's WriteTimeout: how long a request
// may take, from its headers to the last byte of its answer. It must
// exceed the longest request, or a 200 whose order is committed reaches
// its client as a dropped connection. The longest is the seckill path,
// and each of its waits is bounded: a voucher lookup and the COMMIT's
// answer by readTimeout (under 2/3 of the hold: loadConfig refuses more);
// the lock and the write, a stock reload, and looking the order up when
// the COMMIT's answer was lost by WriteTimeout (a third of the hold)
// each; Redis before and after by 3s each. That is under 3×STOCK_HOLD +
// 6s; 4s more to write the answer. The admin endpoints do less. 55s at
// the default hold: still a bound on a client that never reads.
func (c config) HTTPWriteTimeout() time.Duration { return 3*c.StockHold + 10*time.Second }

// normaliseDSN makes sure times come back as time.Time in UTC, whatever
// the DSN said (the code stores and compares UTC), and sets the driver's
// options the server relies on. hold is STOCK_HOLD; 0 if it is invalid
// (an error already says so), and then the timeouts are left unchecked.
func normaliseDSN(dsn string, hold time.Duration) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("MYSQL_DSN is not a valid go-sql-driver DSN: %v", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	// Arguments are interpolated by the driver instead of each statement
	// being prepared, executed and closed on the server: two round trips
	// instead of six for the order's INSERT and UPDATE. Safe with the
	// utf8mb4 charset used here (the driver refuses it for GBK/BIG5 & co).
	cfg.InterpolateParams = true
	// A MySQL that stops answering must fail requests and batches, not
	// hang them (and shutdown with them). Kept if the DSN sets its own.
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if hold == 0 {
		return cfg.FormatDSN(), nil
	}
	// The read and write timeouts also bound how late an order can land.
	// A request sends its COMMIT before its write deadline (WriteTimeout,
	// STOCK_HOLD/3, counted from about when it took the unit) and the
	// group-commit writer then waits for MySQL's answer, which the driver
	// gives up on after readTimeout. If deadline + readTimeout reached
	// the hold, a stalled COMMIT could outlive the hold: the sweeper would
	// find no row and give the unit back, and then the order would land,
	// selling that unit twice. A third of the hold each leaves the last
	// third for the sweeper's own check. writeTimeout bounds sending the
	// COMMIT; it is checked the same way (the packet is small and the
	// socket idle, so in practice it is sent at once).
	c := config{StockHold: hold}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = c.MySQLTimeout()
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = c.MySQLTimeout()
	}
	// A statement the driver gave up on goes on waiting on the server: a
	// locking read (see order.resolve) waits for a row lock up to
	// innodb_lock_wait_timeout, 50 s by default, holding its own locks
	// meanwhile. Within the read timeout, the server ends it too.
	if _, ok := cfg.Params["innodb_lock_wait_timeout"]; !ok {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(max(1, int(cfg.ReadTimeout.Seconds())-1))
	}
	var errs []error
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"readTimeout", cfg.ReadTimeout}, {"writeTimeout", cfg.WriteTimeout}} {
		if c.WriteTimeout()+t.d >= hold {
			errs = append(errs, fmt.Errorf("MYSQL_DSN sets %s=%s, which with the write deadline of %s (STOCK_HOLD/3) reaches STOCK_HOLD (%s): an order whose COMMIT stalls could land after the sweeper gave its unit back; set %s below %s, or leave it out of the DSN (the server then uses STOCK_HOLD/3, %s)",
				t.name, t.d, ms(c.WriteTimeout()), hold, t.name, ms(hold-c.WriteTimeout()), ms(c.MySQLTimeout())))
		}
	}
	return cfg.FormatDSN(), errors.Join(errs...)
}

// ms drops what is below a millisecond, so that a third of 25s reads
// 8.333s in a message and not 8.333333333s.
func ms(d time.Duration) time.Duration { return d.Truncate(time.Millisecond) }

// defaultConsumer names this instance's stream consumer after the host and
// the port it listens on: stable when the same instance restarts (so it
// finds its unacknowledged entries again), distinct between instances.
func defaultConsumer(httpAddr string) string {
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(httpAddr)
	return host + ":" + port
}
