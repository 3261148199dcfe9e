package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/admission"
	"seckill/internal/auth"
	"seckill/internal/fleet"
	"seckill/internal/idworker"
	"seckill/internal/live"
	"seckill/internal/lock"
	"seckill/internal/metrics"
	"seckill/internal/order"
	"seckill/internal/order/queue"
	"seckill/internal/payment"
	"seckill/internal/room"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// app is the wired service: every feature built with what it needs, and
// the router that serves them (routes.go).
type app struct {
	router    *gin.Engine
	tokens    *auth.Tokens
	auth      *auth.Service
	vouchers  *voucher.Service
	orders    *order.Service
	queue     *queue.Queue
	consumers []*queue.Consumer // async mode only: one per shard
	metrics   *metrics.Metrics
	live      *live.Recorder // counts the buy button's answers for /live
	liveSrc   *live.Source   // reads a sale's figures for /live
	crowd     *live.Crowd    // nil unless LIVE_CROWD
	payments  *payment.Fake  // nil unless PAYMENT_FAKE: the demo's payment provider
	rooms     *room.Store    // the waiting rooms' lines
	admitter  *room.Admitter // admits the next buyers of every room, a few times a second
	liveDone  context.Context
	stopLive  func()           // ends the /live event streams, at shutdown
	slots     *admission.Cap   // MAX_IN_FLIGHT, shared among client addresses
	conns     *admission.Conns // MAX_CONNS_PER_ADDR and MAX_CONNS_PER_IPV6_48, on the listener
	fleet     *fleet.Fleet     // this instance's announcement, and the others' (package fleet)
}

// newApp builds the features on the stores, then the router.
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
	stocks := stock.NewStore(st.rdb, cfg.StockHold)
	a := &app{tokens: auth.NewTokens(cfg.JWTSecret, cfg.TokenTTL, st.rdb, now), queue: queue.New(st.rdb, stocks), slots: admission.NewCap(cfg.MaxInFlight)}
	trusted, err := admission.ParsePrefixes(cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("TRUSTED_PROXIES: %w", err)
	}
	a.conns = admission.NewConns(cfg.MaxConnsPerAddr, cfg.MaxConnsPer48, trusted)
	ids := idworker.New(st.rdb, now, order.IDFloor(st.causal(), a.queue))

	// No SMS gateway ships with the project. A real one plugs in here, as
	// an auth.Sender; until then LogSender logs that a code was sent,
	// never the code: a log is read by many and kept for long. Only the
	// demo and AUTH_DEV_CODES=true, which answer the code anyway, log it.
	var sender auth.Sender = auth.NewLogSender(log)
	if cfg.embedded() || cfg.DevCodes {
		sender = auth.NewDevSender(log)
	}
	a.auth = auth.NewService(st.db, st.rdb, a.tokens, cfg.AdminPhones, sender, cfg.AuthLimits)
	a.rooms = room.NewStore(st.rdb)
	a.vouchers = voucher.NewService(st.db, stocks, a.rooms, native, now, log)
	// One registry per app, never Prometheus' global one: the tests run
	// several servers in one process.
	a.metrics = metrics.New(log)
	sqlDB, err := st.db.DB()
	if err != nil {
		return nil, err
	}
	a.metrics.WatchDB(sqlDB)
	a.metrics.WatchRedis(st.rdb)
	// Every instance says in Redis which version it runs, named as its
	// consumer is (CONSUMER_NAME, host:port by default), so that a
	// feature an older one cannot serve is refused while it runs.
	a.fleet = fleet.New(st.rdb, fleet.Self(cfg.Consumer, cfg.Mode, now()), fleet.Fresh, log)
	a.vouchers.SetFleet(a.fleet, cfg.Mode == "async")
	a.metrics.WatchInstances(a.fleet.Known)
	ocfg := order.DefaultConfig
	ocfg.WriteTimeout = cfg.WriteTimeout()
	ocfg.Async = cfg.Mode == "async"
	ocfg.Truth = st.truth
	ocfg.Observer = a.metrics
	// No payment provider ships with the project. A real one's client
	// plugs in here, as a payment.Provider; the fake one confirms every
	// charge through the webhook, so it is for the demo and tests only.
	if cfg.PaymentFake { // run warns of it, with the other development settings
		a.payments = payment.NewFake(cfg.PaymentSecret, log)
		ocfg.Provider = a.payments
	}
	a.orders = order.NewService(st.db, a.queue, a.vouchers, stocks, locks, ids, now, log, ocfg)
	a.admitter = room.NewAdmitter(a.rooms, a.vouchers.Rooms, a.findRoom, a.orders.Restock, a.metrics, now, log)

	a.live = live.NewRecorder(st.rdb, log)
	var queueStats func(context.Context) (queue.Stats, error)
	if ocfg.Async {
		queueStats = a.queue.Stats
		a.metrics.WatchQueue(a.queue.Stats)
		qcfg := queue.DefaultConfig
		qcfg.Consumer, qcfg.ClaimIdle, qcfg.Batch, qcfg.MaxDeliveries = cfg.Consumer, cfg.ClaimIdle, cfg.Batch, cfg.MaxDeliveries
		qcfg.OnBatch = a.metrics.ConsumerBatch
		a.consumers = queue.NewConsumers(st.rdb, a.orders.QueueWriter(), now, qcfg, log)
		// An instance of a version before announcing still reads the
		// streams: /readyz lists its consumer apart.
		streams := make([]string, stock.Shards)
		for k := range streams {
			streams[k] = queue.StreamKey(k)
		}
		a.fleet.WatchConsumers(streams, queue.GroupName)
	}
	a.liveSrc = live.NewSource(st.db, st.rdb, a.vouchers, stocks, queueStats, now)
	if cfg.LiveCrowd {
		a.crowd = live.NewCrowd(a.auth.TokenFor, log)
	}
	a.liveDone, a.stopLive = context.WithCancel(context.Background())

	if a.router, err = a.routes(cfg, st, log); err != nil {
		return nil, err
	}
	if a.crowd != nil {
		a.crowd.SetTarget(a.router) // the crowd presses the buy button through the router itself
	}
	if a.payments != nil {
		a.payments.SetTarget(a.router) // and the fake provider calls the webhook so
	}
	return a, nil
}

// findRoom finds the waiting room of a voucher: nil for a voucher
// without one.
func (a *app) findRoom(ctx context.Context, voucherID int64) (*room.Sale, error) {
	v, err := a.vouchers.Find(ctx, voucherID)
	if err != nil {
		return nil, err
	}
	return v.Room(), nil
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
	if a.payments != nil {
		a.payments.Close()
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
