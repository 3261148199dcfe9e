package main

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"seckill/internal/autopipe"
	"seckill/internal/dbnodes"
	"seckill/internal/stock"
	"seckill/internal/tracing"
	"seckill/migrations"
)

// Opening the stores: MySQL and Redis (or the embedded demo's SQLite and
// miniredis), the RedLock nodes, tracing around them; waiting for them to
// answer; migrating.

// stores are the connections to MySQL and Redis.
type stores struct {
	db      *gorm.DB
	truth   *gorm.DB // on a Galera cluster, causal reads (order.Config.Truth); nil otherwise
	rdb     redis.UniversalClient
	redlock []redis.UniversalClient
	tracer  *tracing.Tracer // nil: tracing off
	closers []func()
}

// causal is the handle of the reads that must see every commit of the
// cluster: truth on Galera, db elsewhere.
func (s *stores) causal() *gorm.DB {
	if s.truth != nil {
		return s.truth
	}
	return s.db
}

func (s *stores) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// openMySQL opens a gorm handle on dsn, traced if tracer is not nil.
func openMySQL(dsn string, tracer *tracing.Tracer, gcfg *gorm.Config) (*gorm.DB, error) {
	dialector := mysql.Open(dsn)
	if tracer != nil {
		pool, err := tracer.OpenMySQL(dsn)
		if err != nil {
			return nil, fmt.Errorf("open mysql: %w", err)
		}
		dialector = mysql.New(mysql.Config{Conn: pool})
	}
	db, err := gorm.Open(dialector, gcfg)
	if err != nil {
		return nil, fmt.Errorf("open mysql: %w", err)
	}
	return db, nil
}

// truthConns is the connections of the causal reads' pool on a Galera
// cluster: the reads that decide a unit's fate are rare (a lost COMMIT
// answer, a sweep, a reload, a reconciliation), but a group-commit batch
// whose COMMIT answer was lost sends each of its orders to look itself up
// at once.
const truthConns = 8

// openTruth opens, on a Galera cluster (wsrep_on), the pool of the reads
// that must see every commit the cluster certified before them
// (order.Config.Truth): its connections set wsrep_sync_wait=1, so that a
// read waits until its node has applied them. Only those reads: every
// read made to wait would cost the hot path a round trip in the cluster.
// Elsewhere it opens nothing.
//
// With MYSQL_NODES (a cluster, then) a failure to ask fails the start: a
// Galera cluster without causal reads would run, and only now and then
// give a unit back that was sold.
func openTruth(ctx context.Context, st *stores, dsn string, nodes bool, gcfg *gorm.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := st.db.DB()
	if err != nil {
		return err
	}
	on, err := dbnodes.Galera(ctx, pool)
	switch {
	case err != nil && nodes:
		return fmt.Errorf("ask whether MySQL is a Galera cluster: %w", err)
	case !on:
		return nil
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return err
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wsrep_sync_wait"] = "1"
	db, err := openMySQL(cfg.FormatDSN(), st.tracer, gcfg)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	sqlDB.SetMaxOpenConns(truthConns)
	sqlDB.SetMaxIdleConns(truthConns)
	sqlDB.SetConnMaxLifetime(nodesConnLifetime)
	st.closers = append(st.closers, func() { sqlDB.Close() })
	st.truth = db
	return nil
}

// openStores connects to MySQL and Redis (or starts the embedded ones),
// waiting up to StartupWait for them to come up, then migrates.
func openStores(ctx context.Context, cfg config, log *slog.Logger) (*stores, error) {
	st := &stores{}
	gcfg := &gorm.Config{
		TranslateError:         true, // unique violations become gorm.ErrDuplicatedKey
		SkipDefaultTransaction: true, // single statements need no transaction of their own
		Logger:                 logger.Discard,
	}
	dialect := migrations.MySQL
	dsn := cfg.MySQLDSN // through dbnodes with MYSQL_NODES (viaNodes)
	if cfg.embedded() {
		log.Warn("EMBEDDED DEMO MODE: in-process Redis and in-memory SQLite; single instance only, nothing is kept. Set MYSQL_DSN and REDIS_ADDR for the real stack.")
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("start embedded redis: %w", err)
		}
		st.closers = append(st.closers, mr.Close)
		st.closers = append(st.closers, realTime(mr))
		st.rdb = redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1}) // as the real one's: see newRedis
		// A name of its own: two demos in one process must not share it.
		name := fmt.Sprintf("seckill-demo-%d-%d", os.Getpid(), time.Now().UnixNano())
		db, err := gorm.Open(sqlite.Open("file:"+name+"?mode=memory&cache=shared&_pragma=busy_timeout(5000)"), gcfg)
		if err != nil {
			return nil, fmt.Errorf("open embedded sqlite: %w", err)
		}
		st.db = db
		dialect = migrations.SQLite
	} else {
		tracer, err := tracing.New(cfg.Tracing)
		if err != nil {
			return nil, err
		}
		st.tracer = tracer
		// Closed last (closers run backwards): the spans of the last
		// requests are sent before the process ends.
		st.closers = append(st.closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tracer.Shutdown(ctx); err != nil {
				log.Warn("send the last spans", "err", err)
			}
		})
		st.rdb = newRedis(cfg)
		if err := tracer.Redis(st.rdb); err != nil {
			return nil, err
		}
		if dsn, err = viaNodes(cfg, st, log); err != nil {
			st.close()
			return nil, err
		}
		db, err := openMySQL(dsn, tracer, gcfg)
		if err != nil {
			st.close()
			return nil, err
		}
		st.db = db
	}
	st.closers = append(st.closers, func() { st.rdb.Close() })
	// Concurrent requests' commands share round trips (package autopipe);
	// added after the tracing hooks, which then still see each command.
	// Not on a Cluster, whose pipelines may send a command twice.
	if c, ok := st.rdb.(*redis.Client); ok && cfg.RedisPipelines > 0 {
		p, err := autopipe.Attach(c, cfg.RedisPipelines, autopipeBatch)
		if err != nil {
			return nil, err
		}
		st.closers = append(st.closers, p.Close) // before the client's Close
	}
	sqlDB, err := st.db.DB()
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func() { sqlDB.Close() })
	if cfg.embedded() {
		// One connection: an in-memory SQLite lives as long as a
		// connection to it, and SQLite has one writer anyway.
		sqlDB.SetMaxOpenConns(1)
	} else {
		sqlDB.SetMaxOpenConns(cfg.MySQLMaxConns)
		sqlDB.SetMaxIdleConns(cfg.MySQLMaxConns)
		sqlDB.SetConnMaxIdleTime(5 * time.Minute)
		if len(cfg.MySQLNodes) > 0 {
			// After a failover the pool's connections live on the next
			// node. Renewed within a minute, they are back on the DSN's
			// own once it is up again, where the other instances that
			// prefer it write too (docs/galera.md).
			sqlDB.SetConnMaxLifetime(nodesConnLifetime)
		}
	}
	for _, addr := range cfg.RedLockAddrs {
		// As NewRedLock asks: ctx deadlines honoured, so a stalled
		// node costs an attempt its share of the ttl, not ReadTimeout.
		c := redis.NewClient(&redis.Options{
			Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second,
		})
		st.redlock = append(st.redlock, c)
		st.closers = append(st.closers, func() { c.Close() })
	}

	if err := waitUp(ctx, cfg.StartupWait, log, st); err != nil {
		st.close()
		return nil, err
	}
	if err := migrate(ctx, cfg, dsn, sqlDB, dialect); err != nil {
		st.close()
		return nil, err
	}
	if !cfg.embedded() {
		if err := openTruth(ctx, st, dsn, len(cfg.MySQLNodes) > 0, gcfg); err != nil {
			st.close()
			return nil, fmt.Errorf("open mysql for causal reads: %w", err)
		}
	}
	return st, nil
}

// nodesConnLifetime is how long a MySQL connection lives with
// MYSQL_NODES: how soon an instance is back on its preferred node.
const nodesConnLifetime = time.Minute

// viaNodes returns the DSN to open MySQL with: cfg's own, or, with
// MYSQL_NODES, one whose connections go to the first node that is up and
// Synced, the DSN's own first (package dbnodes). The nodes are let go
// when st closes, after the pools that dial them.
func viaNodes(cfg config, st *stores, log *slog.Logger) (string, error) {
	if len(cfg.MySQLNodes) == 0 {
		return cfg.MySQLDSN, nil
	}
	mcfg, err := gomysql.ParseDSN(cfg.MySQLDSN)
	if err != nil {
		return "", err
	}
	nodes, err := dbnodes.Open(mcfg, cfg.MySQLNodes, log)
	if err != nil {
		return "", err
	}
	st.closers = append(st.closers, nodes.Close)
	log.Info("MySQL through several nodes, in this order", "nodes", strings.Join(nodes.Addrs(), ","))
	return nodes.Config().FormatDSN(), nil
}

// newRedis makes the client of the Redis cfg names: one node, or the
// master that Sentinel watches (go-redis asks the sentinels where it is,
// and follows it when they fail it over).
func newRedis(cfg config) redis.UniversalClient {
	var tlsConfig *tls.Config
	if cfg.Redis.TLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: cfg.Redis.RootCAs}
	}
	opt := &redis.UniversalOptions{
		Addrs: cfg.Redis.Addrs, MasterName: cfg.Redis.MasterName, DB: cfg.RedisDB,
		Username: cfg.Redis.Username, Password: cfg.Redis.Password,
		SentinelPassword: cfg.Redis.SentinelPassword,
		TLSConfig:        tlsConfig,
		PoolSize:         cfg.RedisPoolSize + blockingReaders(cfg),
		// Fail fast when Redis is down: a request answers 503 in about
		// a second instead of piling up behind redials. And never
		// retry: the stock scripts are not idempotent, and a retry
		// after a lost reply would answer "already ordered" to the
		// user whose unit the first run took.
		DialTimeout: time.Second, MaxRetries: -1,
	}
	switch {
	case cfg.Redis.MasterName != "":
		return redis.NewFailoverClient(opt.Failover())
	case cfg.Redis.Cluster:
		return newClusterClient(opt)
	}
	return redis.NewClient(opt.Simple())
}

// autopipeBatch is the most commands a sender of package autopipe sends
// in one round trip: about what a full pool of requests has waiting at
// once.
const autopipeBatch = 128

// blockingReaders is the connections async mode's consumers hold besides
// REDIS_POOL_SIZE: each shard's consumer waits in XREADGROUP ... BLOCK on a
// connection of its own, and without these sixteen the requests would
// share what is left of the pool.
func blockingReaders(cfg config) int {
	if cfg.Mode == "async" {
		return stock.Shards
	}
	return 0
}

// migrate applies the migrations. On MySQL it uses connections of its own
// without the read and write timeouts of the service's pool: those are
// sized for orders (a third of the hold), and an ALTER TABLE on a big
// table may rightly take minutes. Killed by the driver halfway, it would
// run on in the server while its version was never recorded.
func migrate(ctx context.Context, cfg config, dsn string, pool *sql.DB, dialect string) error {
	if cfg.embedded() {
		return migrations.Apply(ctx, pool, dialect)
	}
	mcfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return err
	}
	mcfg.ReadTimeout, mcfg.WriteTimeout = 0, 0
	db, err := sql.Open("mysql", mcfg.FormatDSN())
	if err != nil {
		return fmt.Errorf("open mysql for migrations: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	return migrations.Apply(ctx, db, dialect)
}

// waitUp pings MySQL and Redis until both answer: under docker compose the
// server may start before they accept connections.
func waitUp(ctx context.Context, limit time.Duration, log *slog.Logger, st *stores) error {
	deadline := time.Now().Add(limit)
	for {
		err := st.ping(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("MySQL or Redis did not answer within %s: %w", limit, err)
		}
		log.Info("waiting for MySQL and Redis", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (st *stores) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sqlDB, err := st.db.DB()
	if err != nil {
		return err
	}
	return errors.Join(sqlDB.PingContext(ctx), st.rdb.Ping(ctx).Err())
}

// realTime makes mr's TTLs count down as the clock does, until the
// returned stop is called. miniredis counts them down only when told to
// (FastForward, for tests that skip time): without this the demo's login
// codes never expired, its windows never ended (an address refused for a
// minute stayed refused), and the admin could log in only once per
// process.
func realTime(mr *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
