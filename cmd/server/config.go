package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// config is everything run reads from the environment. Only cmd/server
// reads the environment; packages get plain values.
type config struct {
	HTTPAddr      string
	MySQLDSN      string // normalised: parseTime=true, loc=UTC
	RedisAddr     string
	RedisDB       int
	JWTSecret     []byte
	AdminPhones   []string
	DevCodes      bool
	Mode          string // sync or async
	LockBackend   string // redis, redlock or local
	RedLockAddrs  []string
	MySQLMaxConns int
	RedisPoolSize int
	TokenTTL      time.Duration
	StockHold     time.Duration
	SweepEvery    time.Duration
	ShutdownGrace time.Duration
	StartupWait   time.Duration
	Consumer      string        // async mode: this instance's consumer name
	ClaimIdle     time.Duration // async mode: idle time before another consumer's entries are claimed
	Batch         int           // async mode: entries written per transaction
	MaxDeliveries int64         // async mode: deliveries after which an entry MySQL keeps refusing is dead-lettered
}

// embedded reports whether to run the single-instance demo: no MySQL and
// no Redis configured.
func (c config) embedded() bool { return c.MySQLDSN == "" && c.RedisAddr == "" }

func loadConfig(getenv func(string) string) (config, error) {
	env := func(name, def string) string {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return v
		}
		return def
	}
	c := config{
		HTTPAddr:    env("HTTP_ADDR", ":8080"),
		MySQLDSN:    env("MYSQL_DSN", ""),
		RedisAddr:   env("REDIS_ADDR", ""),
		Mode:        env("SECKILL_MODE", "sync"),
		LockBackend: env("LOCK_BACKEND", "redis"),
	}
	var errs []error
	intVar := func(name string, def, lo, hi int) int {
		v, err := strconv.Atoi(env(name, strconv.Itoa(def)))
		if err != nil || v < lo || v > hi {
			errs = append(errs, fmt.Errorf("%s must be an integer from %d to %d", name, lo, hi))
		}
		return v
	}
	durVar := func(name string, def time.Duration) time.Duration {
		v, err := time.ParseDuration(env(name, def.String()))
		if err != nil || v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be a positive duration such as %s", name, def))
		}
		return v
	}
	c.RedisDB = intVar("REDIS_DB", 0, 0, 1<<20)
	// Three instances at 30 connections each leave 60 of MariaDB's default
	// 151 for tools, migrations and tests.
	c.MySQLMaxConns = intVar("MYSQL_MAX_OPEN_CONNS", 30, 1, 1000)
	c.RedisPoolSize = intVar("REDIS_POOL_SIZE", 64, 1, 10000)
	c.TokenTTL = durVar("TOKEN_TTL", 2*time.Hour)
	c.StockHold = durVar("STOCK_HOLD", 15*time.Second)
	c.SweepEvery = durVar("SWEEP_EVERY", 5*time.Second)
	c.ShutdownGrace = durVar("SHUTDOWN_GRACE", 20*time.Second)
	c.StartupWait = durVar("STARTUP_WAIT", 30*time.Second)
	c.ClaimIdle = durVar("CLAIM_IDLE", 5*time.Second)
	c.Batch = intVar("ASYNC_BATCH", 500, 1, 10000)
	c.MaxDeliveries = int64(intVar("ASYNC_MAX_DELIVERIES", 5, 1, 1000))
	c.Consumer = env("CONSUMER_NAME", defaultConsumer(c.HTTPAddr))

	switch {
	case c.embedded():
		c.AdminPhones = splitList(env("ADMIN_PHONES", "13800000000"))
		c.DevCodes = boolVar(env("AUTH_DEV_CODES", "true"))
		c.JWTSecret = []byte(getenv("JWT_SECRET"))
		if len(c.JWTSecret) == 0 {
			c.JWTSecret = make([]byte, 32)
			rand.Read(c.JWTSecret)
		}
	case c.MySQLDSN == "" || c.RedisAddr == "":
		errs = append(errs, errors.New("set both MYSQL_DSN and REDIS_ADDR for the real stack, or neither for the embedded demo"))
	default:
		c.AdminPhones = splitList(env("ADMIN_PHONES", ""))
		c.DevCodes = boolVar(env("AUTH_DEV_CODES", "false"))
		c.JWTSecret = []byte(getenv("JWT_SECRET"))
		if len(c.JWTSecret) < 16 {
			errs = append(errs, errors.New("JWT_SECRET must be set (16 bytes or more) when MYSQL_DSN or REDIS_ADDR is set; for example: export JWT_SECRET=$(openssl rand -hex 32)"))
		}
	}
	if c.MySQLDSN != "" {
		dsn, err := normaliseDSN(c.MySQLDSN)
		if err != nil {
			errs = append(errs, err)
		}
		c.MySQLDSN = dsn
	}
	if c.Mode != "sync" && c.Mode != "async" {
		errs = append(errs, fmt.Errorf("SECKILL_MODE must be sync or async, not %q", c.Mode))
	}
	switch c.LockBackend {
	case "redis", "local":
	case "redlock":
		c.RedLockAddrs = splitList(env("REDLOCK_ADDRS", ""))
		if len(c.RedLockAddrs) < 3 {
			errs = append(errs, errors.New("LOCK_BACKEND=redlock needs REDLOCK_ADDRS with at least 3 independent Redis nodes (host:port,...)"))
		}
	default:
		errs = append(errs, fmt.Errorf("LOCK_BACKEND must be redis, redlock or local, not %q", c.LockBackend))
	}
	if c.StockHold < 3*time.Second {
		errs = append(errs, fmt.Errorf("STOCK_HOLD must be at least 3s (it is %s)", c.StockHold))
	}
	return c, errors.Join(errs...)
}

// WriteTimeout bounds a request's work between taking stock and committing
// the order: a third of the hold, so a hold never expires under a request
// that is still running.
func (c config) WriteTimeout() time.Duration { return c.StockHold / 3 }

// normaliseDSN makes sure times come back as time.Time in UTC, whatever
// the DSN said (the code stores and compares UTC), and sets the driver's
// options the server relies on.
func normaliseDSN(dsn string) (string, error) {
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
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = 30 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	return cfg.FormatDSN(), nil
}

// defaultConsumer names this instance's stream consumer after the host and
// the port it listens on: stable when the same instance restarts (so it
// finds its unacknowledged entries again), distinct between instances.
func defaultConsumer(httpAddr string) string {
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(httpAddr)
	return host + ":" + port
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func boolVar(s string) bool { return s == "true" || s == "1" }
