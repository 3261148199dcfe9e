package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/glebarez/sqlite"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order"
	"seckill/internal/stock"
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
	srv := &http.Server{Handler: app.router, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "mode", cfg.Mode, "lock", cfg.LockBackend, "embedded", cfg.embedded())

	// Background work runs under its own context, stopped only after the
	// last request has finished: a request may still need it. The
	// persister then gets a drain context of its own, to write what the
	// last requests accepted.
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	drainCtx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDrain()
	var bg sync.WaitGroup
	bg.Go(func() { app.orders.RunSweeper(bgCtx, cfg.SweepEvery) })
	if app.persister != nil {
		bg.Go(func() { app.persister.Run(bgCtx, drainCtx) })
	} else {
		for range order.Writers {
			bg.Go(func() { app.orders.RunWriter(bgCtx) })
		}
	}
	stopBackground := func() {
		stopBg()
		timer := time.AfterFunc(cfg.ShutdownGrace, stopDrain)
		defer timer.Stop()
		bg.Wait()
	}

	select {
	case err := <-serveErr:
		stopBackground()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: no new connections; waiting for requests in flight", "grace", cfg.ShutdownGrace)
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	err = srv.Shutdown(shutCtx)
	stopBackground()
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
		st.rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
		// A name of its own: two demos in one process must not share it.
		name := fmt.Sprintf("seckill-demo-%d-%d", os.Getpid(), time.Now().UnixNano())
		db, err := gorm.Open(sqlite.Open("file:"+name+"?mode=memory&cache=shared&_pragma=busy_timeout(5000)"), gcfg)
		if err != nil {
			return nil, fmt.Errorf("open embedded sqlite: %w", err)
		}
		st.db = db
		dialect = migrations.SQLite
	} else {
		st.rdb = redis.NewClient(&redis.Options{
			Addr: cfg.RedisAddr, DB: cfg.RedisDB, PoolSize: cfg.RedisPoolSize,
			// Fail fast when Redis is down: a request answers 503 in about
			// a second instead of piling up behind redials. And never
			// retry: the stock scripts are not idempotent, and a retry
			// after a lost reply would answer "already ordered" to the
			// user whose unit the first run took.
			DialTimeout: time.Second, MaxRetries: -1,
		})
		db, err := gorm.Open(mysql.Open(cfg.MySQLDSN), gcfg)
		if err != nil {
			return nil, fmt.Errorf("open mysql: %w", err)
		}
		st.db = db
	}
	st.closers = append(st.closers, func() { st.rdb.Close() })
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
		c := redis.NewClient(&redis.Options{Addr: addr})
		st.redlock = append(st.redlock, c)
		st.closers = append(st.closers, func() { c.Close() })
	}

	if err := waitUp(ctx, cfg.StartupWait, log, st); err != nil {
		st.close()
		return nil, err
	}
	if err := migrations.Apply(ctx, sqlDB, dialect); err != nil {
		st.close()
		return nil, err
	}
	return st, nil
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
	vouchers  *voucher.Service
	orders    *order.Service
	persister *order.Persister // async mode only
	auth      *auth.Service
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
	ids := idworker.New(st.rdb, now)

	authSvc := auth.NewService(st.db, st.rdb, tokens, cfg.AdminPhones, func(ctx context.Context, phone, code string) {
		// No SMS gateway ships with the project: the log stands in for one.
		log.InfoContext(ctx, "login code (stand-in for an SMS)", "phone", phone, "code", code)
	})
	vouchers := voucher.NewService(st.db, stocks, native, now, log)
	ocfg := order.DefaultConfig
	ocfg.WriteTimeout = cfg.WriteTimeout()
	ocfg.Async = cfg.Mode == "async"
	orders := order.NewService(st.db, st.rdb, vouchers, stocks, locks, ids, now, log, ocfg)

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.NoRoute(web.NotFound) // a known path with another method too: the contract has no 405
	r.Use(web.Recover(log), web.LimitBody())
	fail := func(c *gin.Context, err error) { web.Error(c, log, err) }
	authn := tokens.Authenticate(fail)

	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", func(c *gin.Context) {
		if err := st.ping(c.Request.Context()); err != nil {
			web.Error(c, log, apperr.Down(err))
			return
		}
		c.JSON(http.StatusOK, gin.H{"status": "ok"})
	})
	auth.NewHandler(authSvc, cfg.DevCodes, log).Register(r)
	voucher.NewHandler(vouchers, log).Register(r, authn, auth.RequireAdmin(fail))
	order.NewHandler(orders, log).Register(r, authn, auth.RequireAdmin(fail))
	a := &app{router: r, vouchers: vouchers, orders: orders, auth: authSvc}
	if ocfg.Async {
		qcfg := order.DefaultQueueConfig
		qcfg.Consumer, qcfg.ClaimIdle, qcfg.Batch, qcfg.MaxDeliveries = cfg.Consumer, cfg.ClaimIdle, cfg.Batch, cfg.MaxDeliveries
		a.persister = order.NewPersister(orders, qcfg, log)
	}
	return a, nil
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
