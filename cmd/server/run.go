package main

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"seckill/api"
	"seckill/internal/admission"
	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/autopipe"
	"seckill/internal/idworker"
	"seckill/internal/live"
	"seckill/internal/lock"
	"seckill/internal/metrics"
	"seckill/internal/order"
	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/tracing"
	"seckill/internal/voucher"
	"seckill/internal/web"
	"seckill/migrations"
)

// run reads the configuration, connects, wires the features, serves until
// ctx is cancelled (SIGINT or SIGTERM), then shuts down in order: stop
// accepting, let in-flight requests finish, stop background work, close
// the connections.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stdout, nil))

	st, err := openStores(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer st.close()

	app, err := newApp(cfg, st, log)
	if err != nil {
		return err
	}
	if cfg.embedded() {
		app.seedDemo(ctx, log)
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{
		Handler: app.router,
		// A client that sends its request slowly holds a goroutine and a
		// connection for as long as it likes unless these cut it off. The
		// bodies are small (web.LimitBody), so 10s is generous.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		// Longer than the longest request (see HTTPWriteTimeout): cutting
		// a request short would turn a committed order's 200 into a
		// dropped connection. It only stops a client that never reads.
		WriteTimeout: cfg.HTTPWriteTimeout(),
		// Above the 60s idle timeout common to load balancers, so that
		// the balancer, not the server, closes an idle connection: else
		// it may send a request down one the server is closing.
		IdleTimeout: 75 * time.Second,
	}
	// Room for both servers' errors: neither may block once run is gone.
	serveErr := make(chan error, 2)
	// Event streams (/live) last as long as their page: Shutdown would
	// wait for them to its deadline. They end when it begins.
	srv.RegisterOnShutdown(app.stopLive)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "mode", cfg.Mode, "lock", cfg.LockBackend, "embedded", cfg.embedded())
	// With METRICS_ADDR, /metrics has a server of its own, without
	// authentication: a Prometheus server scrapes it from a private
	// network, and it holds no token. Without, it is on the main port,
	// for admins (newApp).
	var metricsSrv *http.Server
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			srv.Close()
			return fmt.Errorf("listen on METRICS_ADDR %s: %w", cfg.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", app.metrics.Handler())
		if cfg.Pprof {
			// The profiles a performance investigation starts from
			// (BENCHMARKS.md), on the private port only: a CPU profile
			// costs the server while it runs.
			mux.HandleFunc("GET /debug/pprof/", pprof.Index)
			mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		}
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 75 * time.Second}
		go func() { serveErr <- fmt.Errorf("metrics: %w", metricsSrv.Serve(mln)) }()
		log.Info("serving /metrics", "addr", mln.Addr().String())
	}
	// stopMetrics stops the metrics server last, after the drain, so that
	// a scraper sees the shutdown to its end. A scrape is a read: if the
	// grace is spent, it is cut short.
	stopMetrics := func(deadline context.Context) {
		if metricsSrv != nil && metricsSrv.Shutdown(deadline) != nil {
			metricsSrv.Close()
		}
	}

	// Background work runs under its own context, stopped only after the
	// last request has finished: a request may still need it. The
	// consumer then gets a drain context of its own, to write what the
	// last requests accepted.
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	drainCtx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDrain()
	var bg sync.WaitGroup
	bg.Go(func() { app.orders.RunSweeper(bgCtx, cfg.SweepEvery) })
	bg.Go(func() { app.live.Run(bgCtx) })
	if app.consumers != nil {
		bg.Go(func() { queue.RunAll(bgCtx, drainCtx, app.consumers) })
	} else {
		for range cfg.Writers {
			bg.Go(func() { app.orders.RunWriter(bgCtx) })
		}
	}
	// The whole shutdown, requests in flight and then the drain, shares
	// one deadline: SHUTDOWN_GRACE after it began. Each step with a grace
	// of its own would take up to twice that, past the orchestrator's stop
	// grace period (docker compose: stop_grace_period), which then kills
	// the process mid-drain with SIGKILL.
	stopBackground := func(deadline context.Context) {
		stopBg()
		stop := context.AfterFunc(deadline, stopDrain)
		defer stop()
		bg.Wait()
		app.orders.Close() // a seed or reload still running, before the clients close
	}

	select {
	case err := <-serveErr:
		shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
		defer cancel()
		app.stopCrowd()
		srv.Shutdown(shutCtx) // if it was the metrics server that failed
		stopBackground(shutCtx)
		stopMetrics(shutCtx)
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: no new connections; waiting for requests in flight", "grace", cfg.ShutdownGrace)
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	app.stopCrowd()
	err = srv.Shutdown(shutCtx)
	stopBackground(shutCtx)
	stopMetrics(shutCtx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// stores are the connections to MySQL and Redis.
type stores struct {
	db      *gorm.DB
	rdb     redis.UniversalClient
	redlock []redis.UniversalClient
	tracer  *tracing.Tracer // nil: tracing off
	closers []func()
}

func (s *stores) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
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
	if cfg.embedded() {
		log.Warn("EMBEDDED DEMO MODE: in-process Redis and in-memory SQLite; single instance only, nothing is kept. Set MYSQL_DSN and REDIS_ADDR for the real stack.")
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("start embedded redis: %w", err)
		}
		st.closers = append(st.closers, mr.Close)
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
		dialector := mysql.Open(cfg.MySQLDSN)
		if tracer != nil {
			pool, err := tracer.OpenMySQL(cfg.MySQLDSN)
			if err != nil {
				return nil, fmt.Errorf("open mysql: %w", err)
			}
			dialector = mysql.New(mysql.Config{Conn: pool})
		}
		db, err := gorm.Open(dialector, gcfg)
		if err != nil {
			return nil, fmt.Errorf("open mysql: %w", err)
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
	if err := migrate(ctx, cfg, sqlDB, dialect); err != nil {
		st.close()
		return nil, err
	}
	return st, nil
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
func migrate(ctx context.Context, cfg config, pool *sql.DB, dialect string) error {
	if cfg.embedded() {
		return migrations.Apply(ctx, pool, dialect)
	}
	mcfg, err := gomysql.ParseDSN(cfg.MySQLDSN)
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

// app is the wired service.
type app struct {
	router    *gin.Engine
	live      *live.Recorder // counts the buy button's answers for /live
	crowd     *live.Crowd    // nil unless LIVE_CROWD
	stopLive  func()         // ends the /live event streams, at shutdown
	vouchers  *voucher.Service
	orders    *order.Service
	consumers []*queue.Consumer // async mode only: one per shard
	auth      *auth.Service
	metrics   *metrics.Metrics
}

func newApp(cfg config, st *stores, log *slog.Logger) (*app, error) {
	now := time.Now
	native := lock.NewRedis(st.rdb)
	var locks lock.Locker = native
	switch cfg.LockBackend {
	case "redlock":
		locks = lock.NewRedLock(st.redlock)
	case "local":
		log.Warn("LOCK_BACKEND=local: the per-user lock only excludes requests within this process; it does NOT protect several instances")
		locks = lock.NewLocal()
	}
	tokens := auth.NewTokens(cfg.JWTSecret, cfg.TokenTTL, now)
	stocks := stock.NewStore(st.rdb, cfg.StockHold)
	ids := idworker.New(st.rdb, now, order.IDFloor(st.db, st.rdb))

	// No SMS gateway ships with the project. A real one plugs in here, as
	// an auth.Sender; until then LogSender logs that a code was sent,
	// never the code: a log is read by many and kept for long. Only the
	// demo and AUTH_DEV_CODES=true, which answer the code anyway, log it.
	var sender auth.Sender = auth.NewLogSender(log)
	if cfg.embedded() || cfg.DevCodes {
		sender = auth.NewDevSender(log)
	}
	authSvc := auth.NewService(st.db, st.rdb, tokens, cfg.AdminPhones, sender, cfg.AuthLimits)
	vouchers := voucher.NewService(st.db, stocks, native, now, log)
	if cfg.Mode == "async" {
		vouchers.LimitBuckets(1)
	}
	// One registry per app, never Prometheus' global one: the tests run
	// several servers in one process.
	m := metrics.New(log)
	sqlDB, err := st.db.DB()
	if err != nil {
		return nil, err
	}
	m.WatchDB(sqlDB)
	m.WatchRedis(st.rdb)
	ocfg := order.DefaultConfig
	ocfg.WriteTimeout = cfg.WriteTimeout()
	ocfg.Async = cfg.Mode == "async"
	ocfg.Observer = m
	orders := order.NewService(st.db, st.rdb, vouchers, stocks, locks, ids, now, log, ocfg)

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	// The client's address (c.ClientIP, which the login code limits
	// count by) is the connection's peer. gin would take it from
	// X-Forwarded-For or X-Real-IP sent by any peer at all, so any client
	// could name a fresh address on every request. X-Forwarded-For is
	// honoured only from the proxies in TRUSTED_PROXIES (none by default:
	// nil trusts none); X-Real-IP never, since a proxy that sets only
	// X-Forwarded-For would pass a client's X-Real-IP through untouched.
	r.RemoteIPHeaders = []string{"X-Forwarded-For"}
	if err := r.SetTrustedProxies(cfg.TrustedProxies); err != nil {
		return nil, fmt.Errorf("TRUSTED_PROXIES: %w", err)
	}
	r.NoRoute(web.NotFound) // a known path with another method too: the contract has no 405
	fail := func(c *gin.Context, err error) { web.Error(c, log, err) }
	// Overload is answered first and fast: beyond MaxInFlight requests at
	// once, 429 before any work (package admission). Health checks pass,
	// so that an orchestrator does not kill a busy instance for being busy.
	// The answers of the buy button are counted first of all, so that
	// the cap's 429s and a recovered panic's 500 are counted too.
	// /metrics passes the cap as well: an overload is when it is wanted.
	// So do the /live event streams, which last as long as their page
	// (they have a cap of their own), but not the live page or the crowd.
	if trace := st.tracer.Middleware(cfg.Tracing.Service); trace != nil {
		r.Use(trace) // first: the request's span covers everything after
	}
	recorder := live.NewRecorder(st.rdb, log)
	r.Use(m.Seckill(order.SeckillRoute), recorder.Middleware(order.SeckillRoute), web.Recover(log),
		live.PassStreams(admission.NewCap(cfg.MaxInFlight).Limit(fail, "/healthz", "/readyz", "/metrics")), web.LimitBody())
	authn := tokens.Authenticate(fail)

	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", func(c *gin.Context) {
		if err := st.ping(c.Request.Context()); err != nil {
			web.Error(c, log, apperr.Down(err))
			return
		}
		c.JSON(http.StatusOK, gin.H{"status": "ok"})
	})
	api.Register(r) // GET /openapi.yaml: the API reference, machine-readable
	if cfg.MetricsAddr == "" {
		r.GET("/metrics", authn, auth.RequireAdmin(fail), gin.WrapH(m.Handler()))
	}
	auth.NewHandler(authSvc, cfg.DevCodes, log).Register(r)
	voucher.NewHandler(vouchers, log).Register(r, authn, auth.RequireAdmin(fail))
	buyers := admission.NewBuckets(cfg.SeckillRate, cfg.SeckillBurst, now)
	order.NewHandler(orders, log).Register(r, authn, auth.RequireAdmin(fail), buyers.PerUser(fail))
	a := &app{router: r, vouchers: vouchers, orders: orders, auth: authSvc, metrics: m, live: recorder}
	var queueStats func(context.Context) (order.QueueStats, error)
	if ocfg.Async {
		queueStats = orders.QueueStats
	}
	if cfg.LiveCrowd {
		a.crowd = live.NewCrowd(authSvc.TokenFor, log)
		a.crowd.SetTarget(r)
	}
	liveCtx, stopLive := context.WithCancel(context.Background())
	a.stopLive = stopLive
	live.NewHandler(live.NewSource(st.db, st.rdb, vouchers, stocks, queueStats, now), a.crowd, liveCtx.Done(), log).
		Register(r, authn, auth.RequireAdmin(fail))
	if ocfg.Async {
		qcfg := queue.DefaultConfig
		qcfg.Consumer, qcfg.ClaimIdle, qcfg.Batch, qcfg.MaxDeliveries = cfg.Consumer, cfg.ClaimIdle, cfg.Batch, cfg.MaxDeliveries
		qcfg.Observer = m
		m.WatchQueue(orders.QueueStats)
		a.consumers = queue.NewShards(st.db, st.rdb, now, qcfg, log)
	}
	return a, nil
}

// stopCrowd stops the simulated crowd, if any, and waits for its last
// presses. It must come before the server's Shutdown: the crowd's presses
// go to the router directly, not through the server, so Shutdown would
// neither refuse nor wait for them, and the crowd would go on buying
// through the drain.
func (a *app) stopCrowd() {
	if a.crowd != nil {
		a.crowd.Close()
	}
}

// seedDemo creates a voucher on sale for a day, so the demo has something
// to buy at once.
func (a *app) seedDemo(ctx context.Context, log *slog.Logger) {
	title, stockN := "Demo voucher", int64(100)
	begin, end := time.Now().Add(-time.Minute), time.Now().Add(24*time.Hour)
	v, err := a.vouchers.Create(ctx, 0, "", voucher.CreateInput{Title: &title, Stock: &stockN, BeginTime: &begin, EndTime: &end})
	if err != nil {
		log.Warn("seed demo voucher", "err", err)
		return
	}
	log.Info("demo voucher on sale", "id", v.ID, "stock", v.Stock, "admin_phone", "13800000000")
}
