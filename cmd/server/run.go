package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"seckill/internal/fleet"
	"seckill/internal/order/queue"
	"seckill/internal/room"
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
	// Listen before the demo's voucher is announced: on a port already
	// taken the server fails before it says anything is on sale.
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	if err := checkBound(cfg, ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	// No address holds more than MAX_CONNS_PER_ADDR connections, and no
	// IPv6 /48 more than MAX_CONNS_PER_IPV6_48.
	ln = app.conns.Listener(ln)
	warnDev(cfg, log)
	// Announced before the first request: from now on an older instance
	// alive is seen by this one, and this one by the others. A failure
	// is tried again every few seconds (fleet.Run).
	if err := app.fleet.Announce(ctx); err != nil {
		log.Warn("announce this instance", "err", err)
	}
	if cfg.embedded() {
		app.seedDemo(ctx, log)
	}
	srv := &http.Server{
		Handler: app.router,
		// A client that sends its request slowly holds a goroutine and a
		// connection for as long as it likes unless these cut it off.
		// The body has a shorter deadline of its own (web.ReadBody).
		ReadHeaderTimeout: readTimeout,
		ReadTimeout:       readTimeout,
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
	log.Info("listening", "addr", ln.Addr().String(), "mode", cfg.Mode, "lock", cfg.LockBackend, "embedded", cfg.embedded(),
		"instance", app.fleet.Self().Name, "version", app.fleet.Self().Revision, "level", app.fleet.Self().Level)
	// With METRICS_ADDR, /metrics has a server of its own, without
	// authentication: a Prometheus server scrapes it from a private
	// network, and it holds no token. Without, it is on the main port,
	// for admins (routes.go).
	var metricsSrv *http.Server
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			srv.Close()
			return fmt.Errorf("listen on METRICS_ADDR %s: %w", cfg.MetricsAddr, err)
		}
		metricsSrv = &http.Server{Handler: app.metricsRoutes(cfg), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 75 * time.Second}
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
	bg.Go(func() { app.orders.RunExpirer(bgCtx, cfg.SweepEvery) })
	bg.Go(func() { app.admitter.Run(bgCtx, room.AdmitEvery) })
	bg.Go(func() { app.live.Run(bgCtx) })
	// The announcements go on through the drain, as long as the consumer
	// reads: an instance still reading the streams counts as alive.
	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	var announcing sync.WaitGroup
	announcing.Go(func() { app.fleet.Run(fleetCtx, fleet.Every) })
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
		stopFleet()
		announcing.Wait()
		// Last, once its consumer has drained: the others stop counting
		// this instance at once, not after fleet.Fresh.
		leaveCtx, cancel := context.WithTimeout(context.WithoutCancel(deadline), 2*time.Second)
		defer cancel()
		if err := app.fleet.Leave(leaveCtx); err != nil {
			log.Warn("leave the fleet", "err", err)
		}
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

// warnDev says loudly, once per setting, which development settings are
// on and who can reach them (devVars).
func warnDev(cfg config, log *slog.Logger) {
	if cfg.LoopbackFrom != "" {
		log.Warn("development settings are on: listening on loopback only; set ALLOW_DEV_SETTINGS_ON_NETWORK=true to listen on every interface",
			"HTTP_ADDR", cfg.LoopbackFrom, "listening", cfg.HTTPAddr, "settings", strings.Join(cfg.DevSettings, ","))
	}
	for _, name := range cfg.DevSettings {
		what := map[string]string{
			"AUTH_DEV_CODES": "POST /auth/code answers the login code: anyone who reaches the port logs in as anyone, the admin too",
			"LIVE_CROWD":     "admins may start a simulated crowd that buys with made-up users",
			"PAYMENT_FAKE":   "POST /orders/{id}/pay is confirmed by a fake payment provider, with no money taken",
		}[name]
		log.Warn("DEVELOPMENT SETTING ON: never in production", "setting", name, "effect", what, "on_network", cfg.DevOnNetwork)
	}
}

// checkBound refuses a bound address that is not loopback while a
// development setting is on (without ALLOW_DEV_SETTINGS_ON_NETWORK).
// devVars judged HTTP_ADDR by its text; a host name such as "localhost"
// is whatever the resolver says it is, so the bound address decides.
func checkBound(cfg config, addr net.Addr) error {
	if len(cfg.DevSettings) == 0 || cfg.DevOnNetwork {
		return nil
	}
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%s on %s, which is not loopback: set ALLOW_DEV_SETTINGS_ON_NETWORK=true if every client that reaches it is yours", strings.Join(cfg.DevSettings, ", "), addr)
}
