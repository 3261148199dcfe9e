package metrics

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"seckill/internal/fleet"
	"seckill/internal/order/queue"
)

// The collectors below read their figures when Prometheus scrapes, instead
// of being updated as things happen: the figures already exist elsewhere
// (go-redis counts its pool, Redis knows the stream's backlog), so copying
// them on every change would only cost the request path.

// redisPool reports go-redis' pool statistics (redis.PoolStats).
type redisPool struct{ rdb redis.UniversalClient }

var (
	redisHits = prometheus.NewDesc("seckill_redis_pool_hits_total",
		"Times a Redis command found an idle connection in the pool.", nil, nil)
	redisMisses = prometheus.NewDesc("seckill_redis_pool_misses_total",
		"Times a Redis command found no idle connection in the pool and opened one (or waited for one).", nil, nil)
	redisTimeouts = prometheus.NewDesc("seckill_redis_pool_timeouts_total",
		"Times a Redis command gave up waiting for a connection: the pool (REDIS_POOL_SIZE) is too small for the load.", nil, nil)
	redisWaits = prometheus.NewDesc("seckill_redis_pool_waits_total",
		"Times a Redis command waited for a connection because all were in use.", nil, nil)
	redisWaitSeconds = prometheus.NewDesc("seckill_redis_pool_wait_seconds_total",
		"Time Redis commands spent waiting for a connection, in all.", nil, nil)
	redisConns = prometheus.NewDesc("seckill_redis_pool_connections",
		"Connections in the Redis pool, by state: idle or in_use.", []string{"state"}, nil)
	redisStale = prometheus.NewDesc("seckill_redis_pool_stale_connections_total",
		"Connections the pool closed because they were idle too long or broken.", nil, nil)
)

func (redisPool) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{redisHits, redisMisses, redisTimeouts, redisWaits, redisWaitSeconds, redisConns, redisStale} {
		ch <- d
	}
}

func (p redisPool) Collect(ch chan<- prometheus.Metric) {
	s := p.rdb.PoolStats()
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	counter(redisHits, float64(s.Hits))
	counter(redisMisses, float64(s.Misses))
	counter(redisTimeouts, float64(s.Timeouts))
	counter(redisWaits, float64(s.WaitCount))
	counter(redisWaitSeconds, time.Duration(s.WaitDurationNs).Seconds())
	counter(redisStale, float64(s.StaleConns))
	idle := float64(s.IdleConns)
	ch <- prometheus.MustNewConstMetric(redisConns, prometheus.GaugeValue, idle, "idle")
	ch <- prometheus.MustNewConstMetric(redisConns, prometheus.GaugeValue, max(float64(s.TotalConns)-idle, 0), "in_use")
}

// queueCollector reports async mode's orders stream, as GET /admin/queue
// shows it.
type queueCollector struct {
	stats func(context.Context) (queue.Stats, error)
}

var (
	queueLength = prometheus.NewDesc("seckill_queue_length",
		"Entries in the orders stream, written ones included until they are trimmed.", nil, nil)
	queueLag = prometheus.NewDesc("seckill_queue_lag",
		"Accepted orders not yet delivered to any consumer: how far MySQL is behind Redis. It should fall back to 0 within moments.", nil, nil)
	queuePending = prometheus.NewDesc("seckill_queue_pending",
		"Orders delivered to a consumer and not yet acknowledged: being written, or stuck with a consumer that cannot write.", nil, nil)
	queueDead = prometheus.NewDesc("seckill_queue_dead_letters",
		"Accepted orders MySQL refused for good, waiting for an admin (GET /admin/dead-letters). Any at all deserves a look.", nil, nil)
)

// queueTimeout bounds the reads of one scrape: Prometheus' own default
// scrape timeout is 10s, and a Redis that does not answer in 2s is down.
const queueTimeout = 2 * time.Second

func (queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueLength
	ch <- queueLag
	ch <- queuePending
	ch <- queueDead
}

func (q queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), queueTimeout)
	defer cancel()
	st, err := q.stats(ctx)
	if err != nil {
		// The rest of the scrape is still served (ContinueOnError), and
		// the failure is logged.
		ch <- prometheus.NewInvalidMetric(queueLag, fmt.Errorf("read the orders stream: %w", err))
		return
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	gauge(queueLength, st.Length)
	gauge(queueLag, st.Lag)
	gauge(queuePending, st.Pending)
	gauge(queueDead, st.DeadLetters)
}

// instancesCollector reports the instances of the server alive, by
// version and feature level, as the last announcement of this one found
// them (package fleet).
type instancesCollector struct {
	known func() []fleet.Instance
}

var instancesDesc = prometheus.NewDesc("seckill_instances",
	"Instances of the server alive (announcing in Redis), by build revision (version) and feature level, as this instance last saw them (every 5s). "+
		"More than one series during a rolling upgrade; an instance of a version before announcing is not counted.",
	[]string{"version", "level"}, nil)

func (instancesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- instancesDesc }

func (c instancesCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct {
		version string
		level   fleet.Level
	}
	counts := map[key]int{}
	for _, in := range c.known() {
		counts[key{in.Revision, in.Level}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(instancesDesc, prometheus.GaugeValue, float64(n), k.version, strconv.Itoa(int(k.level)))
	}
}
