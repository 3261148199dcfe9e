// Package metrics lets a person running a flash sale watch it: it counts
// what the seckill path does and serves the counts at GET /metrics in
// Prometheus' text format, for a Prometheus server to scrape every few
// seconds and a dashboard to draw.
//
// What is measured, and where:
//   - every answer to POST /seckill/{voucherId}, by the contract's outcome
//     code, and how long the whole request took (Seckill, a middleware);
//   - how long each stage of a request took: the stock script in Redis, the
//     per-user lock, the MySQL commit; what became of the lock; how many
//     orders each group commit wrote; the transactions of orders that
//     lost a conflict and were run again; what the sweeper repaired
//     (package order reports them through order.Observer, which Metrics
//     implements);
//   - how many entries each batch of async mode's consumer wrote
//     (ConsumerBatch, the consumer's Config.OnBatch);
//   - read when scraped: the orders stream's backlog, the Redis and
//     MySQL connection pools, and the versions of the instances alive
//     (package fleet).
//
// Packages order and queue never import Prometheus: they report to a small
// interface (order.Observer) or a function (queue.Config.OnBatch) of their
// own, and a Service built without one (most tests) reports to nobody. Nor does this package import order: the outcome of an
// answer is the code package web recorded (web.Answer), and stages and
// lock results are named by the strings that label them. Every Metrics has a registry of its own, not
// Prometheus' global one, so that several servers can run in one process
// (the tests do) without counting into each other's figures.
//
// The request path pays a few atomic additions and nothing else: every
// labelled series is looked up once, in New, not per request.
package metrics

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
	"seckill/internal/fleet"
	"seckill/internal/order/queue"
	"seckill/internal/web"
)

// Metrics holds one server's collectors and its registry. It implements
// order.Observer.
type Metrics struct {
	reg *prometheus.Registry
	log *slog.Logger

	answers     map[apperr.Code]prometheus.Counter // read-only after New
	answerOK    prometheus.Counter
	request     prometheus.Observer
	stages      map[string]prometheus.Observer // read-only after New
	locks       map[string]prometheus.Counter  // read-only after New
	committed   prometheus.Observer
	conflicts   prometheus.Counter
	consumer    prometheus.Observer
	reclaimed   prometheus.Counter
	unconfirmed prometheus.Counter
	drift       prometheus.Counter
	paid        prometheus.Counter
	cancelled   map[string]prometheus.Counter // by reason; read-only after New
	refunded    prometheus.Counter
	returned    prometheus.Counter
	// The waiting rooms (package room): joins, admissions, holds that
	// ended without an order, and the wait from joining (or from the
	// draw, for who joined before it) to admission.
	joins, admissions, expired prometheus.Counter
	wait                       prometheus.Observer
}

// codes are the contract's error codes (apperr), each a value of the
// answers' code label.
var codes = []apperr.Code{
	apperr.InvalidArgument, apperr.Unauthorized, apperr.Forbidden, apperr.NotFound,
	apperr.NotStarted, apperr.Ended, apperr.NotAdmitted, apperr.SoldOut, apperr.AlreadyOrdered,
	apperr.InvalidState, apperr.Busy, apperr.Unavailable, apperr.Internal,
}

// The values of the stage and result labels: what package order reports
// (order.StageStock and the rest, order.LockObtained and the rest). Each
// series exists from the start, at zero, so that a dashboard shows it
// before its first event.
var (
	stageNames      = []string{"stock", "lock", "commit", "confirm"}
	lockResultNames = []string{"obtained", "contended", "lost"}
	cancelReasons   = []string{"buyer", "timeout"}
)

// Buckets. A stage takes well under a millisecond when all is well and
// seconds when something waits (a pool, a row lock, a failover): doubling
// buckets from half a millisecond to about 8s show both.
var (
	latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 15)
	// Batches run from 1 order (a quiet moment) to 500 (ASYNC_BATCH's
	// default).
	batchBuckets = prometheus.ExponentialBuckets(1, 2, 10)
)

// New returns a Metrics with the Go runtime's and the process's own
// collectors registered (memory, goroutines, CPU, open files). log is
// told of a scrape that could not read everything.
func New(log *slog.Logger) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{reg: reg, log: log, answers: map[apperr.Code]prometheus.Counter{},
		stages: map[string]prometheus.Observer{}, locks: map[string]prometheus.Counter{}}

	answers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seckill_answers_total",
		Help: "Answers to POST /seckill/{voucherId}, by outcome: ok is a 200 (an order), the others are the error codes of the API reference (sold_out, already_ordered, busy, ...).",
	}, []string{"code"})
	m.answerOK = answers.WithLabelValues("ok")
	for _, c := range codes {
		m.answers[c] = answers.WithLabelValues(string(c))
	}
	request := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "seckill_request_duration_seconds",
		Help:    "Time from receiving a POST /seckill/{voucherId} to answering it, whatever the answer.",
		Buckets: latencyBuckets,
	})
	m.request = request
	stages := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "seckill_stage_duration_seconds",
		Help: "Time spent in one stage of a seckill request: stock is the stock script in Redis (every request that gets that far), " +
			"lock obtaining the per-user lock, commit writing the order to MySQL (sync mode; includes waiting for the group commit), " +
			"confirm closing the holds of committed orders in Redis (sync mode; one observation a group commit's batch, from its COMMIT, or an order's own confirm when it was written alone).",
		Buckets: latencyBuckets,
	}, []string{"stage"})
	for _, s := range stageNames {
		m.stages[s] = stages.WithLabelValues(s)
	}
	locks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seckill_user_lock_total",
		Help: "The per-user lock of sync mode: obtained, contended (another request of the same user held it: answered busy), " +
			"or lost before release (its renewal failed; the order was written without the lock's protection to the end).",
	}, []string{"result"})
	for _, r := range lockResultNames {
		m.locks[r] = locks.WithLabelValues(r)
	}
	committed := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "seckill_group_commit_batch_size",
		Help:    "Orders written per MySQL transaction by sync mode's group commit: many means requests arrived together and shared one COMMIT.",
		Buckets: batchBuckets,
	})
	m.committed = committed
	conflicts := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "seckill_mysql_conflicts_total",
		Help: "Transactions of orders (sync mode's group commit and single writes, async mode's batches) that MySQL rolled back for a conflict " +
			"(error 1213: a deadlock, or on a Galera cluster another node's write to the same row certified first), each counted once, whether it was run again or was the last of its tries.",
	})
	m.conflicts = conflicts
	consumer := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "seckill_consumer_batch_size",
		Help:    "Stream entries settled per MySQL transaction by async mode's consumer.",
		Buckets: batchBuckets,
	})
	m.consumer = consumer
	reclaimed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "seckill_holds_reclaimed_total",
		Help: "Units of stock the sweeper put back on sale because the request that took them died (or failed to give them back) before writing its order.",
	})
	m.reclaimed = reclaimed
	unconfirmed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "seckill_holds_unconfirmed_total",
		Help: "Holds of committed orders (sync mode) whose close in Redis after the COMMIT was not acknowledged (Redis failed or did not answer in time; a lost reply may have closed some): " +
			"each still open stays so until it expires, and the sweeper, finding its order's row, closes it then and keeps the buyer.",
	})
	m.unconfirmed = unconfirmed
	drift := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "seckill_stock_drift_corrected_total",
		Help: "Times the sweeper found a voucher's stock in Redis different from MySQL's and set it to MySQL's.",
	})
	m.drift = drift
	lifecycle := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		reg.MustRegister(c)
		return c
	}
	m.paid = lifecycle("seckill_orders_paid_total", "Orders paid: payment events applied (POST /payments/webhook).")
	m.refunded = lifecycle("seckill_orders_refunded_total", "Paid orders refunded, by their buyer or an admin.")
	m.joins = lifecycle("seckill_room_joins_total", "Buyers who joined a waiting room (joining again, for the same place, is not counted).")
	m.admissions = lifecycle("seckill_room_admissions_total", "Buyers a waiting room admitted, by this instance's Admitter.")
	m.expired = lifecycle("seckill_room_holds_expired_total", "Admissions that ended without an order (the unit went to the next number), seen by this instance's Admitter.")
	wait := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "seckill_room_wait_seconds",
		Help:    "Seconds from joining a waiting room (or from begin_time, for who joined before the draw) to admission, of the buyers this instance's Admitter admitted.",
		Buckets: prometheus.ExponentialBuckets(0.25, 2, 14),
	})
	reg.MustRegister(wait)
	m.wait = wait
	m.returned = lifecycle("seckill_units_returned_total",
		"Units of cancelled and refunded orders put back on sale in Redis. Equal, at rest, to cancelled plus refunded orders.")
	cancelled := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "seckill_orders_cancelled_total",
		Help: "Unpaid orders cancelled: by their buyer, or by their deadline (timeout).",
	}, []string{"reason"})
	m.cancelled = map[string]prometheus.Counter{}
	for _, r := range cancelReasons {
		m.cancelled[r] = cancelled.WithLabelValues(r)
	}
	reg.MustRegister(answers, request, stages, locks, committed, conflicts, consumer, reclaimed, unconfirmed, drift, cancelled)
	return m
}

// Handler serves the registry's metrics in Prometheus' text format. A
// collector that fails (Redis down while reading the queue) does not fail
// the scrape: the rest is served, and the failure logged.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.reg, // promhttp_metric_handler_errors_total: scrapes that hit an error
	})
}

// Seckill is a middleware, to be installed before every other (the
// overload cap and panic recovery included, so that their answers count
// too), that counts the answers of the route named route (gin's pattern,
// such as "/seckill/:voucherId") and times them. Other routes pass through.
// cmd/server installs ObserveSeckill instead, through web.Observe with
// the live recorder's observer, so that one middleware times both.
func (m *Metrics) Seckill(route string) gin.HandlerFunc {
	return web.Observe(route, m.ObserveSeckill)
}

// ObserveSeckill is a web.Observer: it counts an answer of the buy button
// and times it.
//
// The outcome is the code the answer was given with (web.Answer): the
// status alone could not tell sold_out, already_ordered, not_started and
// ended apart (all 409).
func (m *Metrics) ObserveSeckill(_ *gin.Context, answer string, took time.Duration) {
	m.request.Observe(took.Seconds())
	m.answer(answer).Inc()
}

// answer is the counter of the answer a.
func (m *Metrics) answer(a string) prometheus.Counter {
	if a == "ok" {
		return m.answerOK
	}
	if counter, ok := m.answers[apperr.Code(a)]; ok {
		return counter
	}
	return m.answers[apperr.Internal]
}

// Stage implements order.Observer. A stage not in stageNames is not
// counted: a name the dashboard does not know would go unseen anyway.
func (m *Metrics) Stage(stage string, d time.Duration) {
	if o, ok := m.stages[stage]; ok {
		o.Observe(d.Seconds())
	}
}

// UserLock implements order.Observer.
func (m *Metrics) UserLock(result string) {
	if c, ok := m.locks[result]; ok {
		c.Inc()
	}
}

// Committed implements order.Observer.
func (m *Metrics) Committed(n int) { m.committed.Observe(float64(n)) }

// Conflict implements order.Observer.
func (m *Metrics) Conflict() { m.conflicts.Inc() }

// Reclaimed implements order.Observer.
func (m *Metrics) Reclaimed() { m.reclaimed.Inc() }

// Unconfirmed implements order.Observer.
func (m *Metrics) Unconfirmed(n int) { m.unconfirmed.Add(float64(n)) }

// DriftCorrected implements order.Observer.
func (m *Metrics) DriftCorrected() { m.drift.Inc() }

// Paid implements order.Observer.
func (m *Metrics) Paid() { m.paid.Inc() }

// Cancelled implements order.Observer.
func (m *Metrics) Cancelled(reason string) {
	if c, ok := m.cancelled[reason]; ok {
		c.Inc()
	}
}

// Refunded implements order.Observer.
func (m *Metrics) Refunded() { m.refunded.Inc() }

// Returned implements order.Observer.
func (m *Metrics) Returned() { m.returned.Inc() }

// Joined, Admitted and HoldsExpired implement room.Observer.
func (m *Metrics) Joined() { m.joins.Inc() }

// Admitted counts buyers admitted, each with their wait.
func (m *Metrics) Admitted(waits []time.Duration) {
	m.admissions.Add(float64(len(waits)))
	for _, w := range waits {
		m.wait.Observe(w.Seconds())
	}
}

// HoldsExpired counts holds that ended without an order.
func (m *Metrics) HoldsExpired(n int) { m.expired.Add(float64(n)) }

// ConsumerBatch counts one transaction of async mode's consumer that
// settled n entries (queue.Config.OnBatch).
func (m *Metrics) ConsumerBatch(n int) { m.consumer.Observe(float64(n)) }

// WatchDB adds the statistics of MySQL's connection pool (database/sql's
// DBStats, through client_golang's own collector: go_sql_*, labelled
// db_name="mysql"), read when scraped. Connections in use near the maximum,
// and a wait count that climbs, mean requests queue for a connection.
func (m *Metrics) WatchDB(db *sql.DB) {
	m.reg.MustRegister(collectors.NewDBStatsCollector(db, "mysql"))
}

// WatchRedis adds the statistics of the Redis client's connection pool,
// read when scraped (seckill_redis_pool_*).
func (m *Metrics) WatchRedis(rdb redis.UniversalClient) {
	m.reg.MustRegister(redisPool{rdb})
}

// WatchQueue adds the state of async mode's orders stream, read when
// scraped by stats (queue.Queue.Stats, the figures of GET /admin/queue).
func (m *Metrics) WatchQueue(stats func(context.Context) (queue.Stats, error)) {
	m.reg.MustRegister(queueCollector{stats})
}

// WatchInstances adds the instances of the server alive, by version and
// level (seckill_instances), read when scraped from known
// (fleet.Fleet.Known, which asks Redis nothing).
func (m *Metrics) WatchInstances(known func() []fleet.Instance) {
	m.reg.MustRegister(instancesCollector{known})
}
