package main

// Where the server listens and where its stores are: the areas of
// loadConfig for HTTP and its observers, MySQL, Redis and the lock.

import (
	"crypto/x509"
	"errors"
	"net"
	"os"
	"time"

	"seckill/internal/tracing"
	"seckill/internal/web"
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

// defaultPipelines is REDIS_PIPELINES' default: one sender. Commands that
// arrive while the sender waits for a batch's replies wait for it and go
// out together in the next batch; with more senders the same commands are
// spread over several smaller batches, each a write and a read on both
// sides. On the 2-core benchmark machine (Redis, MariaDB and wrk beside the
// server), in 18 pairs against four senders, one sender cost Redis 31 µs a
// sync order instead of 41 and 19 an async order instead of 21, the server
// 8 µs less a sync order, and sync sold 3% more (BENCHMARKS.md, "Where an
// order's time goes"). More senders overlap round trips, which may pay
// where Redis is across a network and its round trip, not the system
// calls, is what a request waits for.
const defaultPipelines = 1

// redisVars reads where Redis is (redisWhere), which of its databases the
// server uses, and how many connections and pipelines an instance has.
func redisVars(c *config, v *vars) {
	c.RedisDB = v.int("REDIS_DB", 0, 0, 1<<20)
	c.Redis = redisWhere(v)
	c.RedisPoolSize = v.int("REDIS_POOL_SIZE", 64, 1, 10000)
	c.RedisPipelines = v.int("REDIS_PIPELINES", defaultPipelines, 0, 64)
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
