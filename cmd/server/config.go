package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/auth"
	"seckill/internal/tracing"
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
	// MaxConnsPer48 caps the connections of all the addresses of one
	// IPv6 /48 together (0: no cap): its 65,536 /64s are each an address
	// to MaxConnsPerAddr.
	MaxConnsPer48 int
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
