package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/api"
	"seckill/internal/admission"
	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/live"
	"seckill/internal/order"
	"seckill/internal/order/queue"
	"seckill/internal/room"
	"seckill/internal/voucher"
	"seckill/internal/web"
)

// Every route of the server, with its middleware, is here: what a request
// passes through, in order, is read from this file alone. The features own
// their handlers; none of them adds a route of its own.

// Two routes are named twice: the middleware that count the buy button's
// answers, and the one that lets the live page's event streams past the
// cap on requests in flight, recognise their route by its pattern.
const (
	seckillRoute    = "/seckill/:voucherId"
	eventsRoute     = "/live/:voucherId/events"
	roomEventsRoute = "/vouchers/:id/room/events"
)

// routes builds the router of the main port.
func (a *app) routes(cfg config, st *stores, log *slog.Logger) (*gin.Engine, error) {
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

	// Every request, outermost first. The request's span covers
	// everything after it. The answers of the buy button are counted
	// before anything else can answer, so that the cap's 429s and a
	// recovered panic's 500 are counted too. Every answer gets the
	// security headers (web.Harden). Then the body is read whole, under
	// a deadline of its own, before the request may hold a slot: a client
	// trickling its body in holds none (web.ReadBody; a body over
	// web.SmallBody, which no route of the contract needs, is read once
	// its request holds a slot, so that it is not buffered unbounded). Overload is
	// answered next and fast: beyond MAX_IN_FLIGHT requests at once, or
	// past an address's share of them, 429 before any work (package
	// admission). Health checks pass, so that an orchestrator does not
	// kill a busy instance for being busy; /metrics passes as well: an
	// overload is when it is wanted. So do the /live event streams, which
	// last as long as their page (they have caps of their own), but not
	// the live page or the crowd.
	// The map of values gin keeps per request (c.Set, c.Get) is reused
	// from one request to the next (web.ReuseKeys), before anything calls
	// c.Set. So nothing may use c, or c as a context.Context, once its
	// handler has returned: a goroutine that outlives the request takes
	// c.Copy() or c.Request.Context(), never c. (A straggler reading the
	// map would see the next request's values, another buyer's identity.)
	r.Use(web.ReuseKeys())
	if trace := st.tracer.Middleware(cfg.Tracing.Service); trace != nil {
		r.Use(trace)
	}
	inFlight := a.slots.Limit(fail, "/healthz", "/readyz", "/metrics")
	r.Use(web.Observe(seckillRoute, a.metrics.ObserveSeckill, a.live.Observe), web.Recover(log),
		web.Harden(), web.ReadBody(cfg.BodyTimeout, web.SmallBody), live.PassStreams(roomEventsRoute, live.PassStreams(eventsRoute, inFlight)),
		web.ReadBody(cfg.BodyTimeout, web.MaxBody))

	// What a route may ask for besides: a token (authn, which sets
	// auth.From), an admin's token (admin, after authn), the role a token
	// claims checked where an admin may do more than a user (role, after
	// authn), and the buyer's own rate on the buy button (a user's
	// requests over it are refused before any work). admin and role hold
	// a token's admin role against ADMIN_PHONES as this instance has it
	// now, not as it was at login (package auth, roles.go); the buy button
	// needs neither.
	authn := a.tokens.Authenticate(fail)
	admin := a.auth.RequireAdmin(fail)
	role := a.auth.CurrentRole(fail)
	throttle := admission.NewBuckets(cfg.SeckillRate, cfg.SeckillBurst, time.Now).PerUser(fail)

	// Health, and the API's own description.
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	// /readyz is 200 while MySQL and Redis answer (the contract), and
	// says besides how loaded the instance is: "saturated" when its cap
	// refused a request in the last second. It stays 200 then: in a flash
	// sale every instance is saturated at once, and a balancer that took
	// them all out of rotation would answer nobody. It shows too which
	// version this instance runs, and the versions of every instance
	// alive as this one last saw them (package fleet): during a rolling
	// upgrade, how far it has got.
	r.GET("/readyz", func(c *gin.Context) {
		if err := st.ping(c.Request.Context()); err != nil {
			web.Error(c, log, apperr.Down(err))
			return
		}
		inFlight, capacity, saturated := a.slots.Load()
		self := a.fleet.Self()
		c.JSON(http.StatusOK, gin.H{"status": "ok", "saturated": saturated,
			"in_flight": inFlight, "max_in_flight": capacity, "refused_connections": a.conns.Refused(),
			"version": self.Revision, "level": self.Level, "instances": orEmpty(a.fleet.Known()),
			"unannounced_consumers": orEmpty(a.fleet.Unannounced())})
	})
	r.GET("/openapi.yaml", api.Serve)

	// Logging in, and out everywhere (package auth).
	login := auth.NewHandler(a.auth, cfg.DevCodes, log)
	r.POST("/auth/code", login.SendCode)
	r.POST("/auth/login", login.Login)
	r.POST("/auth/logout", authn, login.Logout)

	// Vouchers (package voucher).
	vouchers := voucher.NewHandler(a.vouchers, log)
	r.POST("/vouchers", authn, admin, vouchers.Create)
	r.GET("/vouchers", vouchers.List)
	r.GET("/vouchers/:id", vouchers.Get)

	// A voucher's waiting room (package room): join the line, see where
	// you stand, and follow it as it moves. The buy button of a room's
	// voucher sells to admitted buyers only (package order, stock).
	rooms := room.NewHandler(a.rooms, a.findRoom, a.orders.Restock, a.metrics, a.liveDone.Done(), log)
	r.POST("/vouchers/:id/room", authn, rooms.Join)
	r.GET("/vouchers/:id/room", authn, rooms.Place)
	r.GET(roomEventsRoute, authn, rooms.Events)

	// The sale, and the order's life after it (package order): paid
	// through the provider, whose webhook carries a signature instead of a
	// token, cancelled, refunded.
	orders := order.NewHandler(a.orders, cfg.PaymentSecret, time.Now, log)
	r.POST(seckillRoute, authn, throttle, orders.Seckill)
	r.GET("/orders/:id", authn, role, orders.Get)
	r.POST("/orders/:id/pay", authn, orders.Pay)
	r.POST("/orders/:id/cancel", authn, orders.Cancel)
	r.POST("/orders/:id/refund", authn, role, orders.Refund)
	r.POST("/payments/webhook", orders.Webhook)

	// Async mode's queue, for admins (package order/queue). In sync mode
	// nothing is queued (what an earlier async run left shows), and a
	// replay is refused.
	var restock queue.Restocker
	if cfg.Mode == "async" {
		restock = a.orders.Restock
	}
	q := queue.NewHandler(a.queue, restock, log)
	r.GET("/admin/queue", authn, admin, q.Stats)
	r.GET("/admin/dead-letters", authn, admin, q.DeadLetters)
	r.POST("/admin/dead-letters/replay", authn, admin, q.Replay)

	// Watching a sale (package live, and package metrics when METRICS_ADDR
	// does not give /metrics a port of its own).
	watch := live.NewHandler(a.liveSrc, a.crowd, a.liveDone.Done(), log)
	r.GET("/live/:voucherId", watch.Page)
	r.GET(eventsRoute, watch.Events)
	r.POST("/live/:voucherId/crowd", authn, admin, watch.StartCrowd)
	if cfg.MetricsAddr == "" {
		r.GET("/metrics", authn, admin, gin.WrapH(a.metrics.Handler()))
	}
	return r, nil
}

// metricsRoutes is the router of METRICS_ADDR's port: /metrics without
// authentication, for a Prometheus server on a private network (it holds
// no token), and with PPROF Go's profiles, which a performance
// investigation starts from (BENCHMARKS.md): on the private port only, as
// a CPU profile costs the server while it runs.
func (a *app) metricsRoutes(cfg config) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics.Handler())
	if cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// orEmpty is list as /readyz answers it: an empty list, not null, before
// the first announcement.
func orEmpty[T any](list []T) []T {
	if list == nil {
		return []T{}
	}
	return list
}
